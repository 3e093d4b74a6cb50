//! The `s3s::S3` implementation: each operation this API has, delegated to its module; every
//! other one keeps `s3s`'s default, `NotImplemented`. The service is served behind `front`.

use std::sync::Arc;

use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3, S3Request, S3Response, S3Result};

use super::auth::{KeyAccess, KeyAuth};
use super::front::Front;
use super::host::BucketDomain;
use super::{
    S3State, attributes, buckets, complete, get, listing, multipart, objects, part_copy, tagging,
    versions,
};
use crate::keys::KeyStore;

/// The S3 operations over one PipeStore.
struct PipeStoreS3(Arc<S3State>);

/// The `s3s` service over `state`: virtual-host-style requests for buckets under `domain`
/// (`BUCKET.DOMAIN`), path-style for every other host; signatures and roles checked against
/// `keys` (see `auth`); request ids and the refusals before parsing in `front`.
pub(crate) fn service(state: Arc<S3State>, domain: &str, keys: Arc<KeyStore>) -> Front {
    let mut builder = S3ServiceBuilder::new(PipeStoreS3(state));
    builder.set_auth(KeyAuth(keys.clone()));
    builder.set_access(KeyAccess(keys));
    builder.set_host(BucketDomain::new(domain));
    Front(builder.build())
}

type R<T> = S3Result<S3Response<T>>;

#[async_trait::async_trait]
impl S3 for PipeStoreS3 {
    async fn list_buckets(&self, _: S3Request<ListBucketsInput>) -> R<ListBucketsOutput> {
        buckets::list(&self.0).await
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> R<CreateBucketOutput> {
        buckets::create(&self.0, req.input).await
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> R<HeadBucketOutput> {
        buckets::head(&self.0, req.input).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> R<GetBucketLocationOutput> {
        buckets::location(&self.0, req.input).await
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> R<DeleteBucketOutput> {
        buckets::delete(&self.0, req.input).await
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> R<PutObjectOutput> {
        objects::put(&self.0, req).await
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> R<GetObjectOutput> {
        get::get(&self.0, req.input).await
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> R<HeadObjectOutput> {
        get::head(&self.0, req.input).await
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> R<GetObjectAttributesOutput> {
        attributes::get(&self.0, req.input).await
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> R<DeleteObjectOutput> {
        objects::delete(&self.0, req.input).await
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> R<DeleteObjectsOutput> {
        objects::delete_many(&self.0, req.input).await
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> R<CopyObjectOutput> {
        objects::copy(&self.0, req).await
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> R<ListObjectsV2Output> {
        listing::list_v2(&self.0, req.input).await
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> R<ListObjectsOutput> {
        listing::list_v1(&self.0, req.input).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> R<ListObjectVersionsOutput> {
        versions::list(&self.0, req.input).await
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> R<GetObjectTaggingOutput> {
        tagging::get(&self.0, req.input).await
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> R<PutObjectTaggingOutput> {
        tagging::put(&self.0, req.input).await
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> R<DeleteObjectTaggingOutput> {
        tagging::delete(&self.0, req.input).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> R<CreateMultipartUploadOutput> {
        multipart::create(&self.0, req.input).await
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> R<UploadPartOutput> {
        multipart::upload_part(&self.0, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> R<CompleteMultipartUploadOutput> {
        complete::complete(&self.0, req.input).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> R<UploadPartCopyOutput> {
        part_copy::upload_part_copy(&self.0, req.input).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> R<AbortMultipartUploadOutput> {
        multipart::abort(&self.0, req.input).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> R<ListMultipartUploadsOutput> {
        multipart::list_uploads(&self.0, req.input).await
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> R<ListPartsOutput> {
        multipart::list_parts(&self.0, req.input).await
    }
}
