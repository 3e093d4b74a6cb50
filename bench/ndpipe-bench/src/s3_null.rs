//! What `ndpipe-bench s3` sets the S3 clients against besides the store: the processes' CPU
//! time (to split a run's cost between server and client), and a null server that answers
//! every upload at once without storing it, so that a client's own ceiling on this machine
//! is measured in the same run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use nix::sys::resource::{UsageWho, getrusage};
use std::sync::Arc;

/// CPU seconds (user and system) of this process and of its waited-for children.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    /// This process: the store, and the in-process Rust client when it runs.
    pub(crate) own: f64,
    /// Children that have ended: the client processes.
    pub(crate) children: f64,
}

impl Cpu {
    /// The totals so far.
    pub(crate) fn now() -> Result<Cpu> {
        let seconds = |who| -> Result<f64> {
            let u = getrusage(who).context("getrusage")?;
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            Ok(t(u.user_time()) + t(u.system_time()))
        };
        Ok(Cpu {
            own: seconds(UsageWho::RUSAGE_SELF)?,
            children: seconds(UsageWho::RUSAGE_CHILDREN)?,
        })
    }

    /// What was used since `self`.
    pub(crate) fn since(self) -> Result<Cpu> {
        let now = Cpu::now()?;
        Ok(Cpu {
            own: now.own - self.own,
            children: now.children - self.children,
        })
    }
}

/// A server that reads every request body to its end and answers as S3 (PutObject, the three
/// steps of a multipart upload) or `/v1` (`POST /v1/photos`) would, storing nothing.
pub(crate) struct NullServer {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl NullServer {
    /// Listens on a free loopback port.
    pub(crate) async fn start() -> Result<NullServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::new(AtomicU64::new(1)));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(NullServer { addr, task })
    }
}

impl Drop for NullServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Drains the body, then answers what the request's method and query ask for.
async fn answer(State(ids): State<Arc<AtomicU64>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        if chunk.is_err() {
            return StatusCode::BAD_REQUEST.into_response();
        }
    }
    let query = parts.uri.query().unwrap_or("");
    let has = |name: &str| query.split('&').any(|p| p.split('=').next() == Some(name));
    let xml = |body: String| {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/xml".parse().unwrap());
        (headers, Body::from(body)).into_response()
    };
    match parts.method {
        Method::POST if parts.uri.path() == "/v1/photos" => {
            let id = ids.fetch_add(1, Ordering::Relaxed);
            (
                StatusCode::CREATED,
                format!(r#"{{"id":{id},"sha256":"","bytes":0,"width":0,"height":0}}"#),
            )
                .into_response()
        }
        Method::POST if has("uploads") => xml(format!(
            "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>\
             <UploadId>{}</UploadId></InitiateMultipartUploadResult>",
            ids.fetch_add(1, Ordering::Relaxed)
        )),
        Method::POST if has("uploadId") => xml(
            "<CompleteMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>\
             <ETag>\"0-1\"</ETag></CompleteMultipartUploadResult>"
                .into(),
        ),
        _ => ([(header::ETAG, "\"0\"")], StatusCode::OK).into_response(),
    }
}
