//! The model registry: every version the Tuner produced (or found deployed), with its head file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndpipe_catalog::{Catalog, ModelVersion, SqliteCatalog};

use crate::TunerError;

/// Model versions (in a catalog's `model_versions` table) and head files (`heads/<id>.safetensors`).
pub struct Versions {
    catalog: Arc<dyn Catalog>,
    heads: PathBuf,
}

impl Versions {
    /// Opens the registry in `dir`.
    pub fn open(dir: &Path) -> Result<Self, TunerError> {
        let heads = dir.join("heads");
        std::fs::create_dir_all(&heads).map_err(|source| TunerError::Io {
            path: heads.clone(),
            source,
        })?;
        let catalog = Arc::new(SqliteCatalog::open(&dir.join("registry.sqlite"))?);
        Ok(Versions { catalog, heads })
    }

    /// Where the head of `id` is kept.
    pub fn head_path(&self, id: &str) -> PathBuf {
        let safe: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.heads.join(format!("{safe}.safetensors"))
    }

    /// All versions, oldest first.
    pub fn list(&self) -> Result<Vec<ModelVersion>, TunerError> {
        Ok(self.catalog.models()?)
    }

    /// One version.
    pub fn get(&self, id: &str) -> Result<ModelVersion, TunerError> {
        self.list()?
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| TunerError::UnknownVersion(id.to_string()))
    }

    /// The version serving now, if any.
    pub fn active(&self) -> Result<Option<ModelVersion>, TunerError> {
        Ok(self.list()?.into_iter().find(|m| m.active))
    }

    /// Records a version (not active until deployed), unless it is known already.
    pub fn record(&self, version: &ModelVersion) -> Result<(), TunerError> {
        if self.list()?.iter().any(|m| m.id == version.id) {
            return Ok(());
        }
        self.catalog.register_model(&ModelVersion {
            active: false,
            ..version.clone()
        })?;
        Ok(())
    }

    /// Marks `id` as the serving version.
    pub fn set_active(&self, id: &str) -> Result<(), TunerError> {
        Ok(self.catalog.set_active_model(id)?)
    }
}
