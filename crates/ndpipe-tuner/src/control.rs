//! The control plane's shared state ([`Core`]): the node registry, the model registry, the jobs,
//! the job lock (one fine-tuning job or deploy at a time) and the syncer; and how a job is
//! submitted: checked at once (a bad request, no node, another job running), then run in a task
//! of its own that holds the job lock until it ends, however it ends. A job taken up again after a
//! restart ([`crate::resume`]) runs through the same functions.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ndpipe_catalog::{AccessKeys, PhotoCatalog, ReplicaCatalog};
use ndpipe_model::InferenceBackend;
use ndpipe_proto::transport::{ClusterSecret, Tls};
use ndpipe_util::fs::read_secret;
use ndpipe_util::sync::{read, write};
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, oneshot};
use tracing::info;

use crate::backbones::BackboneFiles;
use crate::backbones::Backbones;
use crate::jobs::{JobKind, JobResult, JobView, Jobs, Progress};
use crate::nodes::{Members, Nodes};
use crate::registry::Registry;
use crate::repair;
use crate::{
    Config, DeployReport, FinetuneReport, FinetuneRequest, Mode, RolloutReport, TunerError, deploy,
    failover, rollout,
};
use rollout::RolloutOptions;

/// The node name of the Tuner's own rows (jobs, the version it means every node to serve) in a
/// catalog shared with the PipeStores.
const TUNER_NODE: &str = "tuner";

/// What a job works with.
pub(crate) struct JobEnv<'a> {
    pub(crate) nodes: &'a Nodes,
    pub(crate) registry: &'a Registry,
    pub(crate) progress: &'a Progress,
    /// How far below its parent a new version's validation top-1 may fall and still deploy.
    pub(crate) deploy_margin: f32,
    /// A rollout's pause between two nodes' commits (zero: all at once).
    pub(crate) commit_interval: Duration,
}

/// The Tuner's state, shared by its APIs and its job tasks.
pub(crate) struct Core {
    pub(crate) nodes: Nodes,
    pub(crate) registry: Registry,
    /// The backbones kept for rollouts.
    pub(crate) backbones: Backbones,
    pub(crate) jobs: Arc<Jobs>,
    /// The photo rows of the catalog: on a shared PostgreSQL catalog, every node's (search).
    pub(crate) photos: Arc<dyn PhotoCatalog>,
    /// The replica map, on a shared PostgreSQL catalog: a fine-tune that loses a node passes
    /// its photos to their copies.
    pub(crate) replicas: Option<Arc<dyn ReplicaCatalog>>,
    /// Required of every call to the Tuner's gRPC service, and sent with every call it makes.
    pub(crate) secret: Option<ClusterSecret>,
    /// Mutual TLS of the Tuner's gRPC server and of its calls to the nodes.
    pub(crate) tls: Option<Tls>,
    /// The access keys of the catalog (the cluster's, on a shared PostgreSQL catalog), which
    /// the guard of the HTTP API checks.
    pub(crate) keys: Arc<dyn AccessKeys>,
    backbone: RwLock<Option<Arc<dyn InferenceBackend>>>,
    lock: Arc<Mutex<()>>,
    /// Wakes the syncer, which brings lagging nodes to the active version.
    pub(crate) sync_wake: Arc<Notify>,
    pub(crate) sync_started: AtomicBool,
    /// How long a repair job waits for progress before it fails.
    repair_stall: Duration,
    /// The quality gate's default margin.
    deploy_margin: f32,
    /// A rollout's pause between two nodes' commits.
    commit_interval: Duration,
}

/// A job's outcome, for an in-process caller that waits for it.
pub(crate) type Outcome<T> = oneshot::Receiver<Result<T, TunerError>>;

