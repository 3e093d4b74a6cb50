//! The free-space reserve: writes that add data are refused while the file system holding the
//! store has less than the reserve free, so a full disk never stops reads, deletes or the index.
//!
//! Free space is read with `statvfs` (space available to unprivileged users) at most every
//! [`READING_TTL`]; in between, the bytes written are subtracted from the last reading. The
//! guard logs when the store enters and leaves this read-only state.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ndpipe_util::sync::lock;
use tracing::{info, warn};

use crate::storage::StoreError;

/// How long a free-space reading is trusted.
const READING_TTL: Duration = Duration::from_millis(500);

/// The last reading and the state it put the store in.
#[derive(Debug, Default)]
struct State {
    /// When it was taken and the bytes available then, less what was written since.
    reading: Option<(Instant, u64)>,
    /// Whether the last reading was below the reserve.
    low: bool,
}

/// The free-space reserve of one store directory.
#[derive(Debug)]
pub(crate) struct DiskSpace {
    dir: PathBuf,
    reserve: u64,
    state: Mutex<State>,
}

impl DiskSpace {
    /// The guard of the file system holding `dir`, keeping `reserve` bytes free.
    pub(crate) fn new(dir: &Path, reserve: u64) -> Self {
        DiskSpace {
            dir: dir.to_path_buf(),
            reserve,
            state: Mutex::new(State::default()),
        }
    }

    /// The reserve, in bytes.
    pub(crate) fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Says at start, as a warning, when the store begins below its reserve: uploads are then
    /// refused (507) from the first one, which on a disk smaller than the reserve is forever.
    pub(crate) fn warn_if_low_at_start(&self) {
        let Ok(available) = self.available() else {
            return;
        };
        if available >= self.reserve {
            return;
        }
        let size = rustix::fs::statvfs(&self.dir)
            .map(|s| s.f_blocks.saturating_mul(s.f_frsize))
            .unwrap_or(0);
        warn!(
            dir = %self.dir.display(),
            free_bytes = available,
            disk_bytes = size,
            min_free_bytes = self.reserve,
            "the store starts read-only: its file system has less free space than the reserve \
             (min_free_bytes), so every upload answers 507 until space is freed or \
             --min-free-bytes is lowered"
        );
    }

    /// Bytes available to the store now (a reading at most [`READING_TTL`] old).
    pub(crate) fn available(&self) -> Result<u64, StoreError> {
        let mut state = lock(&self.state);
        if let Some((at, bytes)) = state.reading
            && at.elapsed() < READING_TTL
        {
            return Ok(bytes);
        }
        let stat = rustix::fs::statvfs(&self.dir).map_err(|e| StoreError::Io {
            op: "read free space",
            path: self.dir.clone(),
            source: e.into(),
        })?;
        let bytes = stat.f_bavail.saturating_mul(stat.f_frsize);
        state.reading = Some((Instant::now(), bytes));
        Ok(bytes)
    }

    /// Refuses a write of `bytes` that would leave less than the reserve free.
    pub(crate) fn check(&self, bytes: u64) -> Result<(), StoreError> {
        let available = self.available()?;
        self.note(available);
        if available < self.reserve.saturating_add(bytes) {
            return Err(StoreError::InsufficientStorage {
                reason: format!(
                    "{available} bytes free, a write of {bytes} bytes must leave the reserve of {} \
                     (min_free_bytes) free",
                    self.reserve
                ),
            });
        }
        Ok(())
    }

    /// Refuses work that needs `bytes` of scratch space, reserve or not (compaction frees space,
    /// so it may use the reserve).
    pub(crate) fn check_scratch(&self, bytes: u64) -> Result<(), StoreError> {
        let available = self.available()?;
        if available < bytes {
            return Err(StoreError::InsufficientStorage {
                reason: format!("{available} bytes free, {bytes} needed"),
            });
        }
        Ok(())
    }

    /// Whether free space is below the reserve (uploads are refused); a failed reading counts
    /// as low.
    pub(crate) fn is_low(&self) -> bool {
        match self.available() {
            Ok(available) => self.note(available),
            Err(_) => true,
        }
    }

    /// Counts `bytes` just written against the last reading.
    pub(crate) fn used(&self, bytes: u64) {
        if let Some((_, available)) = &mut lock(&self.state).reading {
            *available = available.saturating_sub(bytes);
        }
    }

    /// Drops the last reading (after a write failed for lack of space, or space was freed), so
    /// the next check reads the file system again.
    pub(crate) fn forget(&self) {
        lock(&self.state).reading = None;
    }

    /// Records whether `available` is below the reserve, logging a change; returns it.
    fn note(&self, available: u64) -> bool {
        let low = available < self.reserve;
        let mut state = lock(&self.state);
        if low != state.low {
            state.low = low;
            if low {
                warn!(available, reserve = self.reserve, dir = %self.dir.display(),
                    "free disk space is below the reserve: uploads are refused (507) until space is freed");
            } else {
                info!(
                    available,
                    reserve = self.reserve,
                    "free disk space is above the reserve again: uploads are accepted"
                );
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_refuses_writes_that_would_dip_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let open = DiskSpace::new(dir.path(), 0);
        let free = open.available().unwrap();
        assert!(free > 0);
        open.check(1).unwrap();
        assert!(!open.is_low());
        let reserved = DiskSpace::new(dir.path(), u64::MAX);
        assert!(matches!(
            reserved.check(1),
            Err(StoreError::InsufficientStorage { .. })
        ));
        assert!(reserved.is_low());
        open.used(free);
        assert!(
            open.check(1).is_err(),
            "writes are counted against the reading"
        );
        open.forget();
        open.check(1).unwrap();
    }
}
