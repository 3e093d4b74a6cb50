//! The index on disk (`DATA/index` unless configured): per backbone, the usearch graph
//! (`<backbone>.<generation>.usearch`), its keys (`<backbone>.<generation>.keys`, u64 LE,
//! ascending) and a manifest (`<backbone>.json`: format, backbone, dimension, count and the
//! CRC-32C of both files). A save writes a new generation's files and syncs them, then replaces
//! the manifest durably (temporary file, fsync, rename, directory fsync), then removes older
//! generations: a crash at any point leaves the old manifest or the new one, each naming whole
//! files. Nothing read back is trusted: a missing, damaged or foreign index is reported for a
//! rebuild from the feature store.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::SimilarError;
use super::ann::{AnnIndex, AnnOptions};

/// The manifest format this code writes and reads.
const FORMAT: u32 = 1;

/// What a saved index says of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    backbone: String,
    dim: usize,
    scalar: String,
    count: usize,
    index_file: String,
    index_crc32c: u32,
    keys_file: String,
    keys_crc32c: u32,
}

/// The folder of a node's saved indexes.
#[derive(Debug, Clone)]
pub(crate) struct IndexDir {
    dir: PathBuf,
}

impl IndexDir {
    /// The indexes kept in `dir` (created on the first save).
    pub(crate) fn new(dir: PathBuf) -> Self {
        IndexDir { dir }
    }

    /// Where backbone `backbone`'s manifest is.
    pub(crate) fn manifest_path(&self, backbone: &str) -> PathBuf {
        self.dir
            .join(format!("{}.json", ndpipe_util::fs::file_stem(backbone)))
    }

    /// The graph file the manifest of `backbone` names, if it can be read (for tests that
    /// damage it).
    #[cfg(test)]
    pub(crate) fn index_path(&self, backbone: &str) -> Option<PathBuf> {
        let m = read_manifest(&self.manifest_path(backbone)).ok()?;
        Some(self.dir.join(m.index_file))
    }

    /// Saves `ann` as backbone `backbone`'s index; the bytes written.
    pub(crate) fn save(
        &self,
        backbone: &str,
        ann: &AnnIndex,
        options: AnnOptions,
    ) -> Result<u64, SimilarError> {
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| SimilarError::Io { what, path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("create the index folder", &self.dir))?;
        let stem = ndpipe_util::fs::file_stem(backbone);
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let index_file = format!("{stem}.{generation}.usearch");
        let keys_file = format!("{stem}.{generation}.keys");
        let index_path = self.dir.join(&index_file);
        ann.save(&index_path)
            .map_err(|source| SimilarError::Index {
                backbone: backbone.into(),
                source,
            })?;
        File::open(&index_path)
            .and_then(|f| f.sync_all())
            .map_err(io("sync the index file", &index_path))?;
        let index_crc32c = crc_of(&index_path).map_err(io("read the index file", &index_path))?;
        let keys = keys_bytes(ann.keys());
        let keys_path = self.dir.join(&keys_file);
        ndpipe_util::fs::write_durably(&keys_path, &keys)
            .map_err(io("write the index keys", &keys_path))?;
        let manifest = Manifest {
            format: FORMAT,
            backbone: backbone.into(),
            dim: ann.dim(),
            scalar: options.scalar.name().into(),
            count: ann.len(),
            index_file: index_file.clone(),
            index_crc32c,
            keys_file: keys_file.clone(),
            keys_crc32c: crc32c::crc32c(&keys),
        };
        let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
        let manifest_path = self.manifest_path(backbone);
        ndpipe_util::fs::write_durably(&manifest_path, &json)
            .map_err(io("write the index manifest", &manifest_path))?;
        self.remove_other_generations(&stem, &[&index_file, &keys_file]);
        let index_bytes = std::fs::metadata(&index_path).map_or(0, |m| m.len());
        Ok(index_bytes + keys.len() as u64)
    }

    /// Removes the files of older generations of `stem` (left by earlier saves or a crash).
    fn remove_other_generations(&self, stem: &str, keep: &[&str]) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = name.starts_with(&format!("{stem}."))
                && (name.ends_with(".usearch") || name.ends_with(".keys"));
            if ours
                && !keep.contains(&name.as_str())
                && let Err(e) = std::fs::remove_file(entry.path())
            {
                tracing::warn!(file = %name, error = %e, "cannot remove an old index file");
            }
        }
    }

    /// Backbone `backbone`'s saved index of `dim`-d vectors, or why it must be rebuilt.
    pub(crate) fn open(
        &self,
        backbone: &str,
        dim: usize,
        options: AnnOptions,
    ) -> Result<AnnIndex, String> {
        let path = self.manifest_path(backbone);
        let m = match read_manifest(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err("no saved index".into()),
            Err(e) => return Err(format!("the manifest cannot be read: {e}")),
        };
        if m.format != FORMAT {
            return Err(format!("manifest format {} is not {FORMAT}", m.format));
        }
        if m.backbone != backbone {
            return Err(format!("the saved index is of backbone {}", m.backbone));
        }
        if m.dim != dim {
            return Err(format!("the saved index is {}-d, not {dim}-d", m.dim));
        }
        if m.scalar != options.scalar.name() {
            return Err(format!("the saved index keeps {} vectors", m.scalar));
        }
        let index_path = self.dir.join(&m.index_file);
        match crc_of(&index_path) {
            Ok(crc) if crc == m.index_crc32c => {}
            Ok(_) => return Err("the index file's checksum does not match".into()),
            Err(e) => return Err(format!("the index file cannot be read: {e}")),
        }
        let keys = std::fs::read(self.dir.join(&m.keys_file))
            .map_err(|e| format!("the keys file cannot be read: {e}"))?;
        if crc32c::crc32c(&keys) != m.keys_crc32c || keys.len() != m.count * 8 {
            return Err("the keys file's checksum does not match".into());
        }
        let keys: HashSet<u64> = keys
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        AnnIndex::load(&index_path, dim, options, keys)
            .map_err(|e| format!("the index does not load: {e}"))
    }
}

fn read_manifest(path: &Path) -> io::Result<Manifest> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The CRC-32C of a file, read in 1 MiB pieces.
fn crc_of(path: &Path) -> io::Result<u32> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}

/// `keys` ascending, as u64 LE.
fn keys_bytes(keys: &HashSet<u64>) -> Vec<u8> {
    let mut sorted: Vec<u64> = keys.iter().copied().collect();
    sorted.sort_unstable();
    sorted.iter().flat_map(|k| k.to_le_bytes()).collect()
}