impl Core {
    /// Opens (creating) `config.data`: `registry.sqlite` (model versions, jobs, nodes) and
    /// `heads/`; returns it with the jobs that were running when the Tuner stopped (for
    /// [`Core::resume`]). Reads the cluster secret from `config.cluster_secret_file`, when set.
    pub(crate) fn open(
        config: &Config,
        backbone: Option<Arc<dyn InferenceBackend>>,
    ) -> Result<(Self, Vec<JobView>), TunerError> {
        std::fs::create_dir_all(&config.data).map_err(|source| TunerError::Io {
            path: config.data.clone(),
            source,
        })?;
        let secret = match &config.cluster_secret_file {
            Some(path) => {
                ClusterSecret::new(&read_secret(path).map_err(|source| TunerError::Io {
                    path: path.clone(),
                    source,
                })?)
            }
            None => None,
        };
        let spec = config.catalog.as_deref().unwrap_or_default();
        let opened = ndpipe_catalog::open(spec, TUNER_NODE, &config.data.join("registry.sqlite"))?;
        info!(catalog = %ndpipe_catalog::describe(spec, &config.data.join("registry.sqlite")), "Tuner catalog open");
        let catalog = opened.catalog;
        let tls = Tls::from_files(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            config.tls_ca.as_deref(),
        )
        .map_err(|e| TunerError::InvalidArgument(e.to_string()))?;
        let nodes = Nodes::new(
            opened.nodes,
            Duration::from_millis(config.node_lease_ms.max(1)),
            Duration::from_millis(config.node_timeout_ms.max(1)),
            secret.clone(),
            tls.clone(),
        );
        let (jobs, unfinished) = Jobs::open(catalog.clone())?;
        let core = Core {
            nodes,
            registry: Registry::open(&config.data, catalog.clone())?,
            backbones: Backbones::open(&config.data, config.runtime(), config.max_backbone_bytes)?,
            jobs: Arc::new(jobs),
            keys: catalog.clone(),
            photos: catalog,
            replicas: opened.replicas,
            secret,
            tls,
            backbone: RwLock::new(backbone),
            lock: Arc::new(Mutex::new(())),
            sync_wake: Arc::new(Notify::new()),
            sync_started: AtomicBool::new(false),
            repair_stall: Duration::from_millis(config.repair_stall_ms),
            deploy_margin: config.deploy_margin,
            commit_interval: Duration::from_millis(config.rollout_commit_interval_ms),
        };
        Ok((core, unfinished))
    }

    /// Forgets node `name`; on a replicated cluster, starts the job that follows the repair of
    /// what it held (its view; `None` without replication).
    pub(crate) fn remove_node(self: &Arc<Self>, name: &str) -> Result<Option<JobView>, TunerError> {
        let wanted = self.nodes.wanted_copies();
        self.nodes.remove(name)?;
        let Some(catalog) = self.replicas.clone().filter(|_| wanted >= 2) else {
            return Ok(None);
        };
        let request = serde_json::json!({ "node": name, "replicas": wanted });
        let progress = self.jobs.start(JobKind::Repair, request, Vec::new())?;
        let view = progress.view()?;
        self.follow_repair(catalog, progress, name.to_string(), wanted);
        Ok(Some(view))
    }

    /// Follows the repair after node `node`'s removal (to `wanted` copies) in a task of its own,
    /// reporting on `progress`.
    pub(crate) fn follow_repair(
        &self,
        catalog: Arc<dyn ReplicaCatalog>,
        progress: Progress,
        node: String,
        wanted: u32,
    ) {
        let stall = self.repair_stall;
        tokio::spawn(async move {
            let outcome = repair::follow(catalog, &progress, node, wanted, stall).await;
            progress.finish(outcome.as_ref().map(|r| JobResult::Repair(r.clone())));
        });
    }

    /// Replaces the Tuner's own backbone (for conventional mode).
    pub(crate) fn set_backbone(&self, backbone: Arc<dyn InferenceBackend>) {
        *write(&self.backbone) = Some(backbone);
    }

    /// The job lock, or [`TunerError::Busy`].
    pub(crate) fn try_lock(&self) -> Result<OwnedMutexGuard<()>, TunerError> {
        self.lock
            .clone()
            .try_lock_owned()
            .map_err(|_| TunerError::Busy)
    }

    /// The nodes a job may use now; none is [`TunerError::NoNodes`].
    pub(crate) fn members(&self) -> Result<Members, TunerError> {
        let intent = self.registry.intent()?.to_string();
        let members = self.nodes.members(Some(&intent))?;
        if members.nodes.is_empty() {
            return Err(if members.skipped.is_empty() {
                TunerError::NoNodes
            } else {
                TunerError::NoEligibleNodes(members.skipped.join("; "))
            });
        }
        Ok(members)
    }

    /// What can be known of a fine-tune before it starts: the request holds together, and the
    /// nodes that would take part know its task and hold training photos of two classes of it.
    pub(crate) async fn preflight(&self, req: &FinetuneRequest) -> Result<(), TunerError> {
        req.check()?;
        let members = self.members()?;
        crate::finetune::survey_check(&members.nodes, req).await
    }

    /// Checks `req`, then runs the fine-tuning job in the background.
    pub(crate) fn submit_finetune(
        self: &Arc<Self>,
        req: FinetuneRequest,
    ) -> Result<(JobView, Outcome<FinetuneReport>), TunerError> {
        req.check()?;
        let guard = self.try_lock()?;
        self.conventional(&req)?;
        let members = self.members()?;
        let request = serde_json::to_value(&req).unwrap_or_default();
        let progress = self
            .jobs
            .start(JobKind::Finetune, request, members.skipped.clone())?;
        self.run_finetune(guard, progress, members, req)
    }

