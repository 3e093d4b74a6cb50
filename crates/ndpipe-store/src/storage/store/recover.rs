//! Crash recovery at open: the index is opened (or rebuilt when unreadable), volumes whose
//! header was never completely written are removed, every volume record past the index's
//! watermarks is replayed into it, and a torn tail of a newest volume is cut. Nothing is written
//! when there is nothing to repair, so a store opens on a full disk.

use std::path::Path;

use ndpipe_catalog::PhotoMeta;
use serde::Serialize;
use tracing::warn;

use super::{PHOTO_SET, Shared};
use crate::storage::StoreError;
use crate::storage::index::{Change, Index, watermark_key};
use crate::storage::volume::format::{FILE_HEADER_LEN, RecordKind};
use crate::storage::volume::{ScannedRecord, VolumeSet};

/// What opening the store found and repaired.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RecoveryReport {
    /// Whether the index was missing or unreadable and was rebuilt from the volumes.
    pub index_rebuilt: bool,
    /// Records replayed from the volumes into the index.
    pub replayed_records: u64,
    /// Torn tails cut: (volume path, offset cut at, reason).
    pub truncated: Vec<(String, u64, String)>,
    /// Volumes removed because their creation was cut short (no complete header, no record).
    pub removed_volumes: Vec<String>,
    /// Records past the index that could not be indexed for lack of disk space. They were never
    /// acknowledged (an answer waits for the index commit); a restart with free space replays
    /// those of sealed volumes.
    pub unindexed_records: u64,
    /// Sealed volumes with unreadable records: (volume path, offset, reason). Records after the
    /// offset are unreachable until repaired.
    pub damaged: Vec<(String, u64, String)>,
    /// Photos in the index, after recovery.
    pub photos: u64,
}

/// Opens `root/index.redb`; an unreadable one is moved aside and rebuilt from the volumes (but
/// not for lack of space: a rebuild needs more). A new or never committed index counts as
/// rebuilt.
pub(super) fn open_index(
    root: &Path,
    cache_bytes: usize,
    report: &mut RecoveryReport,
) -> Result<Index, StoreError> {
    let index_path = root.join("index.redb");
    let index = match Index::open(&index_path, cache_bytes) {
        Ok(index) => index,
        Err(e) if e.is_no_space() => return Err(e),
        Err(e) => {
            let aside = root.join(format!("index.redb.broken-{}", ndpipe_util::time::now_ms()));
            warn!(error = %e, moved_to = %aside.display(), "index unreadable; rebuilding from volumes");
            std::fs::rename(&index_path, &aside)
                .map_err(StoreError::io("move broken index", &index_path))?;
            report.index_rebuilt = true;
            Index::open(&index_path, cache_bytes)?
        }
    };
    if index.next_id()?.is_none() {
        report.index_rebuilt = true;
    }
    Ok(index)
}

/// Replays volume records past the index's watermarks; returns the next photo id.
pub(super) fn recover(shared: &Shared, report: &mut RecoveryReport) -> Result<u64, StoreError> {
    let mut changes = Vec::new();
    let mut watermarks = Vec::new();
    let stored_next_id = shared.index.next_id()?;
    let mut next_id = stored_next_id.unwrap_or(1);
    let mut dirty = stored_next_id.is_none();
    let mut resume = Vec::new();
    for (name, set) in shared.sets() {
        let volumes = headed_volumes(set, report)?;
        for (i, &(number, id_floor)) in volumes.iter().enumerate() {
            let is_last = i + 1 == volumes.len();
            next_id = next_id.max(id_floor);
            let key = watermark_key(name, number);
            let indexed = shared.index.meta(&key)?;
            let scan = set.scan(number, indexed.unwrap_or(0))?;
            if let Some(reason) = scan.invalid_tail {
                let path = set.path(number).display().to_string();
                if is_last {
                    warn!(volume = %path, offset = scan.end, reason, "cutting a torn tail");
                    set.truncate(number, scan.end)?;
                    report.truncated.push((path, scan.end, reason.into()));
                } else {
                    warn!(volume = %path, offset = scan.end, reason, "sealed volume is damaged");
                    report.damaged.push((path, scan.end, reason.into()));
                }
            }
            report.replayed_records += scan.records.len() as u64;
            replay_all(set.set_id(), scan.records, &mut next_id, &mut changes)?;
            dirty |= indexed != Some(scan.end);
            watermarks.push((key, scan.end));
            if is_last {
                resume.push((set, number, scan.end));
            }
        }
    }
    dirty |= stored_next_id != Some(next_id) || !changes.is_empty();
    if dirty {
        match shared.index.commit(&changes, &watermarks, &[], next_id) {
            Ok(()) => {}
            Err(e) if e.is_no_space() && !report.index_rebuilt => {
                warn!(error = %e, records = changes.len(),
                    "no space to index the records written after the last commit (never acknowledged); starting without them");
                report.unindexed_records = changes.len() as u64;
                report.replayed_records = 0;
            }
            Err(e) => return Err(e),
        }
    }
    for (set, number, end) in resume {
        set.resume(number, end)?;
    }
    Ok(next_id)
}

