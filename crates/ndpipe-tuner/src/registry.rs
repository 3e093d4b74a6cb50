//! The model registry: every version the Tuner produced (or found deployed), with its head file
//! and its task; which version every node must serve for each task (the intent).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndpipe_catalog::{Catalog, CatalogError, ModelVersion, Task, TaskName};
use ndpipe_model::HeadVersion;
use ndpipe_proto::Serving;
use ndpipe_util::fs::{file_stem, write_durably};

use crate::{Head, TunerError};

/// Model versions (a [`ModelRegistry`]) and head files (`heads/<file_stem(id)>.safetensors`).
///
/// File names: [`file_stem`] keeps ASCII letters, digits, `-`, `_` and `.`. The sanitiser before
/// it also turned `.` into `_`; the Tuner's ids (`ft-<ms>-<hex>`, and the PipeStores' pretrained
/// `<name>-<hex>`) contain no `.`, so the heads of existing versions keep their file names.
pub(crate) struct Registry {
    models: Arc<dyn Catalog>,
    heads: PathBuf,
}

impl Registry {
    /// The registry of `models` (the Tuner's `registry.sqlite`) with its head files in
    /// `dir/heads`, which is created if absent.
    pub(crate) fn open(dir: &Path, models: Arc<dyn Catalog>) -> Result<Self, TunerError> {
        let heads = dir.join("heads");
        std::fs::create_dir_all(&heads).map_err(|source| TunerError::Io {
            path: heads.clone(),
            source,
        })?;
        Ok(Registry { models, heads })
    }

    /// Where the head of `id` is kept.
    fn head_path(&self, id: &str) -> PathBuf {
        self.heads.join(format!("{}.safetensors", file_stem(id)))
    }

    /// All versions, oldest first.
    pub(crate) fn list(&self) -> Result<Vec<ModelVersion>, TunerError> {
        Ok(self.models.models()?)
    }

    /// One version.
    pub(crate) fn get(&self, id: &str) -> Result<ModelVersion, TunerError> {
        self.models
            .model(id)?
            .ok_or_else(|| TunerError::UnknownVersion(id.to_string()))
    }

    /// The version serving `task` now, if any.
    pub(crate) fn active(&self, task: &TaskName) -> Result<Option<ModelVersion>, TunerError> {
        Ok(self.models.active_model(task)?)
    }

    /// The versions serving now, one per task, in task order.
    pub(crate) fn active_all(&self) -> Result<Vec<ModelVersion>, TunerError> {
        Ok(self.models.active_models()?)
    }

    /// What every node must serve: each task's active version (empty before any is).
    pub(crate) fn intent(&self) -> Result<Serving, TunerError> {
        Ok(self
            .active_all()?
            .into_iter()
            .map(|v| (v.task.to_string(), v.id))
            .collect())
    }

