//! Durable file writes.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves either the old file or the new one: the
/// bytes go to `<path>.tmp`, are synced, renamed over `path`, and the directory is synced so the
/// rename itself survives a power loss.
pub fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

/// Syncs a directory, so that entries created or renamed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A file-name stem for an id such as a model version: ASCII letters, digits, `-`, `_` and `.`
/// are kept, anything else becomes `_`, and a leading `.` is replaced so that no id names a
/// hidden file or walks out of its directory.
pub fn file_stem(id: &str) -> String {
    let mut out: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with('.') {
        out.insert(0, '_');
    }
    out
}

/// Reads a secret (a token) from the first line of `path`, trimmed; an empty secret is an error.
pub fn read_secret(path: &Path) -> io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} holds no secret on its first line", path.display()),
        ));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.bin");
        write_durably(&path, b"one").unwrap();
        write_durably(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn secrets_are_the_trimmed_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  s3cret \nignored\n").unwrap();
        assert_eq!(read_secret(&path).unwrap(), "s3cret");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_secret(&path).is_err());
    }

    #[test]
    fn stems_cannot_escape_or_hide() {
        assert_eq!(file_stem("ft-1-abcd"), "ft-1-abcd");
        assert_eq!(file_stem("../etc/passwd"), "_.._etc_passwd");
        assert_eq!(file_stem(".hidden"), "_.hidden");
        assert_eq!(file_stem(""), "_");
        assert_eq!(file_stem("a b/c"), "a_b_c");
    }
}
