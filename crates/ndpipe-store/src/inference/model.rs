//! The node-side model lifecycle, in one place.
//!
//! A node runs one backbone (the pretrained model) and labels with the *active* model: the
//! backbone's own classifier, or a fine-tuned head over its features. [`Models`] keeps the
//! pretrained version registered, loads the active head at start, commits (or rolls back to)
//! versions as the Tuner deploys them, and switches to another backbone at the end of a
//! rollout, remembering the version before for label churn.

use std::sync::{Arc, Mutex, RwLock};

use ndpipe_catalog::{CatalogError, ModelRegistry, ModelVersion, Prediction};
use ndpipe_model::{HeadVersion, HeadWeights, InferenceBackend, ModelInfo, Outputs, top_k};
use ndpipe_util::sync::{lock, read, write};
use tracing::info;

use super::InferenceError;
use super::heads::HeadDir;

/// The model that labels the store, and the catalog version its labels are filed under.
#[derive(Clone)]
pub struct ActiveModel {
    /// The inference backend (the backbone, with its own pretrained classifier).
    pub backend: Arc<dyn InferenceBackend>,
    /// The catalog's model version id.
    pub version: String,
    /// A fine-tuned classifier head over the backbone's features; `None` uses the backbone's
    /// own logits and classes.
    pub head: Option<Arc<HeadWeights>>,
}

impl ActiveModel {
    /// The model version id of a pretrained model: its name and the backbone hash prefix.
    pub fn pretrained_version(info: &ModelInfo) -> String {
        info.pretrained_version()
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        self.backend.info()
    }

    /// The top-`k` labels of row `i` of a backbone run.
    pub(crate) fn predictions(&self, outputs: &Outputs, i: usize, k: usize) -> Vec<Prediction> {
        match &self.head {
            Some(head) => head_predictions(head, outputs.features(i), k),
            None => backbone_predictions(self.info(), outputs, i, k),
        }
    }
}

/// The top-`k` labels a head gives a feature vector.
pub(crate) fn head_predictions(head: &HeadWeights, features: &[f32], k: usize) -> Vec<Prediction> {
    head.top_k(features, k)
        .into_iter()
        .map(|(label, score)| Prediction {
            label: label.to_string(),
            score,
        })
        .collect()
}

/// The top-`k` labels the backbone's own classifier gives row `i`.
pub(crate) fn backbone_predictions(
    info: &ModelInfo,
    outputs: &Outputs,
    i: usize,
    k: usize,
) -> Vec<Prediction> {
    top_k(outputs.logits(i), k)
        .into_iter()
        .map(|(class, score)| Prediction {
            label: info.class_name(class).unwrap_or("unknown").to_string(),
            score,
        })
        .collect()
}

/// The active model, swappable at run time (a deploy commits a new head). Clones share it.
#[derive(Clone)]
pub(crate) struct SharedModel(Arc<RwLock<ActiveModel>>);

impl SharedModel {
    /// Wraps the initial model.
    pub(crate) fn new(model: ActiveModel) -> Self {
        SharedModel(Arc::new(RwLock::new(model)))
    }

    /// The model now (cheap: it clones `Arc`s).
    pub(crate) fn get(&self) -> ActiveModel {
        read(&self.0).clone()
    }

    /// Replaces the model.
    pub(crate) fn set(&self, model: ActiveModel) {
        *write(&self.0) = model;
    }
}

/// The node's models: the pretrained one it loaded, the active one, the one before it, and the
/// committed heads.
pub(crate) struct Models {
    pretrained: RwLock<ActiveModel>,
    active: SharedModel,
    previous: Mutex<Option<String>>,
    heads: HeadDir,
    registry: Arc<dyn ModelRegistry>,
}

impl Models {
    /// Sets up the models of a node that loaded `pretrained`: registers its version (it becomes
    /// active when no version is), then loads the head of the registry's active version when
    /// this node committed one into `heads`.
    pub(crate) fn open(
        pretrained: ActiveModel,
        registry: Arc<dyn ModelRegistry>,
        heads: HeadDir,
    ) -> Result<Self, InferenceError> {
        register_pretrained(&*registry, &pretrained)?;
        let previous = heads.read_previous()?;
        let models = Models {
            active: SharedModel::new(pretrained.clone()),
            pretrained: RwLock::new(pretrained),
            previous: Mutex::new(previous),
            heads,
            registry,
        };
        models.load_active_head()?;
        Ok(models)
    }

    /// The backbone with its own classifier: as loaded, or as a rollout switched to.
    pub(crate) fn pretrained(&self) -> ActiveModel {
        read(&self.pretrained).clone()
    }

    /// The active model, shared with everything that labels.
    pub(crate) fn active(&self) -> &SharedModel {
        &self.active
    }

    /// The version that was active before the last commit that changed it (`None` until one
    /// does): re-labelling measures churn against it.
    pub(crate) fn previous(&self) -> Option<String> {
        lock(&self.previous).clone()
    }

