//! Crash recovery at open: the index is opened (or rebuilt when unreadable), then every volume
//! record past the index's watermarks is replayed into it, and a torn tail of a newest volume is
//! cut.

use std::path::Path;

use ndpipe_catalog::PhotoMeta;
use serde::Serialize;
use tracing::warn;

use super::{PHOTO_SET, Shared};
use crate::storage::StoreError;
use crate::storage::index::{Change, Index, PhotoEntry, watermark_key};
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
    /// Sealed volumes with unreadable records: (volume path, offset, reason). Records after the
    /// offset are unreachable until repaired.
    pub damaged: Vec<(String, u64, String)>,
    /// Photos in the index, after recovery.
    pub photos: u64,
}

/// Opens `root/index.redb`; an unreadable one is moved aside and rebuilt from the volumes. A new
/// or never committed index counts as rebuilt.
pub(super) fn open_index(root: &Path, report: &mut RecoveryReport) -> Result<Index, StoreError> {
    let index_path = root.join("index.redb");
    let index = match Index::open(&index_path) {
        Ok(index) => index,
        Err(e) => {
            let aside = root.join(format!("index.redb.broken-{}", ndpipe_util::time::now_ms()));
            warn!(error = %e, moved_to = %aside.display(), "index unreadable; rebuilding from volumes");
            std::fs::rename(&index_path, &aside)
                .map_err(StoreError::io("move broken index", &index_path))?;
            report.index_rebuilt = true;
            Index::open(&index_path)?
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
    let mut next_id = shared.index.next_id()?.unwrap_or(1);
    for (name, set) in shared.sets() {
        let volumes = set.volumes()?;
        for (i, &number) in volumes.iter().enumerate() {
            let is_last = i + 1 == volumes.len();
            let header = match set.header(number) {
                Ok(h) => h,
                Err(e) if is_last && header_never_written(set, number) => {
                    warn!(error = %e, "removing a volume whose creation was interrupted");
                    set.remove(number)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            next_id = next_id.max(header.id_floor);
            let key = watermark_key(name, number);
            let from = shared.index.meta(&key)?.unwrap_or(0);
            let scan = set.scan(number, from)?;
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
            for record in scan.records {
                report.replayed_records += 1;
                next_id = next_id.max(record.id + 1);
                changes.push(replay(set.set_id(), record)?);
            }
            watermarks.push((key, scan.end));
            if is_last {
                set.resume(number, scan.end)?;
            }
        }
    }
    shared.index.commit(&changes, &watermarks, &[], next_id)?;
    Ok(next_id)
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
            Change::Put(
                record.id,
                PhotoEntry {
                    photo: record.location,
                    tensor: None,
                    meta,
                },
            )
        }
        (_, RecordKind::Put) => Change::Tensor(record.id, record.location),
    })
}

/// Whether a volume is no longer than its header: its creation was cut short by a crash.
fn header_never_written(set: &VolumeSet, number: u32) -> bool {
    std::fs::metadata(set.path(number))
        .map(|m| m.len() <= FILE_HEADER_LEN)
        .unwrap_or(false)
}
