//! The one mapping from internal errors to HTTP responses with a JSON body
//! ([`ndpipe_util::http::ErrorBody`]), the error counter, and [`blocking`], the one way
//! handlers run blocking work.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::CatalogError;
use ndpipe_model::PreprocessError;

use super::AppState;
use crate::ingest::IngestError;
use crate::jobs::JobError;
use crate::metrics::StoreMetrics;
use crate::objects::ObjectsError;
use crate::replication::ReplicationError;
use crate::storage::StoreError;

/// An error answered to an HTTP client: `{"error": kind, "message": ...}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    /// HTTP status.
    pub(crate) status: StatusCode,
    /// Stable machine-readable kind, also the metrics label.
    pub(crate) kind: &'static str,
    /// Human-readable detail.
    pub(crate) message: String,
}

impl ApiError {
    /// Builds an error.
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    /// 400 with `kind`.
    pub(crate) fn bad_request(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, message)
    }

    /// 404 for a photo id.
    pub(crate) fn photo_not_found(id: u64) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("photo {id} does not exist"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        ndpipe_util::http::error_response(self.status, self.kind, &self.message)
    }
}

/// A 500 for a failure the client cannot act on.
pub(crate) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// A handler state with the metrics its errors are counted in.
pub(crate) trait Counted {
    /// The metrics.
    fn metrics(&self) -> &StoreMetrics;
}

impl Counted for AppState {
    fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }
}

/// Counts `e` under its kind in `ndpipe_store_errors_total` and passes it on.
pub(crate) fn count(state: &impl Counted, e: ApiError) -> ApiError {
    state.metrics().error(e.kind);
    e
}

/// The largest photo id the catalog can hold (SQL integers are signed 64-bit).
pub(crate) const MAX_PHOTO_ID: u64 = i64::MAX as u64;

/// A photo id from the path, in canonical decimal only (digits, no sign, no leading zero), so
/// that one photo has one URL; one above [`MAX_PHOTO_ID`] cannot exist (404).
pub(crate) fn parse_id(raw: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "bad_id",
            format!("photo id must be a positive integer in plain decimal, not {raw:?}"),
        )
    };
    let canonical = !raw.is_empty()
        && raw.bytes().all(|b| b.is_ascii_digit())
        && (raw == "0" || !raw.starts_with('0'));
    if !canonical {
        return Err(bad());
    }
    let id: u64 = raw.parse().map_err(|_| bad())?;
    if id > MAX_PHOTO_ID {
        return Err(ApiError::photo_not_found(id));
    }
    Ok(id)
}

/// The error kind of a status that came without a body (from the router or a layer).
pub(crate) fn kind_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "no_route",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "headers_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_client_error() => "bad_request",
        _ => "internal",
    }
}

/// Runs blocking work (store reads, catalog queries, jobs) off the async runtime, waiting at
/// most the catalog deadline (`catalog_deadline`; past it, 503 `catalog_unavailable`); its
/// error, or a failure of the task itself (500 `internal`), is counted and answered.
pub(crate) async fn blocking<T, E>(
    state: &impl Counted,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    match crate::catalog_deadline::within(f).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(e))) => Err(count(state, e.into())),
        Ok(Err(e)) => Err(count(state, internal(e))),
        Err(late) => Err(count(
            state,
            crate::catalog_deadline::unavailable(late).into(),
        )),
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
            StoreError::NoPhotoId { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable")
            }
            StoreError::InsufficientStorage { .. } => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
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
            CatalogError::Unavailable { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable")
            }
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
            IngestError::Copy(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "replica_unavailable", m)
            }
            other => internal(other),
        }
    }
}

impl From<ReplicationError> for ApiError {
    fn from(e: ReplicationError) -> Self {
        let unavailable = |kind, e: &ReplicationError| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, kind, e.to_string())
        };
        match e {
            ReplicationError::Ingest(e) => e.into(),
            ReplicationError::Store(e) => e.into(),
            ReplicationError::Catalog(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "catalog_unavailable",
                e.to_string(),
            ),
            ReplicationError::Remote(status) => crate::api::replication::remote_error(&status),
            ReplicationError::NotEnoughNodes { .. } => unavailable("insufficient_replicas", &e),
            ReplicationError::Peer { .. }
            | ReplicationError::NoIntactCopy { .. }
            | ReplicationError::NoIntactFile { .. } => unavailable("replica_unavailable", &e),
            ReplicationError::IsPrimary { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            ReplicationError::Task(_) | ReplicationError::Files(_) => internal(e),
        }
    }
}

impl From<ObjectsError> for ApiError {
    fn from(e: ObjectsError) -> Self {
        match e {
            ObjectsError::Ingest(e) => e.into(),
            ObjectsError::Cluster(e) => e.into(),
            ObjectsError::Store(e) => e.into(),
            ObjectsError::Catalog(e) => e.into(),
            other => internal(other),
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Busy(_) => ApiError::new(StatusCode::CONFLICT, "job_running", e.to_string()),
            JobError::NoModel => ApiError::new(StatusCode::CONFLICT, "no_model", e.to_string()),
            JobError::UnknownModel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_model", e.to_string())
            }
            JobError::Catalog(c) => c.into(),
            other => internal(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::setup;

    #[tokio::test]
    async fn blocking_answers_values_and_counts_errors_by_kind() {
        let s = setup();
        let state = AppState::for_tests(&s);
        assert_eq!(
            blocking(&state, || Ok::<_, StoreError>(7)).await.unwrap(),
            7
        );
        let closed = blocking(&state, || Err::<(), _>(StoreError::Closed))
            .await
            .unwrap_err();
        assert_eq!(
            (closed.status, closed.kind),
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
        );
        let missing = blocking(&state, || {
            Err::<(), _>(CatalogError::NotFound {
                what: "photo 9".into(),
            })
        })
        .await
        .unwrap_err();
        assert_eq!(
            (missing.status, missing.kind),
            (StatusCode::NOT_FOUND, "not_found")
        );
        let panicked = blocking(&state, || -> Result<(), StoreError> { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(
            (panicked.status, panicked.kind),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        let text = state.metrics.encode();
        for kind in ["shutting_down", "not_found", "internal"] {
            assert!(
                text.contains(&format!("ndpipe_store_errors_total{{kind=\"{kind}\"}} 1")),
                "{text}"
            );
        }
    }

    #[test]
    fn ids_are_positive_integers_the_catalog_can_hold() {
        assert_eq!(parse_id("42").unwrap(), 42);
        assert_eq!(parse_id("9223372036854775807").unwrap(), MAX_PHOTO_ID);
        // One photo, one URL: no sign, no leading zero, nothing but ASCII digits.
        for raw in [
            "-1",
            "abc",
            "",
            "18446744073709551616",
            "+1",
            "0001",
            "01",
            " 1",
            "1e3",
            "\u{ff11}",
        ] {
            assert_eq!(parse_id(raw).unwrap_err().kind, "bad_id", "{raw:?}");
        }
        for raw in ["9223372036854775808", "18446744073709551615"] {
            let e = parse_id(raw).unwrap_err();
            assert_eq!((e.status, e.kind), (StatusCode::NOT_FOUND, "not_found"));
        }
    }

    #[test]
    fn a_full_disk_is_507() {
        let e = ApiError::from(StoreError::InsufficientStorage {
            reason: "0 bytes free".into(),
        });
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
        );
    }
}
