//! The S3 listener: HTTP/1.1 connections served by the `s3s` service until shutdown, then the
//! connections in flight drained.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::service::S3Service;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::warn;

/// How long the connections in flight get to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `service` on `listener` until `stopped` turns true (or its sender is gone).
pub(crate) async fn serve(
    listener: TcpListener,
    service: S3Service,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let http = hyper::server::conn::http1::Builder::new();
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let conn = http.serve_connection(TokioIo::new(stream), service.clone());
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    warn!(error = %e, "S3 listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut stop => break,
        }
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("S3 listener: connections still open after the drain period were dropped");
    }
    Ok(())
}