    /// Loads the head of the registry's active version. A version of another backbone (a
    /// rollout switched the backbone, and stopped before the registry said so) gives way to
    /// this backbone's pretrained version.
    fn load_active_head(&self) -> Result<(), InferenceError> {
        let Some(active) = self.registry.active_model()? else {
            return Ok(());
        };
        let pretrained = self.pretrained();
        if active.id == pretrained.version {
            return Ok(());
        }
        if active.backbone != pretrained.info().backbone_version {
            info!(version = %active.id, serving = %pretrained.version, "the active version is of another backbone: serving this backbone's own");
            self.registry.set_active_model(&pretrained.version)?;
            return Ok(());
        }
        let Some((head, _)) = self.heads.read(&active.id)? else {
            return Ok(());
        };
        info!(version = %active.id, classes = head.classes().len(), "loaded the active fine-tuned head");
        self.active.set(self.with_head(active.id, head));
        Ok(())
    }

    /// Keeps `head` durably as the staged head of `version` (replacing one staged before), for a
    /// later [`Models::commit`], which may come after a restart.
    pub(crate) fn stage(
        &self,
        head: &HeadWeights,
        version: &HeadVersion,
    ) -> Result<(), InferenceError> {
        self.heads.write_staged(head, version)
    }

    /// Drops the staged head of `version`; returns whether there was one.
    pub(crate) fn abort(&self, version: &str) -> Result<bool, InferenceError> {
        self.heads.remove_staged(version)
    }

    /// Makes `version` the active model: the pretrained one (a rollback), or a fine-tuned head,
    /// staged or committed on this node before. Idempotent: committing the active version again
    /// succeeds. A head is written to the heads directory first, then registered (or
    /// re-activated) in the registry, then swapped in; its staged file goes last.
    pub(crate) fn commit(&self, version: &str) -> Result<(), InferenceError> {
        let before = self.active.get().version;
        let pretrained = self.pretrained();
        if version == pretrained.version {
            self.registry.set_active_model(version)?;
            self.active.set(pretrained);
            info!(version, "rolled back to the pretrained model");
        } else {
            let (head, meta) = match self.heads.read_staged(version)? {
                Some(staged) => staged,
                None => self
                    .heads
                    .read(version)?
                    .ok_or_else(|| InferenceError::NotStaged {
                        version: version.to_string(),
                    })?,
            };
            let meta = meta.unwrap_or_else(|| HeadVersion {
                id: version.to_string(),
                backbone: pretrained.info().backbone_version.clone(),
                parent: None,
                metrics: serde_json::Value::Null,
            });
            self.heads.write(&head, &meta)?;
            if self.registry.model(version)?.is_some() {
                self.registry.set_active_model(version)?;
            } else {
                self.registry.register_model(&ModelVersion {
                    id: version.to_string(),
                    backbone: meta.backbone,
                    parent: meta.parent,
                    metrics: meta.metrics,
                    created_ms: ndpipe_util::time::now_ms(),
                    active: true,
                })?;
            }
            self.active.set(self.with_head(version.to_string(), head));
            self.heads.remove_staged(version)?;
            info!(version, "committed a new head");
        }
        self.remember_previous(before, version)
    }

    /// Records `pretrained`'s version in the registry (not active), so that labels can be
    /// filed under it before a rollout switches to it.
    pub(crate) fn register(&self, pretrained: &ActiveModel) -> Result<(), InferenceError> {
        register_pretrained(&*self.registry, pretrained)
    }

    /// Serves `pretrained`, another backbone with its own classifier, from now on: its version
    /// becomes active in the registry, then it labels. Idempotent.
    pub(crate) fn switch_backbone(&self, pretrained: ActiveModel) -> Result<(), InferenceError> {
        let before = self.active.get().version;
        let version = pretrained.version.clone();
        register_pretrained(&*self.registry, &pretrained)?;
        self.registry.set_active_model(&version)?;
        *write(&self.pretrained) = pretrained.clone();
        self.active.set(pretrained);
        info!(version, "switched to another backbone");
        self.remember_previous(before, &version)
    }

    /// Keeps `before` as the version before `now` when they differ (for label churn).
    fn remember_previous(&self, before: String, now: &str) -> Result<(), InferenceError> {
        if before != now {
            self.heads.write_previous(&before)?;
            *lock(&self.previous) = Some(before);
        }
        Ok(())
    }

    fn with_head(&self, version: String, head: HeadWeights) -> ActiveModel {
        ActiveModel {
            version,
            head: Some(Arc::new(head)),
            ..self.pretrained()
        }
    }
}

