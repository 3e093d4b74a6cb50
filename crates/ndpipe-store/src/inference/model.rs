//! The node-side model lifecycle, in one place.
//!
//! A node runs one backbone and labels every photo for every task from one backbone pass: the
//! `general` task with the backbone's own classifier, and each custom task with its active head
//! over the same features (one matrix multiply per task). [`Models`] keeps the pretrained
//! version registered as `general`'s, loads each task's active head at start, commits (or rolls
//! back) versions task by task as the Tuner deploys them, and switches backbone, with the heads
//! trained for it, at the end of a rollout, remembering each task's version before for label
//! churn.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use ndpipe_catalog::{Catalog, CatalogError, ModelVersion, Prediction, TaskName};
use ndpipe_model::{HeadVersion, HeadWeights, InferenceBackend, ModelInfo, OTHER, Outputs, top_k};
use ndpipe_proto::Serving;
use ndpipe_util::sync::{lock, read, write};
use tracing::{info, warn};

use super::InferenceError;
use super::heads::HeadDir;

/// One task's classifier on a node: the catalog version its labels are filed under, and how it
/// labels.
#[derive(Clone)]
pub struct TaskModel {
    /// The task.
    pub task: TaskName,
    /// The catalog's model version id.
    pub version: String,
    /// The task's head over the backbone's features; `None` for the backbone's own classifier
    /// (the general task).
    pub head: Option<Arc<HeadWeights>>,
    /// The task's own score floor (an operator's setting), over the head's calibrated one.
    pub floor: Option<f32>,
}

impl TaskModel {
    /// The top-`k` labels of row `i` of a backbone run: the classes that reach the floor, or
    /// [`OTHER`].
    pub(crate) fn predictions(
        &self,
        info: &ModelInfo,
        outputs: &Outputs,
        i: usize,
        k: usize,
    ) -> Vec<Prediction> {
        match &self.head {
            Some(head) => head_predictions(head, outputs.features(i), k, self.floor),
            None => backbone_predictions(info, outputs, i, k, self.floor),
        }
    }
}

/// The labels a head gives a feature vector (see [`HeadWeights::label`]).
pub(crate) fn head_predictions(
    head: &HeadWeights,
    features: &[f32],
    k: usize,
    floor: Option<f32>,
) -> Vec<Prediction> {
    head.label(features, k, floor)
        .into_iter()
        .map(|(label, score)| Prediction {
            label: label.to_string(),
            score,
        })
        .collect()
}

/// The top-`k` labels the backbone's own classifier gives row `i`, those under `floor` left
/// out ([`OTHER`] when none is left).
pub(crate) fn backbone_predictions(
    info: &ModelInfo,
    outputs: &Outputs,
    i: usize,
    k: usize,
    floor: Option<f32>,
) -> Vec<Prediction> {
    let top = top_k(outputs.logits(i), k);
    let best = top.first().map_or(0.0, |t| t.1);
    let kept: Vec<Prediction> = top
        .into_iter()
        .filter(|(_, p)| *p >= floor.unwrap_or(0.0))
        .map(|(class, score)| Prediction {
            label: info.class_name(class).unwrap_or("unknown").to_string(),
            score,
        })
        .collect();
    if kept.is_empty() {
        vec![Prediction {
            label: OTHER.into(),
            score: 1.0 - best,
        }]
    } else {
        kept
    }
}

/// The models that label the store: one backbone and a classifier per task, `general` always
/// among them.
#[derive(Clone)]
pub struct ActiveModel {
    /// The inference backend (the backbone, with its own pretrained classifier).
    pub backend: Arc<dyn InferenceBackend>,
    /// Every task's classifier, in task order.
    pub tasks: Vec<TaskModel>,
}

impl ActiveModel {
    /// The backbone with its own classifier as the general task, under its pretrained version.
    pub fn pretrained(backend: Arc<dyn InferenceBackend>) -> Self {
        let version = Self::pretrained_version(backend.info());
        ActiveModel {
            backend,
            tasks: vec![TaskModel {
                task: TaskName::general(),
                version,
                head: None,
                floor: None,
            }],
        }
    }

