//! Buckets: list, create, head, location, delete (no objects; its uploads in progress are
//! aborted with it, as AWS does).

use std::time::{Duration, SystemTime};

use ndpipe_catalog::Bucket as CatalogBucket;
use s3s::dto::*;
use s3s::{S3Response, S3Result};

use super::errors::{catalog as catalog_error, internal, no_such_bucket};
use super::listing::owner;
use super::{S3State, blocking};

/// `ms` since the Unix epoch as an S3 timestamp.
pub(crate) fn timestamp(ms: i64) -> Timestamp {
    let ms = u64::try_from(ms).unwrap_or(0);
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

/// `NoSuchBucket` unless `bucket` exists.
pub(crate) async fn require(state: &S3State, bucket: &str) -> S3Result<()> {
    let catalog = state.catalog.clone();
    let name = bucket.to_string();
    let found = blocking(move || catalog.bucket(&name).map_err(catalog_error)).await?;
    match found {
        Some(_) => Ok(()),
        None => Err(no_such_bucket(bucket)),
    }
}

/// `ListBuckets`: every bucket, in name order.
pub(crate) async fn list(state: &S3State) -> S3Result<S3Response<ListBucketsOutput>> {
    let catalog = state.catalog.clone();
    let buckets = blocking(move || catalog.buckets().map_err(catalog_error)).await?;
    let buckets = buckets
        .into_iter()
        .map(|b| Bucket {
            name: Some(b.name),
            creation_date: Some(timestamp(b.created_ms)),
            bucket_region: None,
        })
        .collect();
    Ok(S3Response::new(ListBucketsOutput {
        buckets: Some(buckets),
        owner: Some(owner()),
        ..ListBucketsOutput::default()
    }))
}

/// `CreateBucket`: `BucketAlreadyOwnedByYou` when it exists.
pub(crate) async fn create(
    state: &S3State,
    input: CreateBucketInput,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let catalog = state.catalog.clone();
    let bucket = CatalogBucket {
        name: input.bucket.clone(),
        created_ms: ndpipe_util::time::now_ms(),
    };
    blocking(move || catalog.create_bucket(&bucket).map_err(catalog_error)).await?;
    Ok(S3Response::new(CreateBucketOutput {
        location: Some(format!("/{}", input.bucket)),
    }))
}

/// `HeadBucket`: 404 for a bucket that does not exist.
pub(crate) async fn head(
    state: &S3State,
    input: HeadBucketInput,
) -> S3Result<S3Response<HeadBucketOutput>> {
    require(state, &input.bucket).await?;
    Ok(S3Response::new(HeadBucketOutput::default()))
}

/// `GetBucketLocation`: the default region (an empty constraint, as S3 answers for us-east-1).
pub(crate) async fn location(
    state: &S3State,
    input: GetBucketLocationInput,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    require(state, &input.bucket).await?;
    Ok(S3Response::new(GetBucketLocationOutput::default()))
}

/// `DeleteBucket`: a bucket without objects (`BucketNotEmpty` otherwise); the multipart
/// uploads in progress into it are aborted, their parts removed.
pub(crate) async fn delete(
    state: &S3State,
    input: DeleteBucketInput,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    let catalog = state.catalog.clone();
    let bucket = input.bucket.clone();
    blocking(move || catalog.delete_bucket(&bucket).map_err(catalog_error)).await?;
    let uploads = state.uploads.clone();
    blocking(move || uploads.abort_all(&input.bucket).map_err(internal)).await?;
    Ok(S3Response::new(DeleteBucketOutput {}))
}
