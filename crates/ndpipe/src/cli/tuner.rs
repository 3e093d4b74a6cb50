//! `ndpipe tuner`: the training server and coordinator of many `ndpipe pipestore` processes.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use ndpipe_store::guard_router;
use ndpipe_tuner::Tuner;
use tracing::info;

use super::config::ConfigFlag;
use super::flags::TunerFlags;
use super::secure::{self, GrpcSecurity};

/// Flags of `ndpipe tuner`.
#[derive(Debug, Args)]
pub(crate) struct TunerArgs {
    #[command(flatten)]
    config: ConfigFlag,
    #[command(flatten)]
    flags: TunerFlags,
}

/// Runs `ndpipe tuner` until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: TunerArgs) -> Result<()> {
    let config = args.config.resolve("tuner", &args.flags)?.tuner;
    super::server_preflight();
    secure::require_secure(
        "tuner",
        &GrpcSecurity {
            secret: config.cluster_secret_file.as_deref(),
            tls: config.tls_cert.is_some(),
            insecure: config.insecure_cluster,
        },
    )?;
    info!(version = env!("CARGO_PKG_VERSION"), data = %config.data.display(), "ndpipe tuner");
    let tuner = Arc::new(Tuner::open(&config).context("opening the Tuner")?);
    // The PipeStores' guard, over the keys of the catalog the Tuner shares with them.
    let (keys, token) = (tuner.access_keys(), tuner.token().map(str::to_string));
    let running = tuner
        .start(&config, |router| guard_router(router, keys, token))
        .await
        .context("starting the Tuner's servers")?;
    println!(
        "ndpipe tuner: gRPC http://{}, HTTP http://{}",
        running.grpc_addr(),
        running.http_addr()
    );
    super::wait_for_signal().await;
    info!("shutting down");
    running.stop().await.context("stopping the Tuner")
}
