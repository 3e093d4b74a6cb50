//! The facade: [`Tuner`], the one entry point of the crate.

use std::sync::Arc;

use ndpipe_catalog::{AccessKeys, ModelVersion, NodeState, TaskHit, TaskName};
use ndpipe_model::{InferenceBackend, OrtBackend};
use ndpipe_util::fs::read_secret;

use crate::control::Core;
use crate::jobs::JobView;
use crate::server::{self, Running};
use crate::{
    BackboneUpload, BackboneView, Config, DeployReport, FinetuneReport, FinetuneRequest, NodeView,
    RolloutReport, TunerError, api,
};

/// The Tuner: the registered PipeStores, the model registry, and the jobs over them (one at a
/// time: a fine-tuning job or a deploy), each running in the background.
///
/// Standalone (`ndpipe tuner`): [`Tuner::open`], then [`Tuner::start`]. Embedded in a PipeStore
/// process (`ndpipe serve`): [`Tuner::open`], [`Tuner::with_backbone`], then serve
/// [`Tuner::http_router`] and [`Tuner::grpc_routes`] with the PipeStore's own servers; the
/// PipeStore joins over gRPC like any other.
///
/// Jobs: [`Tuner::submit_finetune`] and [`Tuner::submit_deploy`] start one and return at once
/// (the HTTP API's 202); [`Tuner::finetune`] and [`Tuner::deploy`] start one and wait for its
/// report (in-process callers, benchmarks). Either way the job runs in a task of its own, so
/// dropping the caller's future never cancels it, and it shows in [`Tuner::jobs`].
pub struct Tuner {
    core: Arc<Core>,
    token: Option<Arc<str>>,
    backbone_upload_limit: usize,
}

impl Tuner {
    /// Opens the registry in `config.data` (creating it; a job that was running when the Tuner
    /// stopped is resumed from its checkpoints, or failed with the reason it cannot be: see
    /// `resume.rs`; resuming needs a Tokio runtime), loads `config.model_dir`'s backbone when set (with
    /// `config.intra_threads`), and reads the bearer token (`config.token`, else the first line
    /// of `config.token_file`). Nodes registered before are known again; their leases say
    /// whether they are live.
    pub fn open(config: &Config) -> Result<Tuner, TunerError> {
        let token = match (&config.token, &config.token_file) {
            (Some(token), _) => Some(token.as_str().into()),
            (None, Some(path)) => Some(
                read_secret(path)
                    .map_err(|source| TunerError::Io {
                        path: path.clone(),
                        source,
                    })?
                    .into(),
            ),
            (None, None) => None,
        };
        let backbone =
            match &config.model_dir {
                Some(dir) => Some(Arc::new(OrtBackend::load(dir, &config.runtime())?)
                    as Arc<dyn InferenceBackend>),
                None => None,
            };
        let (core, unfinished) = Core::open(config, backbone)?;
        let core = Arc::new(core);
        core.resume(unfinished)?;
        Ok(Tuner {
            core,
            token,
            backbone_upload_limit: upload_limit(config.max_backbone_bytes),
        })
    }

    /// Gives the Tuner a backbone, for conventional mode (the embedded Tuner shares the
    /// PipeStore's); replaces one loaded from `model_dir`.
    pub fn with_backbone(self, backbone: Arc<dyn InferenceBackend>) -> Tuner {
        self.core.set_backbone(backbone);
        self
    }

    /// The operators' HTTP API under `/v1/tuner` (nodes, versions, jobs, finetune, deploy). It
    /// checks no credentials itself: serve it behind the PipeStores' access guard (reads need a
    /// key once keys exist, writes an admin key or the token), as `ndpipe serve` does by
    /// merging it into its own router and [`Tuner::start`] does with the guard it is given.
    /// The router holds a clone of the `Arc`.
    pub fn http_router(self: &Arc<Self>) -> axum::Router {
        api::http::router(self.clone())
    }

    /// The bearer token (`config.token`, else `config.token_file`'s): an admin key.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The access keys of the Tuner's catalog (the cluster's, on a shared PostgreSQL catalog),
    /// for the guard of its HTTP API.
    pub fn access_keys(&self) -> Arc<dyn AccessKeys> {
        self.core.keys.clone()
    }

