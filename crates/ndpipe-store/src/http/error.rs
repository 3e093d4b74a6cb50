//! The one mapping from internal errors to HTTP responses with a JSON body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::CatalogError;
use ndpipe_model::PreprocessError;
use serde::Serialize;

use crate::{IngestError, StoreError};

/// An error answered to an HTTP client: `{"error": kind, "message": ...}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable kind, also the metrics label.
    pub kind: &'static str,
    /// Human-readable detail.
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: &'a str,
}

impl ApiError {
    /// Builds an error.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    /// 400 with `kind`.
    pub fn bad_request(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, message)
    }

    /// 404 for a photo id.
    pub fn photo_not_found(id: u64) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("photo {id} does not exist"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: self.kind,
            message: &self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<PreprocessError> for ApiError {
    fn from(e: PreprocessError) -> Self {
        let (status, kind) = match &e {
            PreprocessError::Empty => (StatusCode::BAD_REQUEST, "empty_body"),
            PreprocessError::UnsupportedFormat { .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_format")
            }
            PreprocessError::TooManyPixels { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "too_many_pixels")
            }
            PreprocessError::Truncated { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "truncated_image")
            }
            PreprocessError::ZeroSized { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_image")
            }
            _ => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_image"),
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let (status, kind) = match &e {
            StoreError::Corrupt { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data"),
            StoreError::Closed => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "storage_error"),
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<CatalogError> for ApiError {
    fn from(e: CatalogError) -> Self {
        let (status, kind) = match &e {
            CatalogError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            CatalogError::Conflict { .. } => (StatusCode::CONFLICT, "conflict"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "catalog_error"),
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::Rejected(e) => e.into(),
            IngestError::InvalidLabel(m) => ApiError::bad_request("invalid_label", m),
            IngestError::Store(e) => e.into(),
            IngestError::Catalog(e) => e.into(),
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                other.to_string(),
            ),
        }
    }
}
