//! Compaction: every volume set is rewritten with only its live records, the index is pointed at
//! the copies in one commit per set, and the old volumes are removed.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;
use tracing::info;

use super::PHOTO_SET;
use super::writer::Writer;
use crate::storage::StoreError;
use crate::storage::index::{Change, PhotoEntry, watermark_key};
use crate::storage::volume::Location;
use crate::storage::volume::format::RecordKind;

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
    pub(super) fn compact(&mut self) -> Result<CompactionReport, StoreError> {
        let started = Instant::now();
        let bytes_before = self.shared.disk_bytes()?;
        let entries: HashMap<u64, PhotoEntry> = self.shared.index.entries()?.into_iter().collect();
        let mut records_moved = 0;
        let mut volumes_removed = 0;
        for (name, set) in self.shared.sets() {
            let is_photos = set.set_id() == PHOTO_SET;
            set.seal()?;
            let old = set.volumes()?;
            let mut live: Vec<(u64, Location)> = entries
                .iter()
                .filter_map(|(id, e)| {
                    let loc = if is_photos { Some(e.photo) } else { e.tensor };
                    loc.map(|l| (*id, l))
                })
                .collect();
            live.sort_by_key(|(_, l)| (l.volume, l.offset));
            let mut changes = Vec::with_capacity(live.len());
            for (id, loc) in live {
                let record = set.read(loc, id)?;
                let new = set.append(
                    RecordKind::Put,
                    id,
                    &record.meta,
                    &record.data,
                    self.next_id,
                )?;
                changes.push(if is_photos {
                    let mut entry = entries[&id].clone();
                    entry.photo = new;
                    Change::Put(id, entry)
                } else {
                    Change::Tensor(id, new)
                });
                records_moved += 1;
            }
            set.sync()?;
            let dropped: Vec<String> = old.iter().map(|n| watermark_key(name, *n)).collect();
            let mut watermarks = Vec::new();
            for n in set.volumes()?.into_iter().filter(|n| !old.contains(n)) {
                let len = std::fs::metadata(set.path(n))
                    .map_err(StoreError::io("stat volume", &set.path(n)))?
                    .len();
                watermarks.push((watermark_key(name, n), len));
            }
            self.shared
                .index
                .commit(&changes, &watermarks, &dropped, self.next_id)?;
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
}
