//! The class names' embeddings on disk, so that a restart does not run every name through the
//! model again (about 5,000 texts for ImageNet's and Fashion-MNIST's classes). One safetensors
//! file per model, named by the model's fingerprint: an `[n, dim]` f32 tensor and, in the
//! metadata, the `n` texts in row order and the fingerprint. Texts are the keys, so a class list
//! that grows reuses every row it shares with the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

use super::{Embedded, WordsError};

/// Metadata key of the texts (a JSON array, in row order).
const TEXTS_KEY: &str = "ndpipe.words.texts";
/// Metadata key of the model's fingerprint.
const MODEL_KEY: &str = "ndpipe.words.model";
/// Name of the embeddings tensor.
const TENSOR: &str = "embeddings";

/// The cache file of the model with `fingerprint` in `dir`.
pub(crate) fn file_in(dir: &Path, fingerprint: &str) -> PathBuf {
    dir.join(format!(
        "words-{}.safetensors",
        &fingerprint[..16.min(fingerprint.len())]
    ))
}

/// The embeddings in `path` (none when there is no file), checked against the model's
/// `fingerprint` and width `dim`.
pub(crate) fn read(path: &Path, fingerprint: &str, dim: usize) -> Result<Embedded, WordsError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(source) => {
            return Err(WordsError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let bad = |reason: String| WordsError::Cache {
        path: path.to_path_buf(),
        reason,
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    if meta.get(MODEL_KEY).map(String::as_str) != Some(fingerprint) {
        return Err(bad("written for another model".into()));
    }
    let texts: Vec<String> = meta
        .get(TEXTS_KEY)
        .map(|j| serde_json::from_str(j).map_err(|e| bad(e.to_string())))
        .transpose()?
        .ok_or_else(|| bad(format!("no {TEXTS_KEY} metadata")))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let view = st.tensor(TENSOR).map_err(|e| bad(e.to_string()))?;
    if view.dtype() != Dtype::F32 || view.shape() != [texts.len(), dim] {
        return Err(bad(format!(
            "{TENSOR} is {:?} {:?}, expected F32 [{}, {dim}]",
            view.dtype(),
            view.shape(),
            texts.len()
        )));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(texts
        .into_iter()
        .zip(values.chunks_exact(dim).map(Arc::from))
        .collect())
}

/// Replaces `path` with `embedded` (durably: a crash leaves the old file or the new one),
/// creating its folder.
pub(crate) fn write(path: &Path, fingerprint: &str, embedded: &Embedded) -> Result<(), WordsError> {
    let bad = |reason: String| WordsError::Cache {
        path: path.to_path_buf(),
        reason,
    };
    let mut texts: Vec<&String> = embedded.keys().collect();
    texts.sort();
    let dim = texts.first().map_or(0, |t| embedded[*t].len());
    let bytes: Vec<u8> = texts
        .iter()
        .flat_map(|t| embedded[*t].iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    let view = TensorView::new(Dtype::F32, vec![texts.len(), dim], &bytes)
        .map_err(|e| bad(e.to_string()))?;
    let metadata = HashMap::from([
        (MODEL_KEY.to_string(), fingerprint.to_string()),
        (
            TEXTS_KEY.to_string(),
            serde_json::to_string(&texts).map_err(|e| bad(e.to_string()))?,
        ),
    ]);
    let file =
        safetensors::serialize([(TENSOR, view)], Some(metadata)).map_err(|e| bad(e.to_string()))?;
    let write_error = |source| WordsError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(write_error)?;
    }
    ndpipe_util::fs::write_durably(path, &file).map_err(write_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Embedded {
        HashMap::from([
            (
                "tabby".to_string(),
                Arc::from([1.0f32, 0.0, 0.0].as_slice()),
            ),
            (
                "trousers".to_string(),
                Arc::from([0.0f32, 0.6, 0.8].as_slice()),
            ),
        ])
    }

    #[test]
    fn a_written_cache_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_in(&dir.path().join("sub"), "abcdef0123456789ffff");
        assert!(read(&path, "abcdef0123456789ffff", 3).unwrap().is_empty());
        write(&path, "abcdef0123456789ffff", &sample()).unwrap();
        assert_eq!(read(&path, "abcdef0123456789ffff", 3).unwrap(), sample());
    }

    #[test]
    fn another_model_or_width_or_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        write(&path, "model-a", &sample()).unwrap();
        assert!(matches!(
            read(&path, "model-b", 3),
            Err(WordsError::Cache { .. })
        ));
        assert!(matches!(
            read(&path, "model-a", 4),
            Err(WordsError::Cache { .. })
        ));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 5);
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(
            read(&path, "model-a", 3),
            Err(WordsError::Cache { .. })
        ));
    }
}
