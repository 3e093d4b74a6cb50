//! Objects: put (an image through ingest, anything else as a plain object), delete, delete
//! many, copy (GET and HEAD are in `get`). `store` is the one way an object is written (PUT,
//! copy, a completed multipart upload).

use std::collections::BTreeMap;

use bytes::Bytes;
use ndpipe_catalog::{
    GroundTruth, ObjectAttributes, ObjectBody, ObjectRecord, PhotoRecord, PutCondition, Split,
    TaskName,
};
use ndpipe_model::PhotoFormat;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};
use tracing::warn;

use super::body::{self, Expected};
use super::buckets::{require, timestamp};
use super::checksums::{self, set_checksum};
use super::conditions::{ReadConditions, copy_destination_condition, write_condition};
use super::errors::{catalog as catalog_error, no_such_key};
use super::{S3State, blocking, headers, tagging, versions};
use crate::duplicates::ExactDuplicates;

/// User-metadata names that set the ground truth of an image instead of being stored.
pub(super) const LABEL_META: &str = "ndpipe-label";
pub(super) const SPLIT_META: &str = "ndpipe-split";
/// The user-metadata name of the ground truth's task (`x-amz-meta-ndpipe-task`).
pub(super) const TASK_META: &str = "ndpipe-task";

/// What a write stores: the bytes, their ETag, the type, the user metadata, the attributes
/// (headers, checksum, parts) and the user's tags.
pub(crate) struct NewObject {
    pub(crate) bytes: Bytes,
    /// The ETag without quotes (multipart: `md5-of-md5s-N`).
    pub(crate) etag: String,
    pub(crate) content_type: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) attributes: ObjectAttributes,
    pub(crate) tags: BTreeMap<String, String>,
}

/// `PutObject`: reads the body under the upload limit (checksums verified), then stores it
/// with its headers, checksum and tags, if its `If-None-Match: *` or `If-Match` holds.
pub(crate) async fn put(
    state: &S3State,
    mut req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    body::refuse_unsigned_chunks(&req.headers, req.credentials.is_some())?;
    let trailers = req.trailing_headers.take();
    let input = req.input;
    let condition = write_condition(input.if_match.as_ref(), input.if_none_match.as_ref())?;
    require(state, &input.bucket).await?;
    let tags = tagging::from_header(input.tagging.as_deref())?;
    let expected = Expected {
        content_md5: input.content_md5,
        checksum: Checksum {
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            checksum_crc64nvme: input.checksum_crc64nvme,
            ..Checksum::default()
        },
    };
    let body = body::read(
        input.body,
        input.content_length,
        state.max_upload_bytes,
        expected,
        trailers,
    )
    .await?;
    let checksum = checksums::of_upload(
        &body.checksum,
        input.checksum_algorithm.as_ref(),
        &body.bytes,
    )?;
    let attributes = ObjectAttributes {
        headers: headers::given(
            input.cache_control,
            input.content_disposition,
            input.content_encoding,
            input.content_language,
            input.expires.as_ref(),
        ),
        checksum,
        ..ObjectAttributes::default()
    };
    let object = NewObject {
        etag: hex::encode(body.md5),
        bytes: body.bytes,
        content_type: input.content_type,
        metadata: input.metadata.unwrap_or_default().into_iter().collect(),
        attributes,
        tags,
    };
    let stored = store(state, &input.bucket, &input.key, object, &condition).await?;
    let sum = checksums::answer(stored.attributes.checksum.as_ref());
    let mut out = PutObjectOutput {
        e_tag: Some(ETag::Strong(stored.etag)),
        size: i64::try_from(stored.bytes).ok(),
        checksum_type: sum.checksum_type.clone(),
        ..PutObjectOutput::default()
    };
    set_checksum!(out, sum);
    Ok(S3Response::new(out))
}

/// Content types of the formats ingest decodes: bytes sent as one of these must be one.
const PHOTO_TYPES: &[&str] = &[
    "image/jpeg",
    "image/jpg",
    "image/pjpeg",
    "image/png",
    "image/webp",
];

/// Whether bytes of `content_type` go through ingest: JPEG, PNG or WebP magic bytes, or a
/// JPEG/PNG/WebP content type (ingest then refuses bytes that are not one). Other images
/// (HEIC, RAW, GIF, ...) and everything else are plain objects, so a photo folder syncs whole.
pub(super) fn is_photo(content_type: Option<&str>, bytes: &[u8]) -> bool {
    let claimed = content_type.is_some_and(|t| {
        let t = t
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        PHOTO_TYPES.contains(&t.as_str())
    });
    claimed || PhotoFormat::sniff(bytes).is_some()
}

