//! What the PipeStore's and the Tuner's HTTP APIs share: the JSON error body and the bearer-token
//! check.

use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// The body of every HTTP error: `{"error": kind, "message": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable kind (also a metrics label).
    pub error: String,
    /// Human-readable detail.
    pub message: String,
}

/// A JSON error response with `status`.
pub fn error_response(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(ErrorBody {
            error: kind.to_string(),
            message: message.to_string(),
        }),
    )
        .into_response()
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
pub fn has_bearer(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
}

/// The 401 answered to a request without a valid token.
pub fn unauthorized() -> Response {
    let mut resp = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a valid bearer token is required",
    );
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// Middleware body: passes the request on when `token` is unset or presented, else answers 401.
/// Use as `middleware::from_fn(move |req, next| require_bearer(token.clone(), req, next))`.
pub async fn require_bearer(
    token: Option<std::sync::Arc<str>>,
    req: Request,
    next: Next,
) -> Response {
    match token {
        Some(t) if !has_bearer(req.headers(), &t) => unauthorized(),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_must_match_exactly() {
        let mut h = HeaderMap::new();
        assert!(!has_bearer(&h, "s3cret"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(has_bearer(&h, "s3cret"));
        assert!(!has_bearer(&h, "s3cre"));
        assert!(!has_bearer(&h, "s3cretX"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!has_bearer(&h, "s3cret"));
    }
}
