//! `ndpipe serve`: boots the embedded store and serves the HTTP API until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;

use ndpipe_catalog::{Catalog, ModelVersion, SqliteCatalog};
use ndpipe_model::{
    Codec, ExecutionProvider, InferenceBackend, OrtBackend, PreprocessConfig, RuntimeConfig,
};
use ndpipe_store::grpc::PipeStoreNode;
use ndpipe_store::http::{self, AppState, HttpConfig};
use ndpipe_store::jobs::Jobs;
use ndpipe_store::labeler::{ActiveModel, Labeler, LabelerConfig, SharedModel};
use ndpipe_tuner::coordinator::Coordinator;
use ndpipe_tuner::nodes::Nodes;
use ndpipe_tuner::versions::Versions;

use crate::grpc;
use ndpipe_store::metrics::StoreMetrics;
use ndpipe_store::relabel::RelabelOptions;
use ndpipe_store::{IngestConfig, Ingestor, PhotoStore, StoreConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

/// Flags of `ndpipe serve` (each also readable from an `NDPIPE_*` environment variable).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Data directory: volumes, index and catalog live here.
    #[arg(long, env = "NDPIPE_DATA", default_value = "data")]
    pub data: PathBuf,
    /// Address to listen on for the HTTP API.
    #[arg(long, env = "NDPIPE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Bearer token required for writes and admin calls (unset: no token needed).
    #[arg(
        long,
        env = "NDPIPE_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// File holding the bearer token (first line).
    #[arg(long, env = "NDPIPE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Largest accepted upload, in bytes.
    #[arg(long, env = "NDPIPE_MAX_UPLOAD_BYTES", default_value_t = http::DEFAULT_MAX_UPLOAD_BYTES)]
    pub max_upload_bytes: usize,
    /// Largest accepted image, in pixels (width * height), checked before decoding.
    #[arg(long, env = "NDPIPE_MAX_PIXELS", default_value_t = PreprocessConfig::default().max_pixels)]
    pub max_pixels: u64,
    /// Volume files are sealed at this size, in bytes.
    #[arg(long, env = "NDPIPE_MAX_VOLUME_BYTES", default_value_t = StoreConfig::default().max_volume_bytes)]
    pub max_volume_bytes: u64,
    /// Compression of stored tensors: zstd, deflate or none.
    #[arg(long, env = "NDPIPE_TENSOR_CODEC", default_value = "zstd")]
    pub tensor_codec: String,
    /// Compression level of stored tensors (zstd 1..=22, deflate 0..=9).
    #[arg(long, env = "NDPIPE_TENSOR_LEVEL", default_value_t = 3)]
    pub tensor_level: i32,
    /// Photos decoded at once (default: one per CPU core).
    #[arg(long, env = "NDPIPE_DECODE_THREADS")]
    pub decode_threads: Option<usize>,
    /// Folder with the model: model.json, the ONNX file and the class names (made by `make setup`).
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library (default: MODEL_DIR/lib/libonnxruntime.so).
    #[arg(long, env = "NDPIPE_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// Run without a model: photos are stored but not labelled until a re-labelling with one.
    #[arg(long)]
    pub no_model: bool,
    /// Threads per model run (0: ONNX Runtime decides).
    #[arg(long, env = "NDPIPE_INTRA_THREADS", default_value_t = 0)]
    pub intra_threads: usize,
    /// Largest batch per model run.
    #[arg(long, env = "NDPIPE_MAX_BATCH", default_value_t = 32)]
    pub max_batch: usize,
    /// Where inference runs: cpu, cuda or tensorrt.
    #[arg(long, env = "NDPIPE_EXECUTION_PROVIDER", default_value = "cpu")]
    pub execution_provider: String,
    /// Longest wait, in ms, for concurrent uploads to fill an online-labelling batch.
    #[arg(long, env = "NDPIPE_LABEL_WAIT_MS", default_value_t = 5)]
    pub label_wait_ms: u64,
    /// Address of this node's gRPC service for the Tuner (port 0 picks a free one).
    #[arg(long, env = "NDPIPE_GRPC_LISTEN", default_value = "127.0.0.1:0")]
    pub grpc_listen: SocketAddr,
    /// URL the Tuner uses to reach this node's gRPC service (default: http://GRPC_LISTEN).
    #[arg(long, env = "NDPIPE_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// The name this node registers with; the same name keeps its node id across restarts.
    #[arg(long, env = "NDPIPE_NODE_NAME")]
    pub name: Option<String>,
    /// The Tuner's gRPC URL to register with (`ndpipe pipestore`); `ndpipe serve` runs its own.
    #[arg(long, env = "NDPIPE_TUNER")]
    pub tuner: Option<String>,
    /// Testing only: damage the first N feature chunks sent to the Tuner (their checksum then
    /// fails and the Tuner must fetch them again).
    #[arg(long, hide = true, default_value_t = 0)]
    pub fault_corrupt_chunks: u32,
}

