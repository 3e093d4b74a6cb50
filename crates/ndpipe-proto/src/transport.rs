//! The gRPC transport both sides use, so that nothing waits forever on a peer that stopped
//! answering (SIGSTOP, a black-holed network): HTTP/2 keepalive on every channel and server, a
//! deadline on every unary call, and a watchdog on every stream (no message for a while is an
//! error). And the cluster secret: when configured, every call carries it
//! ([`SECRET_METADATA`]) and every service refuses a call without it ([`Guard`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

use crate::ProtoError;
pub use crate::tls::Tls;

/// How often an idle HTTP/2 connection is pinged.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection is closed (and its calls fail).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A channel to `url` with keepalive and a connect timeout, over TLS when `tls` is given (the
/// URL is then `https://`); it connects lazily, on first use.
pub fn channel(url: &str, tls: Option<&Tls>) -> Result<Channel, ProtoError> {
    let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| ProtoError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    let endpoint = match tls {
        Some(tls) => tls.client(endpoint)?,
        None => endpoint,
    };
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
        .connect_lazy())
}

/// A gRPC server builder with keepalive (a client that stops answering pings is dropped), over
/// mutual TLS when `tls` is given.
pub fn server(tls: Option<&Tls>) -> Result<Server, ProtoError> {
    let server = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL));
    match tls {
        Some(tls) => tls.server(server),
        None => Ok(server),
    }
}

/// The metadata key that carries the cluster secret.
pub const SECRET_METADATA: &str = "x-ndpipe-cluster-secret";

/// The secret every node and the Tuner of a cluster share (read from `cluster_secret_file`).
#[derive(Clone)]
pub struct ClusterSecret(Arc<str>);

impl ClusterSecret {
    /// A secret; `None` for an empty one, which would protect nothing.
    pub fn new(secret: &str) -> Option<Self> {
        Some(secret)
            .filter(|s| !s.is_empty())
            .map(|s| ClusterSecret(s.into()))
    }

    /// Whether `request` carries the secret (compared in constant time).
    fn admits<T>(&self, request: &Request<T>) -> bool {
        request
            .metadata()
            .get(SECRET_METADATA)
            .is_some_and(|v| ndpipe_util::http::constant_time_eq(v.as_bytes(), self.0.as_bytes()))
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// The interceptor every gRPC service of a node or Tuner runs behind: with a secret, a call
/// without it (or with another one) is answered `UNAUTHENTICATED` before any handler runs;
/// without one, every call passes.
#[derive(Debug, Clone, Default)]
pub struct Guard(pub Option<ClusterSecret>);

impl Interceptor for Guard {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match &self.0 {
            Some(secret) if !secret.admits(&request) => Err(Status::unauthenticated(
                "this call needs the cluster secret",
            )),
            _ => Ok(request),
        }
    }
}

/// `message` as a request carrying `secret` (when there is one) and, with a `deadline`,
/// telling the server its deadline (`grpc-timeout`).
pub fn request<T>(
    message: T,
    deadline: Option<Duration>,
    secret: Option<&ClusterSecret>,
) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    if let Some(secret) = secret
        && let Ok(value) = MetadataValue::try_from(&*secret.0)
    {
        request.metadata_mut().insert(SECRET_METADATA, value);
    }
    request
}

/// Runs a unary call, failing with `DEADLINE_EXCEEDED` when it takes longer than `deadline`.
pub async fn unary<T>(
    deadline: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(deadline, call).await {
        Ok(reply) => reply.map(Response::into_inner),
        Err(_) => Err(silent(deadline)),
    }
}

/// The next message of a stream, failing with `DEADLINE_EXCEEDED` when none comes within
/// `quiet`; `None` at its end.
pub async fn next<T>(stream: &mut Streaming<T>, quiet: Duration) -> Result<Option<T>, Status> {
    match tokio::time::timeout(quiet, stream.message()).await {
        Ok(message) => message,
        Err(_) => Err(silent(quiet)),
    }
}

fn silent(after: Duration) -> Status {
    Status::deadline_exceeded(format!("no answer for {} ms", after.as_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slow_calls_fail_with_deadline_exceeded_and_bad_urls_are_refused() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Response::new(()))
        };
        let err = unary(Duration::from_millis(10), slow).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
        assert!(err.message().contains("10 ms"), "{}", err.message());
        let fast = async { Ok(Response::new(7)) };
        assert_eq!(unary(Duration::from_secs(1), fast).await.unwrap(), 7);
        assert!(matches!(
            channel("not a url", None),
            Err(ProtoError::BadUrl { .. })
        ));
        let r = request((), Some(Duration::from_millis(1500)), None);
        assert!(r.metadata().get("grpc-timeout").is_some());
    }

    #[test]
    fn the_guard_admits_only_calls_with_the_secret() {
        let secret = ClusterSecret::new("s3cret").unwrap();
        let mut guard = Guard(Some(secret.clone()));
        assert!(guard.call(request((), None, Some(&secret))).is_ok());
        let err = guard.call(request((), None, None)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let other = ClusterSecret::new("other").unwrap();
        assert!(guard.call(request((), None, Some(&other))).is_err());
        assert!(Guard(None).call(request((), None, None)).is_ok());
        assert!(ClusterSecret::new("").is_none());
        assert_eq!(format!("{secret:?}"), "ClusterSecret(..)");
    }
}