/// The ground truth given as `x-amz-meta-ndpipe-label`/`-split`/`-task`, taken out of
/// `metadata`.
pub(super) fn ground_truth(
    metadata: &mut BTreeMap<String, String>,
) -> S3Result<Option<GroundTruth>> {
    let label = metadata.remove(LABEL_META);
    let split = metadata.remove(SPLIT_META);
    let task = metadata.remove(TASK_META);
    match (label, split, task) {
        (None, None, None) => Ok(None),
        (None, _, _) => Err(s3_error!(
            InvalidArgument,
            "x-amz-meta-{SPLIT_META} or x-amz-meta-{TASK_META} was given without x-amz-meta-{LABEL_META}"
        )),
        (Some(label), split, task) => {
            let split = match split.as_deref() {
                None => Split::Train,
                Some(s) => s
                    .parse()
                    .map_err(|e| s3_error!(InvalidArgument, "x-amz-meta-{SPLIT_META}: {e}"))?,
            };
            let task = match task.as_deref() {
                None => TaskName::default_task(),
                Some(t) => t
                    .parse()
                    .map_err(|e| s3_error!(InvalidArgument, "x-amz-meta-{TASK_META}: {e}"))?,
            };
            Ok(Some(GroundTruth { task, label, split }))
        }
    }
}

/// Refuses a label of a task the catalog does not hold, before anything is stored.
async fn check_task(state: &S3State, truth: Option<&GroundTruth>) -> S3Result<()> {
    let Some(task) = truth.map(|t| t.task.clone()) else {
        return Ok(());
    };
    let catalog = state.catalog.clone();
    let name = task.clone();
    let known = tokio::task::spawn_blocking(move || catalog.task(&name))
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?
        .map_err(catalog_error)?;
    match known {
        Some(_) => Ok(()),
        None => Err(s3_error!(
            InvalidArgument,
            "x-amz-meta-{TASK_META}: task {task} does not exist (create it with POST /v1/tasks)"
        )),
    }
}

/// Stores `object` at (`bucket`, `key`) if `condition` holds: an image through ingest
/// (nothing is stored when it does not decode; see [`photo_of`] for bytes stored already),
/// anything else as a blob; then the catalog row, replacing the key's old object, whose photo
/// or blob is then removed. The catalog checks `condition` as it writes the row (checked here
/// first too, to spare the ingest of a write that cannot win); a write it refuses removes
/// what it stored.
pub(crate) async fn store(
    state: &S3State,
    bucket: &str,
    key: &str,
    mut object: NewObject,
    condition: &PutCondition,
) -> S3Result<ObjectRecord> {
    let truth = ground_truth(&mut object.metadata)?;
    check_task(state, truth.as_ref()).await?;
    precheck(state, bucket, key, condition).await?;
    let bytes = object.bytes.clone();
    let mut stored = true;
    let (body, content_type, sha256) = if is_photo(object.content_type.as_deref(), &bytes) {
        let (photo, new) = photo_of(state, bucket, key, bytes, truth).await?;
        stored = new;
        (
            ObjectBody::Photo(photo.id),
            photo.meta.content_type,
            photo.meta.sha256,
        )
    } else {
        if truth.is_some() {
            return Err(s3_error!(
                InvalidArgument,
                "ground truth can only be given for an image"
            ));
        }
        let stored = state.objects.put_blob(bytes).await?;
        let content_type = object
            .content_type
            .clone()
            .unwrap_or_else(|| "binary/octet-stream".into());
        (ObjectBody::Blob(stored.name), content_type, stored.sha256)
    };
    let record = ObjectRecord {
        bucket: bucket.to_string(),
        key: key.to_string(),
        body,
        bytes: object.bytes.len() as u64,
        etag: object.etag,
        sha256,
        content_type,
        modified_ms: ndpipe_util::time::now_ms(),
        metadata: object.metadata,
        attributes: object.attributes,
        tags: object.tags,
    };
    let (catalog, row, condition) = (state.catalog.clone(), record.clone(), condition.clone());
    match blocking(move || catalog.put_object(&row, &condition).map_err(catalog_error)).await {
        // The same bytes again at the same key, in `existing` mode: the photo stays.
        Ok(Some(old)) if old.body == record.body => {}
        Ok(Some(old)) => remove_body(state, &old.body).await,
        Ok(None) => {}
        Err(e) => {
            if stored {
                remove_body(state, &record.body).await;
            }
            return Err(e);
        }
    }
    Ok(record)
}

/// Fails as the catalog would if `condition` does not hold for the object at (`bucket`, `key`)
/// now.
async fn precheck(
    state: &S3State,
    bucket: &str,
    key: &str,
    condition: &PutCondition,
) -> S3Result<()> {
    if *condition == PutCondition::Always {
        return Ok(());
    }
    let (catalog, b, k, condition) = (
        state.catalog.clone(),
        bucket.to_string(),
        key.to_string(),
        condition.clone(),
    );
    blocking(move || {
        let current = catalog.object(&b, &k).map_err(catalog_error)?;
        condition
            .check(&b, &k, current.as_ref())
            .map_err(catalog_error)
    })
    .await
}

