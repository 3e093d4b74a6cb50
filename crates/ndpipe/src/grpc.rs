//! The gRPC side of a PipeStore process: its service for the Tuner (and, in `ndpipe serve`, the
//! Tuner's own service), and registration with a remote Tuner.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::RegisterRequest;
use ndpipe_proto::pb::pipe_store_server::PipeStoreServer;
use ndpipe_proto::pb::tuner_client::TunerClient;
use ndpipe_proto::pb::tuner_server::TunerServer;
use ndpipe_store::grpc::{PipeStoreNode, PipeStoreService};
use ndpipe_tuner::nodes::{Nodes, TunerService};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::server::{ServeArgs, node_name};

/// Largest gRPC message: a chunk of 256 features is about 0.7 MB; a 1000-class head about 5 MB.
pub const MAX_MESSAGE: usize = 64 << 20;

/// Serves the PipeStore service (and the Tuner's, when `nodes` is given) on `args.grpc_listen`
/// until `stopped`; returns the URL the Tuner should use.
pub async fn start(
    args: &ServeArgs,
    node: Arc<PipeStoreNode>,
    nodes: Option<Arc<Nodes>>,
    mut stopped: watch::Receiver<bool>,
) -> Result<String> {
    let listener = TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding the gRPC address {}", args.grpc_listen))?;
    let addr = listener.local_addr()?;
    let service = PipeStoreServer::new(PipeStoreService(node))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let tuner = nodes.map(|n| TunerServer::new(TunerService(n)));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(service)
            .add_optional_service(tuner)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = result {
            warn!(error = %e, "gRPC server failed");
        }
    });
    let url = args
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    info!(%url, "gRPC service listening");
    Ok(url)
}

/// Registers with the Tuner at `args.tuner` in the background, retrying every second until it
/// answers (or the process stops).
pub fn register_until_done(
    args: &ServeArgs,
    node: Arc<PipeStoreNode>,
    url: String,
    mut stopped: watch::Receiver<bool>,
) {
    let Some(tuner) = args.tuner.clone() else {
        return;
    };
    let name = node_name(args);
    tokio::spawn(async move {
        let mut attempt = 0u32;
        loop {
            match register(&tuner, &name, &url).await {
                Ok(id) => {
                    node.set_node_id(id);
                    info!(node = id, %name, %tuner, "registered with the Tuner");
                    return;
                }
                Err(e) => {
                    if attempt.is_multiple_of(10) {
                        warn!(error = %format!("{e:#}"), %tuner, "cannot register with the Tuner yet; retrying");
                    }
                    attempt += 1;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    });
}

async fn register(tuner: &str, name: &str, url: &str) -> Result<u32> {
    let mut client = TunerClient::connect(tuner.to_string())
        .await
        .context("connecting")?;
    let reply = client
        .register(RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            grpc_url: url.to_string(),
            name: name.to_string(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    Ok(reply.into_inner().node_id)
}
