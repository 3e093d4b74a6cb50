//! The PipeStore side of the Tuner protocol, as domain logic ([`NodeError`], not gRPC statuses);
//! [`crate::api::grpc`] adapts it to tonic.
//!
//! Features leave the node, photos never do:
//! - [`plan`]: a job's [`ExtractionPlan`], fixed when extraction starts,
//!   and the tails of its runs that load balancing may give away;
//! - [`pace`]: the job's throttle and bandwidth cap on this node, over all its streams;
//! - [`extract`]: the extraction stream (stored features, or the backbone for photos without),
//!   chunks fetched again, and features a take-over stores back;
//! - [`takeover`]: extracting another node's photos (from its stored features or tensors, or
//!   this node's own copies);
//! - [`heads`]: two-phase head deploys (stage durably, commit idempotently, abort) over
//!   [`Models`];
//! - [`rollout`]: a backbone rollout (stage the file durably, re-extract every photo with it
//!   under its own version with a checkpoint, commit or abort);
//! - [`rollout_share`]: a rollout's load balancing (a slow node gives photos its pass has not
//!   reached to a fast node, which runs the staged backbone and stores the outputs back);
//! - here: the node itself, its inventory and re-labelling after a deploy.

mod carve;
mod error;
mod extract;
mod heads;
mod pace;
mod plan;
mod rollout;
mod rollout_share;
mod takeover;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ndpipe_catalog::{Catalog, ReplicaCatalog, Split, TaskName};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};
use ndpipe_util::sync::lock;

pub(crate) use error::NodeError;
pub(crate) use extract::Events;
pub(crate) use rollout::MAX_BACKBONE_BYTES;

use crate::duplicates::DuplicateSettings;
use crate::inference::ActiveModel;
use crate::inference::backbones::{BackboneDirs, BackboneLoader};
use crate::inference::model::Models;
use crate::inference::{Pending, RelabelOptions, RelabelReport, Relabeler};
use crate::storage::{FeatureStore, PhotoStore};
use plan::ExtractionPlan;

/// Largest gRPC message a node sends or accepts: a chunk of 256 features is about 0.7 MB, a
/// 1000-class head about 5 MB.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// Extraction plans kept for re-fetches and load balancing: the latest jobs' (one job runs at a
/// time; older plans are dropped).
const KEPT_PLANS: usize = 4;

/// The PipeStore side of the Tuner protocol.
pub(crate) struct PipeStoreNode {
    store: Arc<PhotoStore>,
    features: Arc<FeatureStore>,
    catalog: Arc<dyn Catalog>,
    models: Arc<Models>,
    relabel: RelabelOptions,
    node_id: AtomicU32,
    /// The latest jobs' plans, oldest first.
    plans: Mutex<VecDeque<(String, Arc<ExtractionPlan>)>>,
    corrupt_chunks: AtomicU32,
    failing_commits: AtomicU32,
    /// Sent with the calls this node makes to other nodes.
    secret: Option<ClusterSecret>,
    /// Mutual TLS of the calls this node makes to other nodes.
    tls: Option<Tls>,
    /// Where staged and committed backbones are kept.
    backbones: BackboneDirs,
    /// How a staged backbone is loaded.
    loader: BackboneLoader,
    /// The staged backbone, once loaded.
    staged: Mutex<Option<ActiveModel>>,
    /// Held by each phase of a rollout: one at a time.
    rollout: Mutex<()>,
    /// The photos the running rollout pass has yet to read, by backbone, shared with the
    /// load balancing that gives some away.
    rollout_pending: Mutex<Option<(String, Arc<Pending>)>>,
    /// The cluster's replica map and this node's name in it, on a replicated cluster: a
    /// rollout's pass leaves the copies of other nodes' photos to their primaries.
    replicas: Option<(Arc<dyn ReplicaCatalog>, String)>,
    /// How a plan finds the duplicates it keeps on one side of the validation line.
    duplicates: DuplicateSettings,
}