/// The photo of an image object at (`bucket`, `key`), and whether it was stored now. With
/// `exact_duplicates = "existing"`, bytes the catalog has already name the existing photo,
/// unless another key names it (the object catalog gives a photo one key at most): then, as
/// with `store`, the object gets a new photo of its own. Either way the object is created.
async fn photo_of(
    state: &S3State,
    bucket: &str,
    key: &str,
    bytes: Bytes,
    truth: Option<GroundTruth>,
) -> S3Result<(PhotoRecord, bool)> {
    let mode = state.objects.exact_duplicates();
    let uploaded = state
        .objects
        .put_photo(mode, bytes.clone(), truth.clone())
        .await?;
    if uploaded.stored {
        return Ok((uploaded.record, true));
    }
    let (id, catalog) = (uploaded.record.id, state.catalog.clone());
    let named = blocking(move || catalog.object_of_photo(id).map_err(catalog_error)).await?;
    match named {
        Some(other) if (other.bucket.as_str(), other.key.as_str()) != (bucket, key) => {
            let fresh = state
                .objects
                .put_photo(ExactDuplicates::Store, bytes, truth)
                .await?;
            Ok((fresh.record, true))
        }
        _ => Ok((uploaded.record, false)),
    }
}

/// Removes the photo or blob an object no longer names; a failure is logged (a photo that
/// stays is still listed by `/v1`, a blob is only wasted space).
pub(crate) async fn remove_body(state: &S3State, body: &ObjectBody) {
    let removed = match body {
        ObjectBody::Photo(id) => state.objects.delete_photo(*id).await.map(drop),
        ObjectBody::Blob(name) => state.objects.delete_blob(name).await,
    };
    if let Err(e) = removed {
        warn!(body = ?body, error = %e, "cannot remove what a replaced or deleted object named");
    }
}

/// The catalog row of (`bucket`, `key`): `NoSuchBucket` or `NoSuchKey` when there is none.
pub(crate) async fn lookup(state: &S3State, bucket: &str, key: &str) -> S3Result<ObjectRecord> {
    let catalog = state.catalog.clone();
    let (b, k) = (bucket.to_string(), key.to_string());
    let found = blocking(move || catalog.object(&b, &k).map_err(catalog_error)).await?;
    match found {
        Some(object) => Ok(object),
        None => {
            require(state, bucket).await?;
            Err(no_such_key(key))
        }
    }
}

/// The bytes of `object`, from its photo or its file.
pub(crate) async fn read_bytes(state: &S3State, object: &ObjectRecord) -> S3Result<Bytes> {
    let found = match &object.body {
        ObjectBody::Photo(id) => state.objects.read_photo(*id).await?.map(|(_, bytes)| bytes),
        ObjectBody::Blob(name) => state.objects.read_blob(name, &object.sha256).await?,
    };
    found
        .map(Bytes::from)
        .ok_or_else(|| no_such_key(&object.key))
}