/// The volumes of `set` with their id floors, in order. A volume whose header is incomplete
/// holds no record (records are appended only after the header is synced): its creation was cut
/// short by a crash or a full disk, and it is removed wherever it is in the set.
fn headed_volumes(
    set: &VolumeSet,
    report: &mut RecoveryReport,
) -> Result<Vec<(u32, u64)>, StoreError> {
    let mut out = Vec::new();
    for number in set.volumes()? {
        match set.header(number) {
            Ok(header) => out.push((number, header.id_floor)),
            Err(e) if set.file_len(number)? <= FILE_HEADER_LEN => {
                let path = set.path(number).display().to_string();
                warn!(error = %e, volume = %path, "removing a volume whose creation was cut short");
                set.remove(number)?;
                report.removed_volumes.push(path);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Appends the index changes of `records` (scanned from volume set `set`) to `changes`, and
/// raises `next_id` past each record's id. The `volume` fuzz target runs this over the records
/// of arbitrary bytes.
pub(crate) fn replay_all(
    set: u8,
    records: Vec<ScannedRecord>,
    next_id: &mut u64,
    changes: &mut Vec<Change>,
) -> Result<(), StoreError> {
    for record in records {
        // Ids come from a counter that never reaches u64::MAX; a record that claims it is
        // damaged past its checksums (fuzz regression `record-id-u64-max-overflows-next-id`).
        let after = record
            .id
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt {
                what: format!(
                    "record at offset {} of volume {}",
                    record.location.offset, record.location.volume
                ),
                reason: format!("photo id {} is past the largest id", record.id),
            })?;
        *next_id = (*next_id).max(after);
        changes.push(replay(set, record)?);
    }
    Ok(())
}

/// The index change a scanned record of volume set `set` stands for.
fn replay(set: u8, record: ScannedRecord) -> Result<Change, StoreError> {
    Ok(match (set, record.kind) {
        (_, RecordKind::Tombstone) => Change::Remove(record.id),
        (PHOTO_SET, RecordKind::Put) => {
            let meta: PhotoMeta =
                serde_json::from_slice(&record.meta).map_err(|e| StoreError::Corrupt {
                    what: format!("metadata of photo {}", record.id),
                    reason: e.to_string(),
                })?;
            Change::Photo(record.id, record.location, meta)
        }
        (_, RecordKind::Put) => Change::Tensor(record.id, record.location),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::photo;
    use super::super::{PHOTOS_DIR, PhotoStore, StoreConfig, TENSORS_DIR};
    use super::*;

    fn config() -> StoreConfig {
        StoreConfig {
            min_free_bytes: 0,
            ..StoreConfig::default()
        }
    }

    #[tokio::test]
    async fn volumes_whose_header_was_torn_are_removed_wherever_they_are() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = PhotoStore::open(dir.path(), &config()).unwrap();
            assert_eq!(store.put(photo(1)).await.unwrap(), 1);
        }
        let photos = dir.path().join(PHOTOS_DIR);
        std::fs::write(photos.join("00000002.vol"), b"").unwrap();
        std::fs::write(photos.join("00000003.vol"), b"NDPVOL\x01").unwrap();
        std::fs::write(dir.path().join(TENSORS_DIR).join("00000002.vol"), [0u8; 32]).unwrap();
        let (store, report) = PhotoStore::open(dir.path(), &config()).unwrap();
        assert_eq!(report.removed_volumes.len(), 3, "{report:?}");
        assert_eq!(store.original(1).unwrap().unwrap().1, vec![1; 3]);
        assert_eq!(store.put(photo(2)).await.unwrap(), 2);
        assert_eq!(store.tensor(2).unwrap().unwrap().1, vec![2; 5]);
        drop(store);
        let (_, report) = PhotoStore::open(dir.path(), &config()).unwrap();
        assert!(report.removed_volumes.is_empty());
        assert_eq!(report.photos, 2);
    }

    #[tokio::test]
    async fn a_header_that_is_damaged_past_its_length_still_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        drop(PhotoStore::open(dir.path(), &config()).unwrap());
        let garbage = [7u8; 64];
        std::fs::write(dir.path().join(PHOTOS_DIR).join("00000001.vol"), garbage).unwrap();
        assert!(matches!(
            PhotoStore::open(dir.path(), &config()),
            Err(StoreError::Corrupt { .. })
        ));
    }

    /// A kill during compaction's photo copy: the copies are in a new volume the index does not
    /// know yet. Replaying them must keep each photo's tensor location, so nothing is rebuilt.
    #[tokio::test]
    async fn a_crash_mid_compaction_keeps_every_tensor() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = PhotoStore::open(dir.path(), &config()).unwrap();
            for n in 1..=3 {
                store.put(photo(n)).await.unwrap();
            }
        }
        let photos = VolumeSet::open(&dir.path().join(PHOTOS_DIR), PHOTO_SET, 1 << 20).unwrap();
        for record in photos.scan(1, 0).unwrap().records {
            let copy = photos.read(record.location, record.id).unwrap();
            photos
                .append(RecordKind::Put, record.id, &copy.meta, &copy.data, 4)
                .unwrap();
        }
        photos.sync().unwrap();
        drop(photos);
        let (store, report) = PhotoStore::open(dir.path(), &config()).unwrap();
        assert_eq!(report.replayed_records, 3, "{report:?}");
        assert!(
            store.missing_tensors().unwrap().is_empty(),
            "the replay dropped tensor locations: a restart would rebuild them"
        );
        for n in 1..=3u8 {
            let (entry, bytes) = store.original(u64::from(n)).unwrap().unwrap();
            assert_eq!((entry.photo.volume, bytes), (2, vec![n; 3]));
            assert_eq!(store.tensor(u64::from(n)).unwrap().unwrap().1, vec![n; 5]);
        }
    }
}