    /// Whether the Tuner's gRPC runs without a cluster secret and without mutual TLS, open to
    /// anyone who reaches it (`/healthz` says so).
    pub fn insecure_cluster(&self) -> bool {
        self.core.secret.is_none() && self.core.tls.is_none()
    }

    /// The Tuner's gRPC service (PipeStores `Register` and `Heartbeat` with it), for a server
    /// the caller runs: add it to a `tonic` server with `add_routes`, or merge it with other
    /// services' `Routes::add_service`.
    pub fn grpc_routes(&self) -> tonic::service::Routes {
        api::grpc::routes(self.core.clone())
    }

    /// Registers (or re-registers) a PipeStore whose gRPC service is at `grpc_url`, as its
    /// `Register` call would, with a lease of `node_lease_ms` that this call does not renew;
    /// the same name keeps its id. Returns the node id. Needs a Tokio runtime (the connection
    /// is made lazily, on first use).
    pub fn register_node(&self, name: &str, grpc_url: &str) -> Result<u32, TunerError> {
        Ok(self.core.nodes.register(name, grpc_url, None)?.id)
    }

    /// Starts a fine-tuning job in the background and returns it as it starts. Fails at once
    /// with [`TunerError::Busy`] while another job runs, [`TunerError::InvalidArgument`] for a
    /// bad request, [`TunerError::NoNodes`] (or `NoEligibleNodes`) when no node can take part,
    /// and, from the nodes' inventories, [`TunerError::UnknownTask`] or
    /// [`TunerError::TooFewClasses`].
    pub async fn submit_finetune(&self, req: FinetuneRequest) -> Result<JobView, TunerError> {
        self.core.preflight(&req).await?;
        Ok(self.core.submit_finetune(req)?.0)
    }

    /// Starts a deploy of a registered version (also the rollback) in the background and
    /// returns it as it starts. Fails at once like [`Tuner::submit_finetune`], and with
    /// [`TunerError::UnknownVersion`].
    pub fn submit_deploy(&self, version: &str) -> Result<JobView, TunerError> {
        Ok(self.core.submit_deploy(version)?.0)
    }

    /// Starts a rollout of kept backbone `backbone` (its sha256) in the background and returns
    /// it as it starts: staged on every node, every photo re-extracted and labelled with it,
    /// then committed everywhere. Fails at once like [`Tuner::submit_deploy`], and with
    /// [`TunerError::UnknownBackbone`].
    pub fn submit_rollout(&self, backbone: &str, force: bool) -> Result<JobView, TunerError> {
        Ok(self.core.submit_rollout(backbone, force)?.0)
    }

    /// Fine-tunes a new head from the nodes' features (NDPipe's pipelined runs), records the
    /// version and, when `req.deploy`, deploys it: a job run to its end. Fails with
    /// [`TunerError::Busy`] while another job runs.
    pub async fn finetune(&self, req: FinetuneRequest) -> Result<FinetuneReport, TunerError> {
        self.core.preflight(&req).await?;
        let (_, outcome) = self.core.submit_finetune(req)?;
        outcome.await.map_err(ended)?
    }

    /// Deploys a registered version (two-phase) to the nodes and re-labels the stores: also the
    /// rollback; a job run to its end. Fails with [`TunerError::Busy`] while another job runs.
    pub async fn deploy(&self, version: &str) -> Result<DeployReport, TunerError> {
        let (_, outcome) = self.core.submit_deploy(version)?;
        outcome.await.map_err(ended)?
    }

