//! The S3 listener: connections served by the `s3s` service (behind `front`) within the HTTP limits (header
//! deadline, connection cap, bounded shutdown) until `stopped` turns true.

use ndpipe_util::serve::{HttpLimits, serve_hyper};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::front::Front;

/// Serves `service` on `listener` within `limits` until `stopped` turns true (or its sender
/// is gone).
pub(crate) async fn serve(
    listener: TcpListener,
    service: Front,
    limits: HttpLimits,
    mut stopped: watch::Receiver<bool>,
) {
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    serve_hyper(listener, move |_| service.clone(), limits, stop).await;
}
