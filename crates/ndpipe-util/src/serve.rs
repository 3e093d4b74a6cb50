//! Serving an axum router over HTTP/1 and HTTP/2 with limits a public server needs, which
//! `axum::serve` does not offer: a deadline on reading a request's headers (a half-sent request
//! line cannot hold a connection), an idle deadline and a minimum rate on request bodies (a
//! body that stops or trickles fails), a cap on open connections with a share per client
//! address and slots kept for health probes, and a bounded graceful shutdown (a stalled upload
//! cannot hold the process).

mod admission;
mod body_rate;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tracing::{debug, warn};

use crate::http::error_response;
use admission::{Admission, Refusal};
pub use admission::{Lane, PROBE_CONNECTIONS};
pub use body_rate::{BodyTooSlow, MinRateBody};

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
    /// Smallest average rate of a request body, in bytes/s, once it has been arriving for
    /// `body_idle_timeout` (0: no minimum).
    pub min_body_rate: u64,
    /// Connections served at once; more are accepted and closed at once (past the probes').
    pub max_connections: usize,
    /// Connections one client address may hold of `max_connections` (0: all of them).
    pub max_connections_per_client: usize,
    /// Connections kept beyond `max_connections` for health probes, one per address.
    pub probe_connections: usize,
    /// How long shutdown waits for open requests before it closes their connections.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    /// Headers within 10 s, body pieces within 30 s and 1 KiB/s on average after that, 512
    /// connections with 64 per client address and [`PROBE_CONNECTIONS`] for probes, 5 s of
    /// grace.
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            min_body_rate: 1024,
            max_connections: 512,
            max_connections_per_client: 64,
            probe_connections: PROBE_CONNECTIONS,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// A configuration's HTTP settings, by their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpSettings {
    /// `header_timeout_ms`.
    pub header_timeout_ms: u64,
    /// `body_idle_timeout_ms`.
    pub body_idle_timeout_ms: u64,
    /// `min_body_rate`, in bytes/s.
    pub min_body_rate: u64,
    /// `max_connections`.
    pub max_connections: usize,
    /// `max_connections_per_client`.
    pub max_connections_per_client: usize,
}

impl HttpLimits {
    /// Limits from a configuration's settings (a 0 ms deadline counts as 1 ms), with the
    /// default probe slots and grace.
    pub fn from_config(settings: HttpSettings) -> Self {
        HttpLimits {
            header_timeout: Duration::from_millis(settings.header_timeout_ms.max(1)),
            body_idle_timeout: Duration::from_millis(settings.body_idle_timeout_ms.max(1)),
            min_body_rate: settings.min_body_rate,
            max_connections: settings.max_connections,
            max_connections_per_client: settings.max_connections_per_client,
            ..HttpLimits::default()
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then waits at most
/// `limits.shutdown_grace` for open requests. Handlers can extract the client's address as
/// `ConnectInfo<SocketAddr>`. On a probe's connection only `/healthz` and `/readyz` are
/// answered; anything else is 503 `server_busy`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let app = app
        .layer(middleware::from_fn(probes_only_on_their_lane))
        .layer(RequestBodyTimeoutLayer::new(limits.body_idle_timeout));
    let (min_rate, grace) = (limits.min_body_rate, limits.body_idle_timeout);
    let service = move |remote: SocketAddr, lane: Lane| {
        TowerToHyperService::new(app.clone().map_request(
            move |mut req: axum::http::Request<Incoming>| {
                req.extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(remote));
                req.extensions_mut().insert(lane);
                req.map(|body| axum::body::Body::new(MinRateBody::new(body, min_rate, grace)))
            },
        ))
    };
    serve_hyper(listener, service, limits, shutdown).await;
}

/// Middleware: on a [`Lane::Probe`] connection, answers `/healthz` and `/readyz` and refuses
/// the rest with 503 `server_busy`, closing the connection after each answer.
async fn probes_only_on_their_lane(req: Request, next: Next) -> Response {
    if req.extensions().get::<Lane>() != Some(&Lane::Probe) {
        return next.run(req).await;
    }
    let mut response = if matches!(req.uri().path(), "/healthz" | "/readyz") {
        next.run(req).await
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_busy",
            "every connection slot is taken (max_connections): only /healthz and /readyz are \
             answered; retry later",
        )
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// [`serve`] for any hyper service: `service(remote, lane)` serves the connection from
/// `remote`. The header deadline, connection caps and bounded shutdown of `limits` apply; the
/// body deadline, and what a [`Lane::Probe`] connection answers, are the service's concern.
pub async fn serve_hyper<S, B>(
    listener: TcpListener,
    service: impl Fn(SocketAddr, Lane) -> S,
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
    let admission = Admission::new(&limits);
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
        let admitted = match admission.admit(remote.ip()) {
            Ok(admitted) => admitted,
            Err(Refusal::ClientShare) => {
                debug!(%remote, "the client holds its share of the connections: closed");
                continue;
            }
            Err(Refusal::Full) => {
                debug!(%remote, "too many connections: closed");
                continue;
            }
        };
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service(remote, admitted.lane))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(%remote, error = %e, "connection ended with an error");
            }
            drop(admitted);
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
