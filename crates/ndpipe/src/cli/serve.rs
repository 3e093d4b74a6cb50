//! `ndpipe serve` and `ndpipe pipestore`: boot a PipeStore (with its own Tuner when embedded),
//! serve until Ctrl-C or SIGTERM, stop cleanly.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use ndpipe_store::PipeStore;
use ndpipe_tuner::Tuner;
use tracing::info;

use super::config::ConfigFlag;
use super::flags::PipeStoreFlags;
use super::secure::{self, GrpcSecurity};

/// Where `ndpipe serve` answers S3 unless told otherwise (MinIO's port).
const DEFAULT_S3_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9000);

/// Flags of `ndpipe serve` and `ndpipe pipestore`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    config: ConfigFlag,
    #[command(flatten)]
    flags: PipeStoreFlags,
}

/// `ndpipe serve`: one PipeStore and its own Tuner in one process, on one data directory.
pub(crate) async fn serve(args: ServeArgs) -> Result<()> {
    let mut config = args.config.resolve("pipestore", &args.flags)?.pipestore;
    config.s3_listen = config.s3_listen.or(Some(DEFAULT_S3_LISTEN));
    super::server_preflight();
    if config.tuner.is_some() {
        bail!("ndpipe serve runs its own Tuner; use ndpipe pipestore to register with another");
    }
    info!(version = env!("CARGO_PKG_VERSION"), data = %config.data.display(), "ndpipe serve: an embedded PipeStore and Tuner");
    // Its own gRPC (the node and its embedded Tuner) is never open: a secret of its own unless
    // it is given one, mutual TLS, or told --insecure-cluster.
    if config.cluster_secret_file.is_none() && config.tls_cert.is_none() && !config.insecure_cluster
    {
        config.cluster_secret_file = Some(secure::serve_secret(&config.data)?);
    }
    secure::require_secure("serve", &security(&config))?;
    let tuner_config = ndpipe_tuner::Config {
        data: config.data.join("tuner"),
        token: config.token.clone(),
        token_file: config.token_file.clone(),
        cluster_secret_file: config.cluster_secret_file.clone(),
        insecure_cluster: config.insecure_cluster,
        tls_cert: config.tls_cert.clone(),
        tls_key: config.tls_key.clone(),
        tls_ca: config.tls_ca.clone(),
        // A shared PostgreSQL catalog holds the Tuner's rows too; a SQLite one is the node's own.
        catalog: config
            .catalog
            .clone()
            .filter(|c| ndpipe_catalog::is_postgres_url(c)),
        // The one ONNX Runtime of the process verifies added backbones too.
        ort_lib: Some(config.ort_lib.clone().unwrap_or_else(|| {
            ndpipe_model::RuntimeConfig::for_model_dir(&config.model_dir).dylib
        })),
        intra_threads: config.intra_threads,
        ..ndpipe_tuner::Config::default()
    };
    let store = PipeStore::open(config)
        .await
        .context("opening the PipeStore")?;
    let name = store.name().to_string();
    let tuner = match store.backbone() {
        Some(backbone) => Some(Arc::new(
            Tuner::open(&tuner_config)
                .context("opening the embedded Tuner")?
                .with_backbone(backbone),
        )),
        None => {
            info!("no model: the embedded Tuner is off until the store runs with one");
            None
        }
    };
    let mut running = store
        .start(
            tuner.as_ref().map(Tuner::http_router),
            tuner.as_ref().map(|t| t.grpc_routes()),
        )
        .await
        .context("starting the PipeStore's servers")?;
    // The PipeStore joins its own Tuner over gRPC, as a remote one would (heartbeats included).
    if let (Some(_), Some(url)) = (&tuner, running.grpc_url().map(str::to_string)) {
        running.join(url);
        info!(%name, "joining the embedded Tuner");
    }
    println!("ndpipe listening on http://{}", running.http_addr());
    if let Some(s3) = running.s3_addr() {
        println!("ndpipe S3 API on http://{s3}");
    }
    super::wait_for_signal().await;
    info!("shutting down");
    running.stop().await.context("stopping the PipeStore")
}

/// `ndpipe pipestore`: a PipeStore that registers with the Tuner at `--tuner`.
pub(crate) async fn pipestore(args: ServeArgs) -> Result<()> {
    let config = args.config.resolve("pipestore", &args.flags)?.pipestore;
    super::server_preflight();
    let Some(tuner) = config.tuner.clone() else {
        bail!("ndpipe pipestore needs --tuner URL (the Tuner's gRPC address)");
    };
    if config.no_model {
        bail!(
            "ndpipe pipestore --no-model cannot join a Tuner: a node without a model runs no \
             gRPC service, so it never registers and the cluster would refuse every upload; \
             give it a model (--model-dir) or run `ndpipe serve --no-model` on its own"
        );
    }
    secure::require_secure("pipestore", &security(&config))?;
    info!(version = env!("CARGO_PKG_VERSION"), data = %config.data.display(), %tuner, "ndpipe pipestore");
    let store = PipeStore::open(config)
        .await
        .context("opening the PipeStore")?;
    let running = store
        .start(None, None)
        .await
        .context("starting the PipeStore's servers")?;
    println!(
        "ndpipe pipestore listening on http://{}",
        running.http_addr()
    );
    super::wait_for_signal().await;
    info!("shutting down");
    running.stop().await.context("stopping the PipeStore")
}

/// How a PipeStore's gRPC is secured.
fn security(config: &ndpipe_store::Config) -> GrpcSecurity<'_> {
    GrpcSecurity {
        secret: config.cluster_secret_file.as_deref(),
        tls: config.tls_cert.is_some(),
        insecure: config.insecure_cluster,
    }
}
