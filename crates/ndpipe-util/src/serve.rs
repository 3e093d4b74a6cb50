//! Serving an axum router over HTTP/1 and HTTP/2 with limits a public server needs, which
//! `axum::serve` does not offer: a deadline on reading a request's headers (a half-sent request
//! line cannot hold a connection), an idle deadline on request bodies (a body that stops
//! arriving fails), a cap on open connections, and a bounded graceful shutdown (a stalled
//! upload cannot hold the process).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tracing::{debug, warn};

/// Most headers the HTTP/1 parser takes in one request (hyper's default is 100, over which it
/// answers 431 with an empty body): the servers' own, lower check answers with a JSON body.
pub const MAX_PARSED_HEADERS: usize = 1024;

/// The limits of an HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest wait for a request's headers once a connection is open or idle between requests.
    pub header_timeout: Duration,
    /// Longest wait for the next piece of a request body.
    pub body_idle_timeout: Duration,
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// How long shutdown waits for open requests before it closes their connections.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    /// Headers within 10 s, body pieces within 30 s, 512 connections, 5 s of grace.
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            max_connections: 512,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl HttpLimits {
    /// Limits from a configuration's `header_timeout_ms`, `body_idle_timeout_ms` and
    /// `max_connections` (a 0 ms deadline counts as 1 ms), with the default grace.
    pub fn from_config(
        header_timeout_ms: u64,
        body_idle_timeout_ms: u64,
        max_connections: usize,
    ) -> Self {
        HttpLimits {
            header_timeout: Duration::from_millis(header_timeout_ms.max(1)),
            body_idle_timeout: Duration::from_millis(body_idle_timeout_ms.max(1)),
            max_connections,
            ..HttpLimits::default()
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then waits at most
/// `limits.shutdown_grace` for open requests. Handlers can extract the client's address as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let app = app.layer(RequestBodyTimeoutLayer::new(limits.body_idle_timeout));
    let service = move |remote: SocketAddr| {
        TowerToHyperService::new(app.clone().map_request(
            move |mut req: axum::http::Request<Incoming>| {
                req.extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(remote));
                req.map(axum::body::Body::new)
            },
        ))
    };
    serve_hyper(listener, service, limits, shutdown).await;
}

/// [`serve`] for any hyper service: `service(remote)` serves the connection from `remote`.
/// The header deadline, connection cap and bounded shutdown of `limits` apply; the body
/// deadline is the service's concern.
pub async fn serve_hyper<S, B>(
    listener: TcpListener,
    service: impl Fn(SocketAddr) -> S,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) where
    S: hyper::service::Service<hyper::Request<Incoming>, Response = hyper::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_headers(MAX_PARSED_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.header_timeout)
        .keep_alive_timeout(limits.header_timeout);
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of descriptors, most likely: let open connections finish first.
                    warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%remote, "too many connections: closed");
            continue;
        };
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service(remote))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(%remote, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(grace = ?limits.shutdown_grace, "requests still open at shutdown were cut off");
    }
}
