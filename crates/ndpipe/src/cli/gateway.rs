//! `ndpipe gateway`: the cluster's front door as a process that holds no photo; serves until
//! Ctrl-C or SIGTERM, then stops cleanly.

use anyhow::{Context, Result};
use clap::Args;
use ndpipe_store::Gateway;
use tracing::info;

use super::config::ConfigFlag;
use super::flags::GatewayFlags;
use super::secure::{self, GrpcSecurity};

/// Flags of `ndpipe gateway`.
#[derive(Debug, Args)]
pub(crate) struct GatewayArgs {
    #[command(flatten)]
    config: ConfigFlag,
    #[command(flatten)]
    flags: GatewayFlags,
}

/// `ndpipe gateway`: uploads placed on `--replicas` PipeStores of the `--catalog` cluster,
/// reads from any intact copy, deletes everywhere.
pub(crate) async fn run(args: GatewayArgs) -> Result<()> {
    let config = args.config.resolve("gateway", &args.flags)?.gateway;
    super::server_preflight();
    secure::require_secure(
        "gateway",
        &GrpcSecurity {
            secret: config.cluster_secret_file.as_deref(),
            tls: config.tls_cert.is_some(),
            insecure: config.insecure_cluster,
        },
    )?;
    info!(version = env!("CARGO_PKG_VERSION"), listen = %config.listen, "ndpipe gateway");
    let gateway = Gateway::open(config).await.context("opening the gateway")?;
    let running = gateway.start().await.context("starting the gateway")?;
    println!("ndpipe gateway listening on http://{}", running.http_addr());
    super::wait_for_signal().await;
    info!("shutting down");
    running.stop().await.context("stopping the gateway")
}
