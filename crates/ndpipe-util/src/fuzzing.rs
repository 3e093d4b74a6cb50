//! Support for the fuzz targets of `fuzz/` (feature `fuzzing`, and every test build): the IDX
//! harness, and [`replay`], which runs a target's committed seeds and kept crashes through the
//! same harness as an ordinary test, so that a regression fails `cargo test` without a fuzzer.
//! Not part of the product API.

use std::path::{Path, PathBuf};

/// The `idx` target: any bytes through [`crate::idx::parse`] with 1 to 4 dimensions (the first
/// byte picks them); a parse that succeeds must describe exactly the bytes it was given.
pub fn idx(data: &[u8]) {
    let Some((&pick, raw)) = data.split_first() else {
        return;
    };
    let dims = usize::from(pick % 4) + 1;
    if let Ok(parsed) = crate::idx::parse(raw, dims) {
        assert_eq!(parsed.shape.len(), dims);
        assert_eq!(parsed.data.len(), parsed.shape.iter().product::<usize>());
        assert_eq!(4 + 4 * dims + parsed.data.len(), raw.len());
    }
}

/// The repository's `fuzz/` folder, from a crate's `CARGO_MANIFEST_DIR` (`crates/<name>`).
pub fn fuzz_dir(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("../../fuzz")
}

/// Runs every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` through
/// `harness`, naming the file when one panics; returns how many ran. Panics when there is none,
/// so that a moved corpus cannot pass silently.
pub fn replay(manifest_dir: &str, target: &str, harness: impl Fn(&[u8])) -> usize {
    let root = fuzz_dir(manifest_dir);
    let mut files = Vec::new();
    for sub in ["corpus", "regressions"] {
        let dir = root.join(sub).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    assert!(
        !files.is_empty(),
        "no seed for fuzz target {target} under {}",
        root.display()
    );
    for path in &files {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| harness(&bytes)));
        assert!(outcome.is_ok(), "fuzz input {} panics", path.display());
    }
    files.len()
}

/// Writes `bytes` as seed `name` of `target` under `fuzz/corpus/` (the seed writers' helper).
pub fn write_seed(manifest_dir: &str, target: &str, name: &str, bytes: &[u8]) {
    let dir = fuzz_dir(manifest_dir).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus folder");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}

#[cfg(test)]
mod tests {
    #[test]
    fn idx_corpus_replays() {
        super::replay(env!("CARGO_MANIFEST_DIR"), "idx", super::idx);
    }

    /// Writes the `idx` seeds: `cargo test -p ndpipe-util -- --ignored write_seeds`.
    #[test]
    #[ignore = "writes the committed seed corpus"]
    fn write_seeds() {
        let m = env!("CARGO_MANIFEST_DIR");
        let labels = crate::idx::encode(&[4], &[0, 9, 3, 7]);
        let images = crate::idx::encode(
            &[2, 3, 3],
            &[
                0, 64, 128, 255, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
            ],
        );
        super::write_seed(m, "idx", "labels-1d", &[[0u8].as_slice(), &labels].concat());
        super::write_seed(m, "idx", "images-3d", &[[2u8].as_slice(), &images].concat());
    }
}