impl ServeArgs {
    /// Defaults for a data directory and address, as the CLI would parse them.
    pub fn new(data: PathBuf, listen: SocketAddr) -> Self {
        ServeArgs {
            data,
            listen,
            token: None,
            token_file: None,
            max_upload_bytes: http::DEFAULT_MAX_UPLOAD_BYTES,
            max_pixels: PreprocessConfig::default().max_pixels,
            max_volume_bytes: StoreConfig::default().max_volume_bytes,
            tensor_codec: "zstd".into(),
            tensor_level: 3,
            decode_threads: None,
            model_dir: PathBuf::from(".cache/model"),
            ort_lib: None,
            no_model: true,
            intra_threads: 0,
            max_batch: 32,
            execution_provider: "cpu".into(),
            label_wait_ms: 5,
            grpc_listen: "127.0.0.1:0".parse().expect("a valid address"),
            advertise_url: None,
            name: None,
            tuner: None,
            fault_corrupt_chunks: 0,
        }
    }

    fn load_model(&self) -> Result<ActiveModel> {
        let execution_provider = match self.execution_provider.as_str() {
            "cpu" => ExecutionProvider::Cpu,
            "cuda" => ExecutionProvider::Cuda,
            "tensorrt" => ExecutionProvider::TensorRt,
            other => {
                anyhow::bail!("unknown execution provider {other:?}: use cpu, cuda or tensorrt")
            }
        };
        let config = RuntimeConfig {
            dylib: self
                .ort_lib
                .clone()
                .unwrap_or_else(|| self.model_dir.join("lib/libonnxruntime.so")),
            intra_threads: self.intra_threads,
            max_batch: self.max_batch,
            execution_provider,
        };
        let backend = OrtBackend::load(&self.model_dir, &config).with_context(|| {
            format!(
                "loading the model from {} (run `make setup`, or pass --model-dir, or --no-model to store photos without labels)",
                self.model_dir.display()
            )
        })?;
        let version = ActiveModel::pretrained_version(backend.info());
        Ok(ActiveModel {
            backend: Arc::new(backend),
            version,
            head: None,
        })
    }

    fn codec(&self) -> Result<Codec> {
        Ok(match self.tensor_codec.as_str() {
            "zstd" => Codec::Zstd {
                level: self.tensor_level,
            },
            "deflate" => Codec::Deflate {
                level: u32::try_from(self.tensor_level)
                    .context("deflate level must be 0..=9")?
                    .min(9),
            },
            "none" => Codec::None,
            other => anyhow::bail!("unknown tensor codec {other:?}: use zstd, deflate or none"),
        })
    }

    fn token(&self) -> Result<Option<String>> {
        match (&self.token, &self.token_file) {
            (Some(t), _) => Ok(Some(t.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading token file {}", path.display()))?;
                let token = text.lines().next().unwrap_or("").trim().to_string();
                anyhow::ensure!(!token.is_empty(), "token file {} is empty", path.display());
                Ok(Some(token))
            }
            (None, None) => Ok(None),
        }
    }
}

/// A server started in this process.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<()>>,
    jobs: Arc<Jobs>,
}

impl Running {
    /// Stops accepting requests, drains those in flight and closes the store.
    pub async fn stop(self) -> Result<()> {
        let _ = self.shutdown.send(true);
        self.task.await.context("server task failed")??;
        let jobs = self.jobs;
        tokio::task::spawn_blocking(move || jobs.shutdown()).await?;
        Ok(())
    }
}

