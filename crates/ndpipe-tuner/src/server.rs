//! The standalone Tuner's servers: its HTTP API and its gRPC service, each on its own address.

use std::io;
use std::net::SocketAddr;

use axum::Router;
use ndpipe_proto::transport::Tls;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tracing::info;

use crate::{Config, TunerError};

/// A Tuner serving HTTP and gRPC (see [`Tuner::start`](crate::Tuner::start)) until
/// [`Running::stop`].
#[derive(Debug)]
pub struct Running {
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<()>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Binds both addresses of `config` (port 0 picks a free one) and serves `http` (within
/// `config`'s HTTP limits) and `grpc` on them, gRPC over mutual TLS when `tls` is given.
pub(crate) async fn serve(
    http: Router,
    (grpc, tls): (Routes, Option<&Tls>),
    config: &Config,
) -> Result<Running, TunerError> {
    let (listen, grpc_listen) = (config.listen, config.grpc_listen);
    let mut grpc_server = ndpipe_proto::transport::server(tls)
        .map_err(|e| TunerError::InvalidArgument(e.to_string()))?;
    let (grpc_listener, grpc_addr) = bind("gRPC", grpc_listen).await?;
    let (http_listener, http_addr) = bind("HTTP", listen).await?;
    let (shutdown, stopped) = watch::channel(false);
    let stop = |mut stopped: watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let grpc = tokio::spawn(
        grpc_server
            .add_routes(grpc)
            .serve_with_incoming_shutdown(TcpIncoming::from(grpc_listener), stop(stopped.clone())),
    );
    let http = tokio::spawn(ndpipe_util::serve::serve(
        http_listener,
        http,
        config.http_limits(),
        stop(stopped),
    ));
    info!(grpc = %grpc_addr, http = %http_addr, "tuner listening");
    Ok(Running {
        http_addr,
        grpc_addr,
        shutdown,
        http,
        grpc,
    })
}

async fn bind(
    server: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), TunerError> {
    let error = |source| TunerError::Server {
        server,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let local = listener.local_addr().map_err(error)?;
    Ok((listener, local))
}

impl Running {
    /// Where the HTTP API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where the gRPC service (for PipeStores) listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// Stops both servers, letting requests in flight finish.
    pub async fn stop(self) -> Result<(), TunerError> {
        let _ = self.shutdown.send(true);
        let joined = |server: &str, e: tokio::task::JoinError| {
            TunerError::Internal(format!("the {server} server task: {e}"))
        };
        let grpc = self.grpc.await.map_err(|e| joined("gRPC", e))?;
        self.http.await.map_err(|e| joined("HTTP", e))?;
        grpc.map_err(|e| TunerError::Server {
            server: "gRPC",
            addr: self.grpc_addr,
            source: io::Error::other(e),
        })
    }
}
