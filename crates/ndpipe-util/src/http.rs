//! What the PipeStore's and the Tuner's HTTP APIs share: the JSON error body, the 401 and a
//! constant-time comparison of secrets.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
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
