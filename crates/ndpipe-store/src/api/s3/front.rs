//! The front of the S3 API, around the `s3s` service: each request gets an id, answered as
//! `x-amz-request-id` and, in an error, as the XML body's `<RequestId>` (the same id, once for
//! every error: those `s3s` writes itself, for a bad signature or a bad path, included); what
//! is refused before parsing (`refuse::before_parsing`) is answered here. An error to a request
//! with a body closes the connection: the body may be unread (refused before reading it), and a
//! client waiting on `Expect: 100-continue` never sends it, so `hyper` would take the next
//! request's first bytes for the rest of it.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;
use hyper::HeaderMap;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderValue, TRANSFER_ENCODING};
use s3s::service::S3Service;
use s3s::{Body, HttpError, HttpResponse};

use super::refuse;

/// The `s3s` service with request ids and the refusals before parsing.
#[derive(Clone)]
pub(crate) struct Front(pub(crate) S3Service);

/// A new request id: 16 upper-case hex digits, as AWS's; random (a count, should the system
/// have no randomness to give).
fn request_id() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = getrandom::u64().unwrap_or_else(|_| COUNT.fetch_add(1, Ordering::Relaxed));
    format!("{n:016X}")
}

/// `body` (an S3 XML error) with `<RequestId>id</RequestId>` as its last element; `None` when
/// it is not one.
fn with_id(body: &[u8], id: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?.trim_end();
    let head = text.strip_suffix("</Error>")?;
    if head.contains("<RequestId>") {
        return None;
    }
    Some(Bytes::from(format!(
        "{head}<RequestId>{id}</RequestId></Error>"
    )))
}

/// Whether a request with `headers` comes with a body.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// `res` with the request id in its header and, for an error, in its body; an error to a
/// request `with_body` closes the connection.
fn stamp(mut res: HttpResponse, id: &str, with_body: bool) -> HttpResponse {
    if let Ok(value) = HeaderValue::from_str(id) {
        res.headers_mut().insert("x-amz-request-id", value);
    }
    if res.status().is_client_error() || res.status().is_server_error() {
        if with_body {
            res.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        let body = res.body().bytes().and_then(|b| with_id(&b, id));
        if let Some(body) = body {
            if res.headers().contains_key(CONTENT_LENGTH) {
                res.headers_mut()
                    .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
            }
            *res.body_mut() = Body::from(body);
        }
    }
    res
}

impl hyper::service::Service<hyper::Request<Incoming>> for Front {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = BoxFuture<'static, Result<HttpResponse, HttpError>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let id = request_id();
        let with_body = has_body(req.headers());
        let refused = refuse::before_parsing(req.method(), req.uri(), req.headers());
        let inner = self.0.clone();
        Box::pin(async move {
            let res = match refused {
                Ok(()) => hyper::service::Service::call(&inner, req).await?,
                Err(e) => e
                    .to_http_response()
                    .map_err(|e| HttpError::new(Box::new(e)))?,
            };
            Ok(stamp(res, &id, with_body))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_goes_last_in_an_error_body_once() {
        let body =
            br#"<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code></Error>"#;
        let stamped = with_id(body, "0123456789ABCDEF").unwrap();
        assert!(
            stamped.ends_with(
                b"<Code>NoSuchKey</Code><RequestId>0123456789ABCDEF</RequestId></Error>"
            )
        );
        assert_eq!(with_id(&stamped, "X"), None, "an id is never added twice");
        assert_eq!(with_id(b"<ListBucketResult/>", "X"), None);
        assert_eq!(with_id(&[0xff, 0xfe], "X"), None);
        assert_eq!(request_id().len(), 16);
    }
}
