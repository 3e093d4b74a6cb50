//! Plain objects (sidecars, anything that is not a photo): one durable file each under
//! `DATA/objects`, named by the catalog row that owns it. In a replicated cluster each file has
//! copies on several nodes, under the same name.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use tracing::warn;

/// The file-name suffix of a plain object's file.
const SUFFIX: &str = ".blob";

/// The longest name a file may have.
const MAX_NAME: usize = 80;

/// The folder of plain-object files.
pub(crate) struct Blobs {
    dir: PathBuf,
}

/// A name no other file has, in this process or any other: the content's SHA-256 (hex), the
/// time, a random number drawn once per process and a counter.
pub(crate) fn new_name(sha256: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let process = *PROCESS.get_or_init(|| {
        let mut seed = [0u8; 4];
        // Without randomness the process id still tells processes on one host apart.
        match getrandom::fill(&mut seed) {
            Ok(()) => u32::from_le_bytes(seed),
            Err(_) => std::process::id(),
        }
    });
    let now = ndpipe_util::time::now_ms();
    format!(
        "{}-{now}-{process:08x}-{n}",
        &sha256[..sha256.len().min(16)]
    )
}

/// Whether `name` is one [`new_name`] could have made: lowercase hex, digits and `-`, within
/// [`MAX_NAME`] (what a file received from another node must be called).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

impl Blobs {
    /// The blob folder `dir`, created when missing.
    pub(crate) fn open(dir: PathBuf) -> io::Result<Blobs> {
        std::fs::create_dir_all(&dir)?;
        Ok(Blobs { dir })
    }

    /// Every file here, with its last change in ms since the Unix epoch.
    pub(crate) fn list(&self) -> io::Result<Vec<(String, i64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(SUFFIX)) else {
                continue;
            };
            let modified = entry.metadata()?.modified()?;
            let ms = modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            out.push((name.to_string(), ms));
        }
        out.sort();
        Ok(out)
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

    /// Removes blob `name`; whether it was there. A failure is logged (the file is then only
    /// wasted space).
    pub(crate) fn remove(&self, name: &str) -> bool {
        match std::fs::remove_file(self.path(name)) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => {
                warn!(blob = name, error = %e, "cannot remove a plain object's file");
                false
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir
            .join(format!("{}{SUFFIX}", ndpipe_util::fs::file_stem(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_written_read_back_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(dir.path().join("objects")).unwrap();
        let (a, b) = (new_name(&"ab".repeat(32)), new_name(&"ab".repeat(32)));
        assert_ne!(a, b, "two blobs of the same bytes get two names");
        assert!(valid_name(&a) && valid_name(&b));
        assert!(!valid_name("../x") && !valid_name("") && !valid_name("ABC"));
        blobs.write(&a, b"{\"x\": 1}").unwrap();
        assert_eq!(blobs.read(&a).unwrap().unwrap(), b"{\"x\": 1}");
        let listed: Vec<String> = blobs.list().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, std::slice::from_ref(&a));
        assert!(blobs.remove(&a));
        assert_eq!(blobs.read(&a).unwrap(), None);
        assert!(!blobs.remove(&a));
    }
}