    /// The backbone with its own classifier as the general task, its labels filed under
    /// `version` (a benchmark's own name for a variant).
    pub fn named(backend: Arc<dyn InferenceBackend>, version: &str) -> Self {
        let mut model = Self::pretrained(backend);
        model.tasks[0].version = version.to_string();
        model
    }

    /// The model version id of a pretrained model: its name and the backbone hash prefix.
    pub fn pretrained_version(info: &ModelInfo) -> String {
        info.pretrained_version()
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        self.backend.info()
    }

    /// The general task's version: the backbone's pretrained one.
    pub fn general_version(&self) -> &str {
        self.task(TaskName::GENERAL).map_or("", |t| &t.version)
    }

    /// The classifier of `task`, if the node serves one.
    pub fn task(&self, task: &str) -> Option<&TaskModel> {
        self.tasks.iter().find(|t| t.task == *task)
    }

    /// The classifier serving model version `version`, if any.
    pub fn serving_version(&self, version: &str) -> Option<&TaskModel> {
        self.tasks.iter().find(|t| t.version == version)
    }

    /// Whether `task`'s classifier (or [`OTHER`]) has a class a search for `label` finds.
    pub(crate) fn has_class(&self, task: &TaskModel, label: &str) -> bool {
        let matches = |class: &str| ndpipe_catalog::label_matches(class, label);
        matches(OTHER)
            || match &task.head {
                Some(head) => head.classes().iter().any(|c| matches(c)),
                None => (0..self.info().num_classes)
                    .filter_map(|i| self.info().class_name(i))
                    .any(matches),
            }
    }

    /// Every task's version, as the protocol reports them.
    pub(crate) fn serving(&self) -> Serving {
        self.tasks
            .iter()
            .map(|t| (t.task.to_string(), t.version.clone()))
            .collect()
    }

    /// Every task's labels of row `i` of a backbone run, as (version, top-`k` labels).
    pub(crate) fn label(
        &self,
        outputs: &Outputs,
        i: usize,
        k: usize,
    ) -> Vec<(String, Vec<Prediction>)> {
        self.tasks
            .iter()
            .map(|t| (t.version.clone(), t.predictions(self.info(), outputs, i, k)))
            .collect()
    }

    /// The model with `task`'s classifier replaced by (or added as) `model`.
    pub(crate) fn with_task(mut self, model: TaskModel) -> Self {
        self.tasks.retain(|t| t.task != model.task);
        self.tasks.push(model);
        self.tasks.sort_by(|a, b| a.task.cmp(&b.task));
        self
    }
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

    /// Changes the model in place.
    fn update(&self, f: impl FnOnce(ActiveModel) -> ActiveModel) {
        let mut model = write(&self.0);
        *model = f(model.clone());
    }
}

/// The node's models: the backbone with its own classifier, the active model of every task,
/// each task's version before, and the committed heads.
pub(crate) struct Models {
    pretrained: RwLock<ActiveModel>,
    active: SharedModel,
    previous: Mutex<BTreeMap<String, String>>,
    heads: HeadDir,
    registry: Arc<dyn Catalog>,
}