    /// Verifies a backbone (ONNX Runtime loads it; its input, outputs and dimensions are the
    /// manifest's), keeps it durably under the data directory and records its pretrained
    /// version. Returns it and whether it is new. [`TunerError::InvalidBackbone`] for a file
    /// that does not load as its manifest says.
    pub async fn add_backbone(
        &self,
        upload: BackboneUpload,
    ) -> Result<(BackboneView, bool), TunerError> {
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || core.backbones.add(upload, &core.registry))
            .await
            .map_err(|e| TunerError::Internal(format!("adding a backbone: {e}")))?
    }

    /// Every backbone the Tuner keeps.
    pub fn backbones(&self) -> Result<Vec<BackboneView>, TunerError> {
        self.core.backbones.list()
    }

    /// The largest body of `POST /v1/tuner/backbones`: the base64 of the largest ONNX file
    /// and room for the manifest and class names.
    pub(crate) fn backbone_upload_limit(&self) -> usize {
        self.backbone_upload_limit
    }

    /// Rolls kept backbone `backbone` out to every node: a job run to its end. Fails with
    /// [`TunerError::Busy`] while another job runs.
    pub async fn rollout(&self, backbone: &str, force: bool) -> Result<RolloutReport, TunerError> {
        let (_, outcome) = self.core.submit_rollout(backbone, force)?;
        outcome.await.map_err(ended)?
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<JobView>, TunerError> {
        self.core.jobs.list()
    }

    /// One job; [`TunerError::UnknownJob`] if there is none with that id.
    pub fn job(&self, id: &str) -> Result<JobView, TunerError> {
        self.core.jobs.get(id)
    }

    /// Every model version the registry knows, oldest first.
    pub fn versions(&self) -> Result<Vec<ModelVersion>, TunerError> {
        self.core.registry.list()
    }

    /// Photos of every node labelled `label` by `model`, else by the active version of `task`,
    /// else by every task's active version, best first, each with its node, task and version:
    /// answers from a shared PostgreSQL catalog (a Tuner on SQLite holds no photo rows and finds
    /// none).
    pub fn search(
        &self,
        label: &str,
        (model, task): (Option<&str>, Option<&TaskName>),
        offset: usize,
        limit: usize,
    ) -> Result<Vec<TaskHit>, TunerError> {
        let versions = match (model, task) {
            (Some(v), _) => vec![self.core.registry.get(v)?],
            (None, Some(task)) => vec![self.core.registry.active(task)?.ok_or_else(|| {
                TunerError::InvalidArgument(format!("task {task} has no active version"))
            })?],
            (None, None) => self.core.registry.active_all()?,
        };
        Ok(self
            .core
            .photos
            .search_versions(label, &versions, offset, limit)?)
    }

    /// The registered PipeStores, in id order, with their state, lease and versions.
    pub fn nodes(&self) -> Result<Vec<NodeView>, TunerError> {
        let intent = self.core.registry.intent()?.to_string();
        self.core.nodes.views(Some(&intent))
    }

    /// Drains node `name` (it takes no new work) or makes it active again.
    pub fn set_node_state(&self, name: &str, state: NodeState) -> Result<NodeView, TunerError> {
        self.core.nodes.set_state(name, state)
    }

    /// Forgets node `name`; it must register again to come back (a running PipeStore does so
    /// at its next heartbeat, under a new id). On a replicated cluster, also starts the job
    /// that follows the repair of what the node held, and returns it. Needs a Tokio runtime.
    pub fn remove_node(&self, name: &str) -> Result<Option<JobView>, TunerError> {
        self.core.remove_node(name)
    }

    /// Standalone `ndpipe tuner`: binds `config.listen` (HTTP) and `config.grpc_listen` (gRPC)
    /// and serves both until [`Running::stop`]; `guard` wraps the HTTP router (the access
    /// check; the probes `/healthz` and `/readyz` must stay open). Port 0 picks a free port;
    /// the addresses bound are on [`Running`].
    pub async fn start(
        self: Arc<Self>,
        config: &Config,
        guard: impl FnOnce(axum::Router) -> axum::Router,
    ) -> Result<Running, TunerError> {
        server::serve(
            guard(crate::api::http::standalone(
                self.http_router(),
                self.clone(),
            )),
            (self.grpc_routes(), self.core.tls.as_ref()),
            config,
        )
        .await
    }
}

/// A job's task ended without sending its outcome: it panicked.
fn ended(_: tokio::sync::oneshot::error::RecvError) -> TunerError {
    TunerError::Internal("the job's task ended without a result".into())
}

/// The body limit for ONNX files of at most `max_bytes`: their base64 and 4 MiB for the rest.
fn upload_limit(max_bytes: usize) -> usize {
    max_bytes
        .saturating_add(2)
        .div_ceil(3)
        .saturating_mul(4)
        .saturating_add(4 << 20)
}