/// Records the pretrained model's version in the registry (unless another node of a shared
/// catalog did); it becomes this node's active version when it has none.
fn register_pretrained(
    registry: &dyn ModelRegistry,
    model: &ActiveModel,
) -> Result<(), InferenceError> {
    if registry.model(&model.version)?.is_none() {
        let info = model.info();
        let registered = registry.register_model(&ModelVersion {
            id: model.version.clone(),
            backbone: info.backbone_version.clone(),
            parent: None,
            metrics: serde_json::json!({"head": "pretrained", "name": info.name, "classes": info.num_classes}),
            created_ms: ndpipe_util::time::now_ms(),
            active: false,
        });
        match registered {
            Ok(()) | Err(CatalogError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if registry.active_model()?.is_none() {
        registry.set_active_model(&model.version)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::SqliteCatalog;
    use ndpipe_model::FakeBackend;

    use super::*;

    fn pretrained() -> ActiveModel {
        let backend = Arc::new(FakeBackend::new(3, 4));
        ActiveModel {
            version: ActiveModel::pretrained_version(backend.info()),
            backend,
            head: None,
        }
    }

    fn head() -> (HeadWeights, HeadVersion) {
        let head = HeadWeights::new(
            vec!["a".into(), "b".into()],
            3,
            vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
            vec![0.0, 0.0],
        )
        .unwrap();
        let version = HeadVersion {
            id: "ft-1".into(),
            backbone: pretrained().info().backbone_version.clone(),
            parent: Some(pretrained().version),
            metrics: serde_json::json!({"val_top1": 0.5}),
        };
        (head, version)
    }

    #[test]
    fn commits_persist_and_roll_back() {
        let dir = tempfile::tempdir().unwrap();
        let registry: Arc<dyn ModelRegistry> =
            Arc::new(SqliteCatalog::open(&dir.path().join("c.sqlite")).unwrap());
        let open = || {
            Models::open(
                pretrained(),
                registry.clone(),
                HeadDir::open(dir.path().join("heads")).unwrap(),
            )
            .unwrap()
        };
        let models = open();
        let base = pretrained().version;
        assert_eq!(registry.active_model().unwrap().unwrap().id, base);
        assert!(matches!(
            models.commit("ft-9"),
            Err(InferenceError::NotStaged { .. })
        ));

        let (weights, version) = head();
        models.stage(&weights, &version).unwrap();
        assert!(models.abort("ft-1").unwrap());
        assert!(matches!(
            models.commit("ft-1"),
            Err(InferenceError::NotStaged { .. })
        ));
        // A head staged before a restart can be committed after it.
        models.stage(&weights, &version).unwrap();
        let models = open();
        models.commit("ft-1").unwrap();
        assert!(
            !models.abort("ft-1").unwrap(),
            "the commit used up the staged file"
        );
        assert_eq!(models.active().get().version, "ft-1");
        assert_eq!(models.previous().as_deref(), Some(base.as_str()));
        let registered = registry.model("ft-1").unwrap().unwrap();
        assert!(registered.active);
        assert_eq!(registered.parent.as_deref(), Some(base.as_str()));

        // A restart loads the committed head of the active version, and knows the one before.
        let reopened = open();
        assert_eq!(reopened.previous().as_deref(), Some(base.as_str()));
        let active = reopened.active().get();
        assert_eq!(active.version, "ft-1");
        assert_eq!(active.head.as_deref(), Some(&head().0));

        reopened.commit(&base).unwrap();
        assert!(reopened.active().get().head.is_none());
        assert_eq!(reopened.previous().as_deref(), Some("ft-1"));
        // A committed version can be committed again without being staged, twice.
        reopened.commit("ft-1").unwrap();
        reopened.commit("ft-1").unwrap();
        assert_eq!(registry.active_model().unwrap().unwrap().id, "ft-1");
        assert_eq!(reopened.previous().as_deref(), Some(base.as_str()));
    }

    #[test]
    fn a_switched_backbone_serves_and_a_restart_on_it_leaves_the_old_backbones_head() {
        let dir = tempfile::tempdir().unwrap();
        let registry: Arc<dyn ModelRegistry> =
            Arc::new(SqliteCatalog::open(&dir.path().join("c.sqlite")).unwrap());
        let heads = || HeadDir::open(dir.path().join("heads")).unwrap();
        let models = Models::open(pretrained(), registry.clone(), heads()).unwrap();
        let (weights, version) = head();
        models.stage(&weights, &version).unwrap();
        models.commit("ft-1").unwrap();

        let backend = Arc::new(FakeBackend::new(5, 4));
        let other = ActiveModel {
            version: ActiveModel::pretrained_version(backend.info()),
            backend,
            head: None,
        };
        assert_ne!(other.version, pretrained().version);
        models.register(&other).unwrap();
        assert_eq!(registry.active_model().unwrap().unwrap().id, "ft-1");
        models.switch_backbone(other.clone()).unwrap();
        models.switch_backbone(other.clone()).unwrap();
        assert_eq!(models.active().get().version, other.version);
        assert!(models.active().get().head.is_none());
        assert_eq!(models.pretrained().version, other.version);
        assert_eq!(models.previous().as_deref(), Some("ft-1"));
        assert_eq!(registry.active_model().unwrap().unwrap().id, other.version);

        // A node that restarts on the new backbone while the registry still names a head of
        // the old one (it stopped between the two) serves the new backbone's own version.
        registry.set_active_model("ft-1").unwrap();
        let reopened = Models::open(other.clone(), registry.clone(), heads()).unwrap();
        let active = reopened.active().get();
        assert_eq!(
            (active.version.as_str(), active.head.is_none()),
            (other.version.as_str(), true)
        );
        assert_eq!(registry.active_model().unwrap().unwrap().id, other.version);
    }
}
