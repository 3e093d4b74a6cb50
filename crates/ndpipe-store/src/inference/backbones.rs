//! The backbones a node keeps on disk, and how it loads one.
//!
//! `DATA/backbones/staged/<sha256>/` holds a backbone a rollout staged (`model.json`,
//! `model.onnx`, `classes.txt`), `staged/<sha256>.progress.json` the checkpoint of its
//! re-extraction; a commit moves it to `DATA/backbones/<sha256>/` and names it in
//! `DATA/backbones/active`, which the node loads at start instead of its `model_dir`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndpipe_model::{InferenceBackend, ModelError, OrtBackend, RateCapped, RuntimeConfig};
use ndpipe_util::fs::{sync_dir, write_durably};

/// The file naming the committed backbone the node serves.
const ACTIVE: &str = "active";

/// How a node loads a backbone: ONNX Runtime with its settings, capped at its rate limit.
#[derive(Debug, Clone)]
pub(crate) struct BackboneLoader {
    /// The runtime settings.
    pub(crate) runtime: RuntimeConfig,
    /// Images per second at most (0: no cap), the emulated slower accelerator.
    pub(crate) rate_limit: f64,
}

impl BackboneLoader {
    /// Loads the model folder `dir` (blocking).
    pub(crate) fn load(&self, dir: &Path) -> Result<Arc<dyn InferenceBackend>, ModelError> {
        let backend = Arc::new(OrtBackend::load(dir, &self.runtime)?);
        if self.rate_limit > 0.0 {
            return Ok(Arc::new(RateCapped::new(backend, self.rate_limit)));
        }
        Ok(backend)
    }
}

/// `DATA/backbones`: staged and committed backbones.
#[derive(Debug, Clone)]
pub(crate) struct BackboneDirs {
    root: PathBuf,
}

impl BackboneDirs {
    /// The backbones under `data/backbones`.
    pub(crate) fn new(data: &Path) -> Self {
        BackboneDirs {
            root: data.join("backbones"),
        }
    }

    /// Where a staged backbone is kept.
    pub(crate) fn staged(&self, sha256: &str) -> PathBuf {
        self.root.join("staged").join(sha256)
    }

    /// Where a staged backbone is written before it is verified.
    pub(crate) fn incoming(&self, sha256: &str) -> PathBuf {
        self.root.join("staged").join(format!("{sha256}.incoming"))
    }

    /// The checkpoint of a staged backbone's re-extraction.
    pub(crate) fn checkpoint(&self, sha256: &str) -> PathBuf {
        self.root
            .join("staged")
            .join(format!("{sha256}.progress.json"))
    }

    /// The photos a staged backbone's re-extraction gave to other nodes (load balancing).
    pub(crate) fn given(&self, sha256: &str) -> PathBuf {
        self.root
            .join("staged")
            .join(format!("{sha256}.given.json"))
    }

    /// Where a committed backbone is kept.
    pub(crate) fn committed(&self, sha256: &str) -> PathBuf {
        self.root.join(sha256)
    }

    /// The folder of the committed backbone the node serves, if a rollout committed one.
    pub(crate) fn active(&self) -> io::Result<Option<PathBuf>> {
        match std::fs::read_to_string(self.root.join(ACTIVE)) {
            Ok(sha) => Ok(Some(self.committed(sha.trim()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Moves staged backbone `sha256` (when still staged) to the committed ones and names it
    /// the active one, durably.
    pub(crate) fn commit(&self, sha256: &str) -> io::Result<()> {
        let staged = self.staged(sha256);
        let committed = self.committed(sha256);
        if staged.exists() && !committed.exists() {
            std::fs::rename(&staged, &committed)?;
            sync_dir(&self.root)?;
            sync_dir(&self.root.join("staged"))?;
        }
        write_durably(&self.root.join(ACTIVE), sha256.as_bytes())
    }

    /// Drops staged backbone `sha256`, its incoming copy, its checkpoint and the photos it gave
    /// away; returns whether there was one.
    pub(crate) fn remove_staged(&self, sha256: &str) -> io::Result<bool> {
        let staged = self.staged(sha256);
        let existed = staged.exists();
        for dir in [staged, self.incoming(sha256)] {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
        }
        for file in [self.checkpoint(sha256), self.given(sha256)] {
            match std::fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(existed)
    }
}