    /// Records a version (not active until deployed), unless it is known already, and its task
    /// when the registry does not know it yet (a Tuner with a catalog of its own learns the
    /// PipeStores' tasks from their jobs).
    pub(crate) fn record(&self, version: &ModelVersion) -> Result<(), TunerError> {
        if self.models.model(&version.id)?.is_some() {
            return Ok(());
        }
        if self.models.task(&version.task)?.is_none() {
            let created = self.models.create_task(&Task {
                name: version.task.clone(),
                floor: None,
                created_ms: ndpipe_util::time::now_ms(),
            });
            match created {
                Ok(()) | Err(CatalogError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.models.register_model(&ModelVersion {
            active: false,
            ..version.clone()
        })?;
        Ok(())
    }

    /// Marks `id` as the serving version of its task.
    pub(crate) fn set_active(&self, id: &str) -> Result<(), TunerError> {
        Ok(self.models.set_active_model(id)?)
    }

    /// Leaves `task` without a serving version (a rollout forced past a task whose head could
    /// not be carried).
    pub(crate) fn deactivate(&self, task: &TaskName) -> Result<(), TunerError> {
        self.models.deactivate_task(task)?;
        Ok(())
    }

    /// Where the photos `id` trained on are kept.
    fn trained_path(&self, id: &str) -> PathBuf {
        self.heads.join(format!("{}.trained.json", file_stem(id)))
    }

    /// Records (durably) the photos version `id` trained on, per node name.
    pub(crate) fn save_trained(
        &self,
        id: &str,
        trained: &BTreeMap<String, Vec<u64>>,
    ) -> Result<(), TunerError> {
        let path = self.trained_path(id);
        let bytes = serde_json::to_vec(trained)
            .map_err(|e| TunerError::Internal(format!("trained photos of {id}: {e}")))?;
        write_durably(&path, &bytes).map_err(|source| TunerError::Io { path, source })
    }

    /// The photos that version `id` and its ancestors trained on, per node name: a successor
    /// must not validate on them. Versions without a record (a pretrained one) add nothing.
    pub(crate) fn trained_by_lineage(
        &self,
        id: Option<&str>,
    ) -> Result<HashMap<String, HashSet<u64>>, TunerError> {
        let mut all: HashMap<String, HashSet<u64>> = HashMap::new();
        let mut next = id.map(str::to_string);
        let mut seen = HashSet::new();
        while let Some(id) = next.take().filter(|id| seen.insert(id.clone())) {
            let path = self.trained_path(&id);
            if path.exists() {
                let bytes = std::fs::read(&path).map_err(|source| TunerError::Io {
                    path: path.clone(),
                    source,
                })?;
                let trained: BTreeMap<String, Vec<u64>> = serde_json::from_slice(&bytes)
                    .map_err(|e| TunerError::Internal(format!("{}: {e}", path.display())))?;
                for (node, ids) in trained {
                    all.entry(node).or_default().extend(ids);
                }
            }
            next = self.models.model(&id)?.and_then(|v| v.parent);
        }
        Ok(all)
    }

    /// Writes the head of `version` (durably), labelled with the version.
    pub(crate) fn save_head(&self, version: &ModelVersion, head: &Head) -> Result<(), TunerError> {
        let label = HeadVersion {
            id: version.id.clone(),
            task: version.task.to_string(),
            backbone: version.backbone.clone(),
            parent: version.parent.clone(),
            metrics: version.metrics.clone(),
        };
        head.save_as(&self.head_path(&version.id), Some(label))
    }

    /// The head of `id`; `None` for a version without a head file on the Tuner (a PipeStore's
    /// pretrained version).
    pub(crate) fn head(&self, id: &str) -> Result<Option<Head>, TunerError> {
        let path = self.head_path(id);
        if path.exists() {
            Head::load(&path).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::SqliteCatalog;

    use super::*;
    use crate::HeadConfig;

    fn version(id: &str) -> ModelVersion {
        ModelVersion {
            task: TaskName::default_task(),
            id: id.into(),
            backbone: "b".repeat(64),
            parent: None,
            metrics: serde_json::json!({}),
            created_ms: 1,
            active: true,
        }
    }

    #[test]
    fn versions_are_recorded_once_inactive_and_keep_their_head_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let models = Arc::new(SqliteCatalog::in_memory().unwrap());
        let registry = Registry::open(dir.path(), models).unwrap();
        registry.record(&version("ft-1-abcdef12")).unwrap();
        registry.record(&version("ft-1-abcdef12")).unwrap();
        assert_eq!(registry.list().unwrap().len(), 1);
        let default = TaskName::default_task();
        assert!(registry.active(&default).unwrap().is_none());
        registry.set_active("ft-1-abcdef12").unwrap();
        assert_eq!(
            registry.active(&default).unwrap().unwrap().id,
            "ft-1-abcdef12"
        );
        assert_eq!(
            registry.intent().unwrap().to_string(),
            "default=ft-1-abcdef12"
        );
        assert!(matches!(
            registry.get("nope"),
            Err(TunerError::UnknownVersion(_))
        ));

        assert_eq!(
            registry.head_path("ft-1700000000000-abcdef12"),
            dir.path()
                .join("heads/ft-1700000000000-abcdef12.safetensors")
        );
        assert_eq!(
            registry.head_path("../x"),
            dir.path().join("heads/_.._x.safetensors")
        );
        assert!(registry.head("ft-1-abcdef12").unwrap().is_none());
        let head = Head::new(HeadConfig {
            input_dim: 4,
            ..HeadConfig::new(vec!["a".into(), "b".into()])
        })
        .unwrap();
        registry
            .save_head(&version("ft-1-abcdef12"), &head)
            .unwrap();
        let back = registry.head("ft-1-abcdef12").unwrap().unwrap();
        assert_eq!(back.config(), head.config());
        let file = ndpipe_model::HeadFile::read(&registry.head_path("ft-1-abcdef12")).unwrap();
        assert_eq!(file.version.unwrap().id, "ft-1-abcdef12");
    }
}