/// Boots the store: open volumes and index (recovering from a crash), open the catalog, reconcile
/// them, then serve HTTP on `args.listen`.
pub async fn start(args: &ServeArgs) -> Result<Running> {
    let data = args.data.clone();
    info!(data = %data.display(), listen = %args.listen, token = args.token.is_some() || args.token_file.is_some(), "starting ndpipe serve");
    let store_config = StoreConfig {
        max_volume_bytes: args.max_volume_bytes,
    };
    let store_dir = data.join("store");
    let (store, recovery) =
        tokio::task::spawn_blocking(move || PhotoStore::open(&store_dir, &store_config))
            .await?
            .with_context(|| {
                format!(
                    "opening the photo store in {}",
                    data.join("store").display()
                )
            })?;
    info!(?recovery, "photo store ready");
    let catalog_path = args.data.join("catalog.sqlite");
    let catalog: Arc<dyn Catalog> = Arc::new(
        SqliteCatalog::open(&catalog_path)
            .with_context(|| format!("opening the catalog {}", catalog_path.display()))?,
    );
    let store = Arc::new(store);
    let ingest_config = IngestConfig {
        preprocess: PreprocessConfig {
            max_pixels: args.max_pixels,
            ..PreprocessConfig::default()
        },
        tensor_codec: args.codec()?,
        max_parallel_decodes: args
            .decode_threads
            .unwrap_or_else(|| IngestConfig::default().max_parallel_decodes),
    };
    let metrics = Arc::new(StoreMetrics::default());
    let model = if args.no_model {
        info!("no model: photos are stored without labels");
        None
    } else {
        let a = args.clone();
        let model = tokio::task::spawn_blocking(move || a.load_model()).await??;
        register_model(&*catalog, &model)?;
        info!(version = %model.version, backbone = %model.info().backbone_version, "model loaded");
        Some(SharedModel::new(model))
    };
    let node = match &model {
        Some(shared) => Some(Arc::new(
            PipeStoreNode::new(
                store.clone(),
                catalog.clone(),
                shared.clone(),
                args.data.join("heads"),
            )
            .map_err(|s| anyhow::anyhow!("starting the PipeStore service: {}", s.message()))?
            .with_corrupt_chunks(args.fault_corrupt_chunks),
        )),
        None => None,
    };
    let mut ingestor = Ingestor::new(store.clone(), catalog.clone(), ingest_config);
    if let Some(model) = &model {
        let labeler_config = LabelerConfig {
            max_batch: args.max_batch,
            max_wait: Duration::from_millis(args.label_wait_ms),
            ..LabelerConfig::default()
        };
        let labeler = Labeler::start(
            model.clone(),
            store.clone(),
            catalog.clone(),
            metrics.clone(),
            labeler_config,
        )
        .context("starting the labelling thread")?;
        ingestor = ingestor.with_labeler(labeler);
    }
    let ingestor = Arc::new(ingestor);
    let reconciled = ingestor
        .reconcile()
        .await
        .context("reconciling the catalog with the store")?;
    info!(?reconciled, "catalog reconciled");
    let relabel = RelabelOptions {
        batch: args.max_batch,
        ..RelabelOptions::default()
    };
    let jobs = Arc::new(Jobs::new(store.clone(), catalog, model, relabel));
    let resumer = jobs.clone();
    if let Some(id) = tokio::task::spawn_blocking(move || resumer.resume_interrupted()).await?? {
        info!(job = %id, "resumed an interrupted job");
    }
    metrics
        .photos
        .set(i64::try_from(store.len()?).unwrap_or(i64::MAX));
    let http_config = HttpConfig {
        max_upload_bytes: args.max_upload_bytes,
        token: args.token()?,
    };
    let mut app = http::router(
        AppState::new(ingestor, jobs.clone(), metrics, &http_config),
        &http_config,
    );
    let (shutdown, stopped) = watch::channel(false);
    if let Some(node) = node {
        let embedded = args.tuner.is_none();
        let tuner = if embedded {
            let versions = Versions::open(&args.data.join("tuner"))
                .context("opening the Tuner's model registry")?;
            Some(Arc::new(
                Coordinator::new(Arc::new(Nodes::default()), versions)
                    .with_backbone(node.backbone()),
            ))
        } else {
            None
        };
        let grpc_url = grpc::start(
            args,
            node.clone(),
            tuner.as_ref().map(|t| t.nodes_handle()),
            stopped.clone(),
        )
        .await?;
        match &tuner {
            Some(t) => {
                let id = t
                    .nodes_handle()
                    .register(&node_name(args), &grpc_url)
                    .map_err(|s| anyhow::anyhow!(s.message().to_string()))?;
                node.set_node_id(id);
                app = app.merge(ndpipe_tuner::api::router(
                    t.clone(),
                    http_config.token.clone(),
                ));
            }
            None => grpc::register_until_done(args, node.clone(), grpc_url, stopped.clone()),
        }
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mut stopped = stopped;
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
            .context("HTTP server failed")
    });
    info!(%addr, "listening");
    Ok(Running {
        addr,
        shutdown,
        task,
        jobs,
    })
}

/// The name this node registers with.
pub fn node_name(args: &ServeArgs) -> String {
    args.name.clone().unwrap_or_else(|| {
        let dir = std::fs::canonicalize(&args.data).unwrap_or_else(|_| args.data.clone());
        format!(
            "pipestore-{}",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("data")
        )
    })
}

/// Records the loaded model version in the catalog; it becomes active when none is.
fn register_model(catalog: &dyn Catalog, model: &ActiveModel) -> Result<()> {
    let models = catalog.models()?;
    if !models.iter().any(|m| m.id == model.version) {
        let info = model.info();
        catalog.register_model(&ModelVersion {
            id: model.version.clone(),
            backbone: info.backbone_version.clone(),
            parent: None,
            metrics: serde_json::json!({"head": "pretrained", "name": info.name, "classes": info.num_classes}),
            created_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            active: !models.iter().any(|m| m.active),
        })?;
    }
    Ok(())
}

/// `ndpipe serve`: runs until Ctrl-C or SIGTERM.
pub async fn run(args: ServeArgs) -> Result<()> {
    let running = start(&args).await?;
    println!("ndpipe listening on http://{}", running.addr);
    wait_for_signal().await;
    info!("shutting down");
    running.stop().await
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
