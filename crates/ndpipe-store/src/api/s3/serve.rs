//! The S3 listener: connections served by the `s3s` service (behind `front`) within the HTTP limits (header
//! deadline, connection cap, bounded shutdown) until `stopped` turns true.

use ndpipe_util::serve::{HttpLimits, serve_hyper};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::front::Front;

/// Serves `service` on `listener` within `limits` until `stopped` turns true (or its sender
/// is gone). S3 has no health probe, so no connection slots are kept for one.
pub(crate) async fn serve(
    listener: TcpListener,
    service: Front,
    limits: HttpLimits,
    mut stopped: watch::Receiver<bool>,
) {
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let limits = HttpLimits {
        probe_connections: 0,
        ..limits
    };
    serve_hyper(listener, move |_, _| service.clone(), limits, stop).await;
}
