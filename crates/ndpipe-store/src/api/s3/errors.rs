//! The one mapping from internal errors to S3 errors (S3's XML error body, written by `s3s`).
//! Codes S3 has are used as S3 uses them; a photo that cannot be ingested gets a code of ours
//! (`InvalidImage`, `TooManyPixels`, ...) with the status `/v1` answers for it.

use hyper::StatusCode;
use ndpipe_catalog::CatalogError;
use ndpipe_model::PreprocessError;
use s3s::{S3Error, S3ErrorCode, s3_error};

use crate::api::http::ApiError;
use crate::ingest::IngestError;
use crate::objects::ObjectsError;
use crate::replication::ReplicationError;
use crate::storage::StoreError;

/// An error with a code of ours, `status` and `message`.
pub(crate) fn custom(code: &str, status: StatusCode, message: impl ToString) -> S3Error {
    let code = S3ErrorCode::from_bytes(code.as_bytes()).unwrap_or(S3ErrorCode::InternalError);
    let mut e = S3Error::with_message(code, message.to_string());
    e.set_status_code(status);
    e
}

/// A 500 for a failure the client cannot act on.
pub(crate) fn internal(e: impl std::fmt::Display) -> S3Error {
    s3_error!(InternalError, "{e}")
}

/// `NoSuchBucket` naming the bucket.
pub(crate) fn no_such_bucket(bucket: &str) -> S3Error {
    s3_error!(NoSuchBucket, "bucket {bucket:?} does not exist")
}

/// `NoSuchKey` naming the key.
pub(crate) fn no_such_key(key: &str) -> S3Error {
    s3_error!(NoSuchKey, "no object has the key {key:?}")
}

/// A catalog failure: a missing bucket is `NoSuchBucket`, a missing object `NoSuchKey`, a
/// bucket with objects `BucketNotEmpty`, an existing one `BucketAlreadyOwnedByYou`, a write
/// whose condition does not hold `PreconditionFailed`, a catalog that does not answer
/// `ServiceUnavailable` (503).
pub(crate) fn catalog(e: CatalogError) -> S3Error {
    match e {
        CatalogError::NotFound { what } if what.starts_with("bucket ") => {
            s3_error!(NoSuchBucket, "{what} does not exist")
        }
        CatalogError::NotFound { what } if what.starts_with("object ") => {
            s3_error!(NoSuchKey, "{what} does not exist")
        }
        CatalogError::PreconditionFailed { .. } => super::conditions::precondition_failed(),
        CatalogError::NotEmpty { what } => s3_error!(BucketNotEmpty, "{what} is not empty"),
        CatalogError::Conflict { what } if what.starts_with("bucket ") => {
            s3_error!(BucketAlreadyOwnedByYou, "{what} already exists")
        }
        e @ CatalogError::Unavailable { .. } => s3_error!(ServiceUnavailable, "{e}"),
        other => internal(other),
    }
}

/// A store failure: a full disk is 507 `InsufficientStorage`, a closing store 503.
pub(crate) fn store(e: StoreError) -> S3Error {
    match e {
        StoreError::InsufficientStorage { .. } => {
            custom("InsufficientStorage", StatusCode::INSUFFICIENT_STORAGE, e)
        }
        StoreError::Closed => s3_error!(ServiceUnavailable, "the store is shutting down"),
        other => internal(other),
    }
}

/// An upload the ingest refused: the photo's own fault (4xx) or the node's (5xx).
pub(crate) fn ingest(e: IngestError) -> S3Error {
    match e {
        IngestError::Rejected(e) => image(e),
        IngestError::InvalidLabel(m) => s3_error!(InvalidArgument, "invalid ground truth: {m}"),
        IngestError::Store(e) => store(e),
        IngestError::Catalog(e) => catalog(e),
        other => internal(other),
    }
}

/// A replicated store, read or delete that failed: the ingest's own error as [`ingest`] maps
/// it, anything else as `/v1` answers it (503 when a copy or a node could not be had).
pub(crate) fn replication(e: ReplicationError) -> S3Error {
    match e {
        ReplicationError::Ingest(e) => ingest(e),
        ReplicationError::Store(e) => store(e),
        other => {
            let api = ApiError::from(other);
            let code = match api.status {
                StatusCode::INSUFFICIENT_STORAGE => "InsufficientStorage",
                s if s.is_client_error() => "InvalidArgument",
                _ => "ServiceUnavailable",
            };
            custom(code, api.status, api.message)
        }
    }
}

/// Objects that could not be stored, read or deleted, each cause as its own mapping says.
pub(crate) fn objects(e: ObjectsError) -> S3Error {
    match e {
        ObjectsError::Ingest(e) => ingest(e),
        ObjectsError::Cluster(e) => replication(e),
        ObjectsError::Store(e) => store(e),
        ObjectsError::Catalog(e) => catalog(e),
        other => internal(other),
    }
}

impl From<ObjectsError> for S3Error {
    fn from(e: ObjectsError) -> Self {
        objects(e)
    }
}

/// Why an image body could not be ingested, with the status `/v1` answers for it.
fn image(e: PreprocessError) -> S3Error {
    let (code, status) = match &e {
        PreprocessError::Empty => ("InvalidImage", StatusCode::BAD_REQUEST),
        PreprocessError::UnsupportedFormat { .. } => {
            ("UnsupportedImageFormat", StatusCode::UNSUPPORTED_MEDIA_TYPE)
        }
        PreprocessError::TooManyPixels { .. } => ("TooManyPixels", StatusCode::PAYLOAD_TOO_LARGE),
        PreprocessError::Truncated { .. } => ("TruncatedImage", StatusCode::UNPROCESSABLE_ENTITY),
        _ => ("InvalidImage", StatusCode::UNPROCESSABLE_ENTITY),
    };
    custom(code, status, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_errors_become_the_codes_s3_clients_know() {
        let missing = catalog(CatalogError::NotFound {
            what: "bucket b".into(),
        });
        assert_eq!(missing.code(), &S3ErrorCode::NoSuchBucket);
        let full = catalog(CatalogError::NotEmpty {
            what: "bucket b".into(),
        });
        assert_eq!(full.code(), &S3ErrorCode::BucketNotEmpty);
        let taken = catalog(CatalogError::Conflict {
            what: "bucket b".into(),
        });
        assert_eq!(taken.code(), &S3ErrorCode::BucketAlreadyOwnedByYou);
    }

    #[test]
    fn images_that_cannot_be_ingested_keep_their_v1_status() {
        let bomb = ingest(IngestError::Rejected(PreprocessError::TooManyPixels {
            width: 100_000,
            height: 100_000,
            pixels: 10_000_000_000,
            limit: 10,
        }));
        assert_eq!(bomb.code().as_str(), "TooManyPixels");
        assert_eq!(bomb.status_code(), Some(StatusCode::PAYLOAD_TOO_LARGE));
        let full = store(StoreError::InsufficientStorage {
            reason: "0 bytes free".into(),
        });
        assert_eq!(full.status_code(), Some(StatusCode::INSUFFICIENT_STORAGE));
    }
}