/// Deletes one object; whether it existed.
async fn remove(state: &S3State, bucket: &str, key: &str) -> S3Result<bool> {
    let catalog = state.catalog.clone();
    let (b, k) = (bucket.to_string(), key.to_string());
    let old = blocking(move || catalog.delete_object(&b, &k).map_err(catalog_error)).await?;
    match old {
        Some(old) => {
            remove_body(state, &old.body).await;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// `DeleteObject`: 204 whether or not the key existed, as S3 answers; of versions, only the
/// one every object has, `null`.
pub(crate) async fn delete(
    state: &S3State,
    input: DeleteObjectInput,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    require(state, &input.bucket).await?;
    remove(state, &input.bucket, &input.key).await?;
    Ok(S3Response::new(DeleteObjectOutput::default()))
}

/// The most keys one `DeleteObjects` may name, as S3 allows.
const MAX_DELETE_KEYS: usize = 1000;

/// `DeleteObjects`: 1 to 1,000 keys (`MalformedXML` otherwise, nothing deleted), each deleted
/// on its own (its version id, `null` only, echoed); failures are listed, not fatal.
pub(crate) async fn delete_many(
    state: &S3State,
    input: DeleteObjectsInput,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let count = input.delete.objects.len();
    if !(1..=MAX_DELETE_KEYS).contains(&count) {
        return Err(s3_error!(
            MalformedXML,
            "a delete names 1 to {MAX_DELETE_KEYS} keys, this one {count}"
        ));
    }
    require(state, &input.bucket).await?;
    let quiet = input.delete.quiet.unwrap_or(false);
    let (mut deleted, mut failed) = (Vec::new(), Vec::new());
    for id in input.delete.objects {
        let removed = match versions::only_null(id.version_id.as_deref()) {
            Ok(()) => remove(state, &input.bucket, &id.key).await,
            Err(e) => Err(e),
        };
        match removed {
            Ok(_) if quiet => {}
            Ok(_) => deleted.push(DeletedObject {
                key: Some(id.key),
                version_id: id.version_id,
                ..DeletedObject::default()
            }),
            Err(e) => failed.push(Error {
                code: Some(e.code().as_str().to_string()),
                message: e.message().map(str::to_string),
                key: Some(id.key),
                version_id: id.version_id,
            }),
        }
    }
    Ok(S3Response::new(DeleteObjectsOutput {
        deleted: Some(deleted),
        errors: (!failed.is_empty()).then_some(failed),
        ..DeleteObjectsOutput::default()
    }))
}

/// `CopyObject`: the source's bytes stored again at the destination (an image is ingested
/// again: a new photo with its own tensor and labels), with its ETag, checksum and parts.
/// Metadata and standard headers are copied unless the request says `REPLACE`; a copy onto
/// itself must say it (`InvalidRequest` otherwise, as S3). Tags are copied unless
/// `x-amz-tagging-directive` says `REPLACE`; `x-amz-checksum-algorithm` asks for a new
/// checksum of the bytes. The source must meet the `x-amz-copy-source-if-*` conditions, the
/// destination its `If-None-Match: *` or `If-Match` (which `s3s` leaves unparsed here).
pub(crate) async fn copy(
    state: &S3State,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let condition = copy_destination_condition(&req.headers)?;
    let input = req.input;
    let CopySource::Bucket {
        bucket: src_bucket,
        key: src_key,
        version_id: src_version,
    } = &input.copy_source
    else {
        return Err(s3_error!(
            NotImplemented,
            "only bucket copy sources are supported"
        ));
    };
    require(state, &input.bucket).await?;
    versions::only_null(src_version.as_deref())?;
    let source = lookup(state, src_bucket, src_key).await?;
    ReadConditions {
        if_match: input.copy_source_if_match.clone(),
        if_none_match: input.copy_source_if_none_match.clone(),
        if_modified_since: input.copy_source_if_modified_since.clone(),
        if_unmodified_since: input.copy_source_if_unmodified_since.clone(),
    }
    .check_copy_source(&source)?;
    let tags = tagging::for_copy(
        input.tagging_directive.as_ref(),
        input.tagging.as_deref(),
        &source.tags,
    )?;
    let replace = input
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
    if !replace
        && (src_bucket.as_ref(), src_key.as_ref()) == (input.bucket.as_str(), input.key.as_str())
    {
        return Err(s3_error!(
            InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."
        ));
    }
    let bytes = read_bytes(state, &source).await?;
    let mut attributes = ObjectAttributes {
        upload_id: None,
        ..source.attributes.clone()
    };
    let (content_type, metadata) = if replace {
        attributes.headers = headers::given(
            input.cache_control,
            input.content_disposition,
            input.content_encoding,
            input.content_language,
            input.expires.as_ref(),
        );
        (
            input.content_type,
            input.metadata.unwrap_or_default().into_iter().collect(),
        )
    } else {
        (Some(source.content_type.clone()), source.metadata.clone())
    };
    if let Some(asked) = &input.checksum_algorithm {
        attributes.checksum = checksums::of_upload(&Checksum::default(), Some(asked), &bytes)?;
        for part in &mut attributes.parts {
            part.checksum = None;
        }
    }
    let object = NewObject {
        bytes,
        etag: source.etag.clone(),
        content_type,
        metadata,
        attributes,
        tags,
    };
    let stored = store(state, &input.bucket, &input.key, object, &condition).await?;
    let sum = checksums::answer(stored.attributes.checksum.as_ref());
    let mut result = CopyObjectResult {
        e_tag: Some(ETag::Strong(stored.etag)),
        last_modified: Some(timestamp(stored.modified_ms)),
        checksum_type: sum.checksum_type.clone(),
        ..CopyObjectResult::default()
    };
    set_checksum!(result, sum);
    Ok(S3Response::new(CopyObjectOutput {
        copy_object_result: Some(result),
        ..CopyObjectOutput::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jpeg_png_and_webp_are_photos_other_files_plain_objects() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert!(is_photo(None, png));
        assert!(is_photo(Some("binary/octet-stream"), png));
        assert!(
            is_photo(Some("image/jpeg"), b"not a photo"),
            "ingest refuses it"
        );
        assert!(is_photo(Some("Image/PNG; charset=binary"), b"x"));
        assert!(!is_photo(Some("image/heic"), b"\0\0\0\x18ftypheic"));
        assert!(!is_photo(Some("image/gif"), b"GIF89a"));
        assert!(!is_photo(Some("application/json"), b"{}"));
        assert!(!is_photo(None, b""));
    }
}