impl PipeStoreNode {
    /// A node over its store, features, catalog and models; `relabel` sets batch size and labels
    /// per photo of re-labellings after deploys and rollouts; rollouts keep backbones in
    /// `backbones` and load them with `loader`.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        features: Arc<FeatureStore>,
        catalog: Arc<dyn Catalog>,
        models: Arc<Models>,
        relabel: RelabelOptions,
        backbones: BackboneDirs,
        loader: BackboneLoader,
    ) -> Self {
        PipeStoreNode {
            store,
            features,
            catalog,
            models,
            relabel,
            node_id: AtomicU32::new(0),
            plans: Mutex::new(VecDeque::new()),
            corrupt_chunks: AtomicU32::new(0),
            failing_commits: AtomicU32::new(0),
            secret: None,
            duplicates: DuplicateSettings::default(),
            tls: None,
            backbones,
            loader,
            staged: Mutex::new(None),
            rollout: Mutex::new(()),
            rollout_pending: Mutex::new(None),
            replicas: None,
        }
    }

    /// Places this node, named `name`, in the replica map `replicas` (none: one copy of each
    /// photo, all this node's).
    pub(crate) fn with_replicas(
        mut self,
        replicas: Option<Arc<dyn ReplicaCatalog>>,
        name: &str,
    ) -> Self {
        self.replicas = replicas.map(|map| (map, name.to_string()));
        self
    }

    /// Makes the calls to other nodes (take-overs) over `tls`.
    /// The same node, keeping duplicates found by `settings` on one side of the validation
    /// line in its plans.
    pub(crate) fn with_duplicates(mut self, settings: DuplicateSettings) -> Self {
        self.duplicates = settings;
        self
    }

    pub(crate) fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// Sends `secret` with the calls this node makes to other nodes (take-overs).
    pub(crate) fn with_cluster_secret(mut self, secret: Option<ClusterSecret>) -> Self {
        self.secret = secret;
        self
    }

    /// Testing only: damages the next `n` chunks sent, so that their checksum fails.
    pub(crate) fn with_corrupt_chunks(self, n: u32) -> Self {
        self.corrupt_chunks.store(n, Ordering::Relaxed);
        self
    }

    /// Testing only: refuses the next `n` head commits.
    pub(crate) fn with_failing_commits(self, n: u32) -> Self {
        self.failing_commits.store(n, Ordering::Relaxed);
        self
    }

    /// The backbone this node runs.
    pub(crate) fn backbone(&self) -> Arc<dyn ndpipe_model::InferenceBackend> {
        self.models.pretrained().backend.clone()
    }

    /// Records the id the Tuner assigned.
    pub(crate) fn set_node_id(&self, id: u32) {
        self.node_id.store(id, Ordering::Relaxed);
    }

    /// The plan of a job whose extraction started on this node (one of the latest).
    fn job(&self, id: &str) -> Result<Arc<ExtractionPlan>, NodeError> {
        lock(&self.plans)
            .iter()
            .find(|(job, _)| job == id)
            .map(|(_, plan)| plan.clone())
            .ok_or_else(|| NodeError::UnknownJob(id.to_string()))
    }

    /// Keeps the plan of job `id` (replacing one of the same id), dropping the oldest beyond
    /// [`KEPT_PLANS`].
    fn keep_plan(&self, id: &str, plan: Arc<ExtractionPlan>) {
        let mut plans = lock(&self.plans);
        plans.retain(|(job, _)| job != id);
        plans.push_back((id.to_string(), plan));
        while plans.len() > KEPT_PLANS {
            plans.pop_front();
        }
    }

    /// What this node holds: the photos labelled for `task` per class and split, its backbone
    /// and the versions it serves.
    pub(crate) fn inventory(&self, task: &str) -> Result<pb::InventoryReply, NodeError> {
        let task: TaskName = match task {
            "" => TaskName::default_task(),
            name => name.parse().map_err(|e: ndpipe_catalog::CatalogError| {
                NodeError::InvalidArgument(e.to_string())
            })?,
        };
        let task_known = self.catalog.task(&task)?.is_some();
        let mut counts: BTreeMap<String, pb::ClassCount> = BTreeMap::new();
        for split in [Split::Train, Split::Val, Split::Test] {
            let labelled = if task_known {
                self.catalog.labelled(&task, split)?
            } else {
                Vec::new()
            };
            for (_, label) in labelled {
                let entry = counts
                    .entry(label.clone())
                    .or_insert_with(|| pb::ClassCount {
                        label,
                        ..Default::default()
                    });
                match split {
                    Split::Train => entry.train += 1,
                    Split::Val => entry.val += 1,
                    Split::Test => entry.test += 1,
                }
            }
        }
        let model = self.models.active().get();
        Ok(pb::InventoryReply {
            node_id: self.node_id.load(Ordering::Relaxed),
            backbone_version: model.info().backbone_version.clone(),
            feature_dim: model.info().feature_dim as u32,
            classes: counts.into_values().collect(),
            active_version: model.serving().to_string(),
            task_known,
        })
    }

    /// Applies the tasks' own floors (an operator may have changed one through another node).
    /// Blocks (catalog).
    pub(crate) fn refresh_floors(&self) -> Result<(), NodeError> {
        Ok(self.models.refresh_floors()?)
    }

    /// The model versions this node serves, one per task, as the protocol reports them.
    pub(crate) fn active_version(&self) -> String {
        self.models.active().get().serving().to_string()
    }

    /// Fails unless `version` is one the node serves.
    pub(crate) fn check_serving(&self, version: &str) -> Result<(), NodeError> {
        let model = self.models.active().get();
        if model.serving_version(version).is_none() {
            return Err(NodeError::NotActive {
                active: model.serving().to_string(),
                requested: version.to_string(),
            });
        }
        Ok(())
    }

    /// Re-labels every photo for the task that `version` serves, which must be active: its head
    /// over stored features after a head was committed, in full (every task, the backbone
    /// again) for the general task; `progress` hears (photos done, photos in all) as it goes.
    /// Churn is measured against the task's version active before. Blocks: call it off the
    /// async runtime.
    pub(crate) fn relabel(
        &self,
        version: &str,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<pb::RelabelReply, NodeError> {
        self.check_serving(version)?;
        let model = self.models.active().get();
        let Some(task) = model.serving_version(version).cloned() else {
            return Err(NodeError::NotActive {
                active: model.serving().to_string(),
                requested: version.to_string(),
            });
        };
        let options = RelabelOptions {
            churn_task: task.task.clone(),
            compare_with: self.models.previous(&task.task),
            ..self.relabel.clone()
        };
        let relabeler = Relabeler {
            store: &self.store,
            catalog: &*self.catalog,
            features: &self.features,
            model: &model,
            options: &options,
        };
        if task.head.is_some() {
            let r = relabeler.run_head(&task, &mut progress)?;
            return Ok(pb::RelabelReply {
                photos: r.photos,
                compared: r.churn.compared,
                changed: r.churn.changed,
                seconds: r.seconds,
                mode: if r.computed == 0 {
                    "head".into()
                } else {
                    "head+backbone".into()
                },
            });
        }
        let report = Mutex::new(RelabelReport::default());
        relabeler.run(&report, &AtomicBool::new(false), |r| {
            progress(r.done, r.total)
        })?;
        let r = lock(&report).clone();
        Ok(pb::RelabelReply {
            photos: r.done,
            compared: r.compared,
            changed: r.changed,
            seconds: r.wall_seconds,
            mode: "full".into(),
        })
    }
}