impl Models {
    /// Sets up the models of a node that loaded `pretrained`: registers its version as the
    /// general task's (active when the task has none), then loads the head of every task's
    /// active version that this node committed into `heads`, and the tasks' own floors.
    pub(crate) fn open(
        pretrained: ActiveModel,
        registry: Arc<dyn Catalog>,
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
        models.load_active_heads()?;
        models.refresh_floors()?;
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

    /// The version of `task` that was active before the last commit that changed it (`None`
    /// until one does): re-labelling measures churn against it.
    pub(crate) fn previous(&self, task: &TaskName) -> Option<String> {
        lock(&self.previous).get(task.as_str()).cloned()
    }

    /// Loads the head of every custom task's active version. A version of another backbone (a
    /// rollout switched the backbone and stopped before the registry said so) is not served:
    /// the task waits for the Tuner to bring the node a head of this backbone.
    fn load_active_heads(&self) -> Result<(), InferenceError> {
        let pretrained = self.pretrained();
        for active in self.registry.active_models()? {
            if active.task.is_general() {
                if active.id != pretrained.general_version() {
                    info!(version = %active.id, serving = %pretrained.general_version(), "the general task's version is of another backbone: serving this backbone's own");
                    self.registry
                        .set_active_model(pretrained.general_version())?;
                }
                continue;
            }
            if active.backbone != pretrained.info().backbone_version {
                warn!(task = %active.task, version = %active.id, "the task's active head is of another backbone: not served until the Tuner brings one of this backbone");
                self.registry.deactivate_task(&active.task)?;
                continue;
            }
            let Some((head, _)) = self.heads.read(&active.id)? else {
                continue;
            };
            info!(task = %active.task, version = %active.id, classes = head.classes().len(), "loaded the task's active head");
            self.active
                .update(|m| m.with_task(task_model(&active.task, active.id, head)));
        }
        Ok(())
    }

    /// Applies every task's own floor (an operator's setting, in the catalog) to the model.
    pub(crate) fn refresh_floors(&self) -> Result<(), InferenceError> {
        let floors: BTreeMap<TaskName, Option<f32>> = self
            .registry
            .tasks()?
            .into_iter()
            .map(|t| (t.name, t.floor))
            .collect();
        let changed = self
            .active
            .get()
            .tasks
            .iter()
            .any(|t| floors.get(&t.task).copied().flatten() != t.floor);
        if changed {
            self.active.update(|mut m| {
                for t in &mut m.tasks {
                    t.floor = floors.get(&t.task).copied().flatten();
                }
                m
            });
        }
        Ok(())
    }

    /// Keeps `head` durably as the staged head of `version` (replacing one of its task staged
    /// before), for a later [`Models::commit`], which may come after a restart.
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

    /// Makes `version` the active model of its task: the pretrained version (the general
    /// task's), or a head staged or committed on this node before. Idempotent. A head is
    /// written to the heads directory first, then registered (or re-activated) in the
    /// registry, then swapped in; its staged file goes last.
    pub(crate) fn commit(&self, version: &str) -> Result<(), InferenceError> {
        let pretrained = self.pretrained();
        if version == pretrained.general_version() {
            self.registry.set_active_model(version)?;
            info!(
                version,
                "the general task serves the backbone's own classifier"
            );
            return Ok(());
        }
        let (head, meta) = self.committable(version)?;
        let task: TaskName = meta.task.parse()?;
        let backbone = &pretrained.info().backbone_version;
        if meta.backbone != *backbone {
            return Err(InferenceError::OtherBackbone {
                version: version.to_string(),
                trained_on: meta.backbone,
                runs: backbone.clone(),
            });
        }
        self.install(&task, version, head, meta)?;
        self.heads.remove_staged(version)?;
        info!(task = %task, version, "committed a new head");
        Ok(())
    }

    /// The staged head of `version`, else the one committed here before, with its version
    /// (a head file without one: the default task, this backbone).
    fn committable(&self, version: &str) -> Result<(HeadWeights, HeadVersion), InferenceError> {
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
            task: TaskName::DEFAULT.to_string(),
            backbone: self.pretrained().info().backbone_version.clone(),
            parent: None,
            metrics: serde_json::Value::Null,
        });
        Ok((head, meta))
    }

    /// Writes `head` as committed, registers or re-activates `version` for `task`, and serves it.
    fn install(
        &self,
        task: &TaskName,
        version: &str,
        head: HeadWeights,
        meta: HeadVersion,
    ) -> Result<(), InferenceError> {
        let before = self
            .active
            .get()
            .task(task.as_str())
            .map(|t| t.version.clone());
        self.heads.write(&head, &meta)?;
        if self.registry.model(version)?.is_some() {
            self.registry.set_active_model(version)?;
        } else {
            self.registry.register_model(&ModelVersion {
                id: version.to_string(),
                task: task.clone(),
                backbone: meta.backbone,
                parent: meta.parent,
                metrics: meta.metrics,
                created_ms: ndpipe_util::time::now_ms(),
                active: true,
            })?;
        }
        let floor = self.registry.task(task)?.and_then(|t| t.floor);
        self.active.update(|m| {
            m.with_task(TaskModel {
                floor,
                ..task_model(task, version.to_string(), head)
            })
        });
        if let Some(before) = before {
            self.remember_previous(task, before, version)?;
        }
        Ok(())
    }

    /// Records `pretrained`'s version in the registry (not active), so that labels can be
    /// filed under it before a rollout switches to it.
    pub(crate) fn register(&self, pretrained: &ActiveModel) -> Result<(), InferenceError> {
        register_pretrained(&*self.registry, pretrained)
    }

    /// Serves `pretrained`, another backbone with its own classifier, from now on, with
    /// `heads` (versions staged for it, one per custom task) as its tasks' heads: the general
    /// task's version becomes the new backbone's, each head is committed, and a custom task
    /// without a head of the new backbone is no longer served. Idempotent.
    pub(crate) fn switch_backbone(
        &self,
        pretrained: ActiveModel,
        heads: &[String],
    ) -> Result<(), InferenceError> {
        let backbone = pretrained.info().backbone_version.clone();
        let staged = heads
            .iter()
            .map(|v| {
                let (head, meta) = self.committable(v)?;
                if meta.backbone != backbone {
                    return Err(InferenceError::OtherBackbone {
                        version: v.clone(),
                        trained_on: meta.backbone,
                        runs: backbone.clone(),
                    });
                }
                Ok((v.clone(), head, meta))
            })
            .collect::<Result<Vec<_>, InferenceError>>()?;
        let before = self.active.get();
        register_pretrained(&*self.registry, &pretrained)?;
        self.registry
            .set_active_model(pretrained.general_version())?;
        *write(&self.pretrained) = pretrained.clone();
        let carried: Vec<TaskName> = staged
            .iter()
            .map(|(_, _, m)| m.task.parse())
            .collect::<Result<_, CatalogError>>()?;
        for old in &before.tasks {
            if !old.task.is_general() && !carried.contains(&old.task) {
                warn!(task = %old.task, version = %old.version, "the task has no head of the new backbone: not served until one is deployed");
                self.registry.deactivate_task(&old.task)?;
            }
        }
        self.active.set(pretrained.clone());
        self.remember_previous(
            &TaskName::general(),
            before.general_version().to_string(),
            pretrained.general_version(),
        )?;
        for ((version, head, meta), task) in staged.into_iter().zip(carried) {
            let old = before.task(task.as_str()).map(|t| t.version.clone());
            self.install(&task, &version, head, meta)?;
            if let Some(old) = old {
                self.remember_previous(&task, old, &version)?;
            }
            self.heads.remove_staged(&version)?;
        }
        self.refresh_floors()?;
        info!(backbone = %backbone, heads = heads.len(), "switched to another backbone");
        Ok(())
    }

    /// Keeps `before` as `task`'s version before `now` when they differ (for label churn).
    fn remember_previous(
        &self,
        task: &TaskName,
        before: String,
        now: &str,
    ) -> Result<(), InferenceError> {
        if before != now {
            let mut previous = lock(&self.previous);
            previous.insert(task.to_string(), before);
            self.heads.write_previous(&previous)?;
        }
        Ok(())
    }
}

fn task_model(task: &TaskName, version: String, head: HeadWeights) -> TaskModel {
    TaskModel {
        task: task.clone(),
        version,
        head: Some(Arc::new(head)),
        floor: None,
    }
}

/// Records the pretrained model's version as the general task's (unless another node of a
/// shared catalog did); it becomes this node's active general version when it has none.
fn register_pretrained(registry: &dyn Catalog, model: &ActiveModel) -> Result<(), InferenceError> {
    let version = model.general_version();
    if registry.model(version)?.is_none() {
        let info = model.info();
        let registered = registry.register_model(&ModelVersion {
            id: version.to_string(),
            task: TaskName::general(),
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
    if registry.active_model(&TaskName::general())?.is_none() {
        registry.set_active_model(version)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
