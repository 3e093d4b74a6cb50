//! The facade: [`Tuner`], the one entry point of the crate.

use std::sync::Arc;

use ndpipe_catalog::ModelVersion;
use ndpipe_model::{InferenceBackend, OrtBackend, RuntimeConfig};
use ndpipe_util::fs::read_secret;
use tokio::sync::{Mutex, MutexGuard};

use crate::nodes::Nodes;
use crate::registry::Registry;
use crate::server::{self, Running};
use crate::{
    Config, DeployReport, FinetuneReport, FinetuneRequest, NodeView, TunerError, api, deploy,
    finetune,
};

/// The Tuner: the registered PipeStores, the model registry, and the jobs over them (one at a
/// time: a fine-tuning job or a deploy).
///
/// Standalone (`ndpipe tuner`): [`Tuner::open`], then [`Tuner::start`]. Embedded in a PipeStore
/// process (`ndpipe serve`): [`Tuner::open`], [`Tuner::with_backbone`], then serve
/// [`Tuner::http_router`] and [`Tuner::grpc_routes`] with the PipeStore's own servers and
/// [`Tuner::register_node`] the PipeStore.
pub struct Tuner {
    nodes: Arc<Nodes>,
    registry: Registry,
    backbone: Option<Arc<dyn InferenceBackend>>,
    token: Option<Arc<str>>,
    job: Mutex<()>,
}

impl Tuner {
    /// Opens the registry in `config.data` (creating it), loads `config.model_dir`'s backbone
    /// when set (with `config.intra_threads`), and reads the bearer token (`config.token`, else
    /// the first line of `config.token_file`). No node is registered yet.
    pub fn open(config: &Config) -> Result<Tuner, TunerError> {
        let registry = Registry::open(&config.data)?;
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
        let backbone = match &config.model_dir {
            Some(dir) => {
                let runtime = RuntimeConfig {
                    intra_threads: config.intra_threads,
                    ..RuntimeConfig::for_model_dir(dir)
                };
                Some(Arc::new(OrtBackend::load(dir, &runtime)?) as Arc<dyn InferenceBackend>)
            }
            None => None,
        };
        Ok(Tuner {
            nodes: Arc::new(Nodes::default()),
            registry,
            backbone,
            token,
            job: Mutex::new(()),
        })
    }

    /// Gives the Tuner a backbone, for conventional mode (the embedded Tuner shares the
    /// PipeStore's); replaces one loaded from `model_dir`.
    pub fn with_backbone(mut self, backbone: Arc<dyn InferenceBackend>) -> Tuner {
        self.backbone = Some(backbone);
        self
    }

    /// The operators' HTTP API under `/v1/tuner` (nodes, versions, finetune, deploy); the POSTs
    /// need the bearer token when one is configured. The router holds a clone of the `Arc`, so
    /// it can be merged into another server's router (as `ndpipe serve` does).
    pub fn http_router(self: &Arc<Self>) -> axum::Router {
        api::http::router(self.clone(), self.token.clone())
    }

    /// The Tuner's gRPC service (PipeStores `Register` with it), for a server the caller runs:
    /// add it to a `tonic` server with `add_routes`, or merge it with other services'
    /// `Routes::add_service`. It shares this Tuner's node registry.
    pub fn grpc_routes(&self) -> tonic::service::Routes {
        api::grpc::routes(self.nodes.clone())
    }

    /// Registers (or re-registers) a PipeStore whose gRPC service is at `grpc_url`, as its
    /// `Register` call would; the same name keeps its id. Returns the node id. Needs a Tokio
    /// runtime (the connection is made lazily, on first use).
    pub fn register_node(&self, name: &str, grpc_url: &str) -> Result<u32, TunerError> {
        self.nodes.register(name, grpc_url)
    }

    /// Fine-tunes a new head from the nodes' features (NDPipe's pipelined runs), records the
    /// version and, when `req.deploy`, deploys it. Fails with [`TunerError::Busy`] while another
    /// job or deploy runs.
    pub async fn finetune(&self, req: FinetuneRequest) -> Result<FinetuneReport, TunerError> {
        let _job = self.lock_job()?;
        finetune::finetune(&self.nodes, &self.registry, self.backbone.as_ref(), req).await
    }

    /// Deploys a registered version (two-phase) to every node and re-labels the stores: also the
    /// rollback. Fails with [`TunerError::Busy`] while another job or deploy runs.
    pub async fn deploy(&self, version: &str) -> Result<DeployReport, TunerError> {
        let _job = self.lock_job()?;
        deploy::deploy_version(&self.nodes, &self.registry, version).await
    }

    /// Every model version the registry knows, oldest first.
    pub fn versions(&self) -> Result<Vec<ModelVersion>, TunerError> {
        self.registry.list()
    }

    /// The registered PipeStores, in id order.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.nodes.snapshot().iter().map(|n| n.view()).collect()
    }

    /// Standalone `ndpipe tuner`: binds `config.listen` (HTTP) and `config.grpc_listen` (gRPC)
    /// and serves both until [`Running::stop`]. Port 0 picks a free port; the addresses bound are
    /// on [`Running`].
    pub async fn start(self: Arc<Self>, config: &Config) -> Result<Running, TunerError> {
        server::serve(
            self.http_router(),
            self.grpc_routes(),
            config.listen,
            config.grpc_listen,
        )
        .await
    }

    fn lock_job(&self) -> Result<MutexGuard<'_, ()>, TunerError> {
        self.job.try_lock().map_err(|_| TunerError::Busy)
    }
}
