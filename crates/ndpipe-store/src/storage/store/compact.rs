//! Compaction: every volume set is rewritten with only its live records, the index is pointed at
//! the copies in one commit per set, and the old volumes are removed.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;
use tracing::{info, warn};

use super::PHOTO_SET;
use super::writer::{SetMark, Writer};
use crate::storage::StoreError;
use crate::storage::index::{Change, PhotoEntry, watermark_key};
use crate::storage::volume::format::{FILE_HEADER_LEN, RecordKind};
use crate::storage::volume::{Location, VolumeSet};

/// What a compaction did.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionReport {
    /// Disk bytes of all volumes before.
    pub bytes_before: u64,
    /// Disk bytes of all volumes after.
    pub bytes_after: u64,
    /// Live records copied.
    pub records_moved: u64,
    /// Volumes removed.
    pub volumes_removed: u64,
    /// Seconds taken.
    pub seconds: f64,
}

impl Writer {
    /// Compacts both volume sets; runs on the writer thread, so writes wait while reads go on.
    /// A set is compacted only if the disk has room for its live records (compaction may use
    /// the free-space reserve, since it frees space); a set whose copy fails is rolled back to
    /// its old volumes.
    pub(super) fn compact(&mut self) -> Result<CompactionReport, StoreError> {
        let started = Instant::now();
        let bytes_before = self.shared.disk_bytes()?;
        let entries: HashMap<u64, PhotoEntry> = self.shared.index.entries()?.into_iter().collect();
        let mut records_moved = 0;
        let mut volumes_removed = 0;
        for (name, set) in self.shared.sets() {
            let is_photos = set.set_id() == PHOTO_SET;
            set.seal()?;
            let mark = SetMark::of(set)?;
            let old = set.volumes()?;
            let mut live: Vec<(u64, Location)> = entries
                .iter()
                .filter_map(|(id, e)| {
                    let loc = if is_photos { Some(e.photo) } else { e.tensor };
                    loc.map(|l| (*id, l))
                })
                .collect();
            live.sort_by_key(|(_, l)| (l.volume, l.offset));
            let bytes: u64 = live.iter().map(|(_, l)| l.len).sum();
            self.shared
                .space
                .check_scratch(bytes + FILE_HEADER_LEN * (old.len() as u64 + 1))?;
            let moved = live.len() as u64;
            if let Err(e) = self.copy_set(name, set, &entries, live, &old) {
                if e.is_no_space() {
                    self.shared.space.forget();
                }
                match self.copy_committed(name, set, &old) {
                    Some(true) => {
                        warn!(error = %e, "compaction's index commit reported a failure but landed");
                    }
                    Some(false) => {
                        warn!(error = %e, set = name, "compaction failed; removing its copies");
                        mark.roll_back(set);
                        return Err(e);
                    }
                    None => {
                        warn!(error = %e, set = name, "compaction failed and the index cannot tell whether it committed; keeping old volumes and copies");
                        return Err(e);
                    }
                }
            }
            records_moved += moved;
            for n in old {
                set.remove(n)?;
                volumes_removed += 1;
            }
        }
        let report = CompactionReport {
            bytes_before,
            bytes_after: self.shared.disk_bytes()?,
            records_moved,
            volumes_removed,
            seconds: started.elapsed().as_secs_f64(),
        };
        info!(?report, "compaction finished");
        Ok(report)
    }

    /// Copies the `live` records of `set` into new volumes, syncs them and points the index at
    /// them in one commit that also drops the watermarks of the `old` volumes.
    fn copy_set(
        &self,
        name: &str,
        set: &VolumeSet,
        entries: &HashMap<u64, PhotoEntry>,
        live: Vec<(u64, Location)>,
        old: &[u32],
    ) -> Result<(), StoreError> {
        let is_photos = set.set_id() == PHOTO_SET;
        let mut changes = Vec::with_capacity(live.len());
        for (id, loc) in live {
            let record = set.read(loc, id)?;
            let new = set.append(
                RecordKind::Put,
                id,
                &record.meta,
                &record.data,
                self.ids.peek(),
            )?;
            changes.push(match entries.get(&id) {
                Some(entry) if is_photos => {
                    let mut entry = entry.clone();
                    entry.photo = new;
                    Change::Put(id, entry)
                }
                _ => Change::Tensor(id, new),
            });
        }
        set.sync()?;
        let dropped: Vec<String> = old.iter().map(|n| watermark_key(name, *n)).collect();
        let mut watermarks = Vec::new();
        for n in set.volumes()?.into_iter().filter(|n| !old.contains(n)) {
            watermarks.push((watermark_key(name, n), set.file_len(n)?));
        }
        self.shared
            .index
            .commit(&changes, &watermarks, &dropped, self.ids.peek())
    }

    /// Whether the index (opened again after a failure) has the copies of `set`: a new volume
    /// has its watermark. `None` when the index cannot tell.
    fn copy_committed(&self, name: &str, set: &VolumeSet, old: &[u32]) -> Option<bool> {
        let newest = set
            .volumes()
            .ok()?
            .into_iter()
            .filter(|n| !old.contains(n))
            .max();
        let Some(newest) = newest else {
            return Some(false);
        };
        let watermark = self.shared.index.meta(&watermark_key(name, newest)).ok()?;
        Some(watermark.is_some())
    }
}
