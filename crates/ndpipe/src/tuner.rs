//! `ndpipe tuner`: the training server and coordinator of many `ndpipe pipestore` processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use ndpipe_model::{ExecutionProvider, OrtBackend, RuntimeConfig};
use ndpipe_proto::pb::tuner_server::TunerServer;
use ndpipe_tuner::coordinator::Coordinator;
use ndpipe_tuner::nodes::{Nodes, TunerService};
use ndpipe_tuner::versions::Versions;
use tokio::net::TcpListener;
use tracing::info;

/// Flags of `ndpipe tuner`.
#[derive(Debug, Args)]
pub struct TunerArgs {
    /// Data directory: the model registry and head files.
    #[arg(long, env = "NDPIPE_TUNER_DATA", default_value = "data/tuner")]
    data: PathBuf,
    /// HTTP address for operators (`/v1/tuner/...`).
    #[arg(long, env = "NDPIPE_TUNER_LISTEN", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// gRPC address PipeStores register with.
    #[arg(
        long,
        env = "NDPIPE_TUNER_GRPC_LISTEN",
        default_value = "127.0.0.1:7070"
    )]
    grpc_listen: SocketAddr,
    /// Bearer token required for fine-tuning and deploys.
    #[arg(long, env = "NDPIPE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A model folder: gives the Tuner its own backbone, for the conventional comparison mode.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Model threads on the Tuner (0: ONNX Runtime decides).
    #[arg(long, default_value_t = 0)]
    intra_threads: usize,
}

/// Runs `ndpipe tuner` until Ctrl-C or SIGTERM.
pub async fn run(args: TunerArgs) -> Result<()> {
    let versions = Versions::open(&args.data)
        .with_context(|| format!("opening the model registry in {}", args.data.display()))?;
    let nodes = Arc::new(Nodes::default());
    let mut coordinator = Coordinator::new(nodes.clone(), versions);
    if let Some(dir) = &args.model_dir {
        let config = RuntimeConfig {
            dylib: dir.join("lib/libonnxruntime.so"),
            intra_threads: args.intra_threads,
            max_batch: 32,
            execution_provider: ExecutionProvider::Cpu,
        };
        let backend = OrtBackend::load(dir, &config)
            .with_context(|| format!("loading the model from {}", dir.display()))?;
        coordinator = coordinator.with_backbone(Arc::new(backend));
    }
    let coordinator = Arc::new(coordinator);
    let grpc = TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding {}", args.grpc_listen))?;
    let grpc_addr = grpc.local_addr()?;
    let http = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let http_addr = http.local_addr()?;
    let (shutdown, stopped) = tokio::sync::watch::channel(false);
    let mut grpc_stopped = stopped.clone();
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TunerServer::new(TunerService(nodes)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(grpc),
                async move {
                    let _ = grpc_stopped.wait_for(|s| *s).await;
                },
            ),
    );
    let mut http_stopped = stopped;
    let app = ndpipe_tuner::api::router(coordinator, args.token.clone());
    let http_task = tokio::spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(async move {
                let _ = http_stopped.wait_for(|s| *s).await;
            })
            .await
    });
    info!(grpc = %grpc_addr, http = %http_addr, "tuner listening");
    println!("ndpipe tuner: gRPC http://{grpc_addr}, HTTP http://{http_addr}");
    crate::server::wait_for_signal().await;
    let _ = shutdown.send(true);
    grpc_task.await?.context("gRPC server failed")?;
    http_task.await?.context("HTTP server failed")?;
    Ok(())
}
