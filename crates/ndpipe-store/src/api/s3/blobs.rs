//! Plain objects (sidecars, anything that is not a photo): one durable file each under
//! `DATA/objects`, named by the catalog row that owns it.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

/// The folder of plain-object files.
pub(crate) struct Blobs {
    dir: PathBuf,
    next: AtomicU64,
}

impl Blobs {
    /// The blob folder `dir`, created when missing.
    pub(crate) fn open(dir: PathBuf) -> io::Result<Blobs> {
        std::fs::create_dir_all(&dir)?;
        Ok(Blobs {
            dir,
            next: AtomicU64::new(0),
        })
    }

    /// A name no other blob has: the content's sha256, the time and a counter.
    pub(crate) fn new_name(&self, sha256: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let now = ndpipe_util::time::now_ms();
        format!("{}-{now}-{n}", &sha256[..sha256.len().min(16)])
    }

    /// Writes `bytes` as blob `name`, durably (synced, renamed, directory synced).
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        ndpipe_util::fs::write_durably(&self.path(name), bytes)
    }

    /// The bytes of blob `name`; `None` when it is gone.
    pub(crate) fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes blob `name`; a failure is logged (the file is then only wasted space).
    pub(crate) fn remove(&self, name: &str) {
        match std::fs::remove_file(self.path(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(blob = name, error = %e, "cannot remove a plain object's file"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir
            .join(format!("{}.blob", ndpipe_util::fs::file_stem(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_written_read_back_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(dir.path().join("objects")).unwrap();
        let (a, b) = (
            blobs.new_name(&"ab".repeat(32)),
            blobs.new_name(&"ab".repeat(32)),
        );
        assert_ne!(a, b, "two blobs of the same bytes get two names");
        blobs.write(&a, b"{\"x\": 1}").unwrap();
        assert_eq!(blobs.read(&a).unwrap().unwrap(), b"{\"x\": 1}");
        blobs.remove(&a);
        assert_eq!(blobs.read(&a).unwrap(), None);
        blobs.remove(&a);
    }
}