    /// The Tuner's backbone for a conventional-mode `req` (`None` in near-data mode), or why
    /// there is none.
    fn conventional(
        &self,
        req: &FinetuneRequest,
    ) -> Result<Option<Arc<dyn InferenceBackend>>, TunerError> {
        match req.mode {
            Mode::NearData => Ok(None),
            Mode::Conventional => read(&self.backbone).clone().map(Some).ok_or_else(|| {
                TunerError::InvalidArgument(
                    "conventional mode needs a backbone on the Tuner (--model-dir)".into(),
                )
            }),
        }
    }

    /// Runs fine-tune `req` over `members` in the background, reporting on `progress`, holding
    /// the job lock (`guard`).
    pub(crate) fn run_finetune(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<()>,
        progress: Progress,
        members: Members,
        req: FinetuneRequest,
    ) -> Result<(JobView, Outcome<FinetuneReport>), TunerError> {
        let conventional = self.conventional(&req)?;
        let wrap = |r: &FinetuneReport| JobResult::Finetune(Box::new(r.clone()));
        self.spawn_job(guard, progress, wrap, move |core, progress| async move {
            let env = core.env(&progress);
            failover::finetune_surviving(&env, core.replicas.as_ref(), members, conventional, req)
                .await
        })
    }

    /// Checks that `version` is registered, then deploys it in the background.
    pub(crate) fn submit_deploy(
        self: &Arc<Self>,
        version: &str,
    ) -> Result<(JobView, Outcome<DeployReport>), TunerError> {
        let guard = self.try_lock()?;
        let record = self.registry.get(version)?;
        let head = self.registry.head(version)?;
        let members = self.members()?;
        let request = serde_json::json!({ "version": version });
        let progress = self
            .jobs
            .start(JobKind::Deploy, request, members.skipped.clone())?;
        let wrap = |r: &DeployReport| JobResult::Deploy(r.clone());
        self.spawn_job(guard, progress, wrap, move |core, progress| async move {
            deploy::deploy(&core.env(&progress), &members, &record, head.as_ref()).await
        })
    }

    /// Checks that `backbone` is kept, then rolls it out in the background, carrying every
    /// task's head to it (`force`: even when a task's cannot be).
    pub(crate) fn submit_rollout(
        self: &Arc<Self>,
        backbone: &str,
        force: bool,
    ) -> Result<(JobView, Outcome<RolloutReport>), TunerError> {
        let guard = self.try_lock()?;
        let files = self.backbones.files(backbone)?;
        let members = self.members()?;
        let request =
            serde_json::json!({ "backbone": backbone, "version": files.version, "force": force });
        let progress = self
            .jobs
            .start(JobKind::Rollout, request, members.skipped.clone())?;
        let options = RolloutOptions {
            force,
            resumed: false,
        };
        self.run_rollout(guard, progress, (files, members), options)
    }

    /// Rolls `files` out to `members` in the background, reporting on `progress`, holding the
    /// job lock (`guard`).
    pub(crate) fn run_rollout(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<()>,
        progress: Progress,
        (files, members): (BackboneFiles, Members),
        options: RolloutOptions,
    ) -> Result<(JobView, Outcome<RolloutReport>), TunerError> {
        let wrap = |r: &RolloutReport| JobResult::Rollout(r.clone());
        self.spawn_job(guard, progress, wrap, move |core, progress| async move {
            let replicas = core.replicas.clone();
            rollout::rollout(
                &core.env(&progress),
                &members,
                &files,
                replicas.as_ref(),
                options,
            )
            .await
        })
    }

    /// What a job of this Tuner works with, reporting on `progress`.
    fn env<'a>(&'a self, progress: &'a Progress) -> JobEnv<'a> {
        JobEnv {
            nodes: &self.nodes,
            registry: &self.registry,
            progress,
            deploy_margin: self.deploy_margin,
            commit_interval: self.commit_interval,
        }
    }

    /// Runs `job` in a task of its own that holds the job lock (`guard`) until it ends, then
    /// records its outcome (its report `wrap`ped) on `progress`; returns the job as it starts.
    fn spawn_job<T, Fut>(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<()>,
        progress: Progress,
        wrap: fn(&T) -> JobResult,
        job: impl FnOnce(Arc<Core>, Progress) -> Fut,
    ) -> Result<(JobView, Outcome<T>), TunerError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, TunerError>> + Send + 'static,
    {
        let view = progress.view()?;
        let (tx, rx) = oneshot::channel();
        let core = self.clone();
        let running = job(core.clone(), progress.clone());
        tokio::spawn(async move {
            let outcome = running.await;
            core.ended(guard, progress, outcome.as_ref().map(wrap));
            let _ = tx.send(outcome);
        });
        Ok((view, rx))
    }

    /// Releases the job lock, records the job's outcome, and wakes the syncer (a deploy may
    /// have left nodes behind). The lock goes first: a client that sees the job ended can start
    /// the next one at once.
    fn ended(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<()>,
        progress: Progress,
        outcome: Result<JobResult, &TunerError>,
    ) {
        drop(guard);
        progress.finish(outcome);
        self.wake_sync();
    }
}
