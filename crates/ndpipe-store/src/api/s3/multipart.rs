//! Multipart uploads. An upload in progress is node-local staging, kept on disk under
//! `DATA/s3-uploads/<upload id>/`: `upload.json` (bucket, key, type, metadata, start time) and
//! one `<part>.part` file per part. Completing checks the parts against the list the client
//! sends (each ETag must match, numbers ascending, every part but the last at least 5 MiB),
//! joins them under the upload limit and stores the object as a PUT would, with the ETag
//! `md5-of-md5s-N`; the staging folder then goes.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use s3s::crypto::{Checksum as _, Md5, Sha256};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};
use serde::{Deserialize, Serialize};

use super::body::{self, Expected, too_large};
use super::buckets::{require, timestamp};
use super::conditions::write_condition;
use super::errors::internal;
use super::objects::{NewObject, store};
use super::{S3State, blocking};

/// S3's smallest part, except for the last one.
const MIN_PART_BYTES: usize = 5 << 20;
/// S3's largest part number.
const MAX_PART_NUMBER: i32 = 10_000;

/// What an upload will become.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UploadInfo {
    bucket: String,
    key: String,
    content_type: Option<String>,
    metadata: BTreeMap<String, String>,
    initiated_ms: i64,
}

/// The multipart uploads in progress on this node.
pub(crate) struct Uploads {
    dir: PathBuf,
    next: AtomicU64,
}

impl Uploads {
    /// The staging folder `dir`, created when missing.
    pub(crate) fn open(dir: PathBuf) -> io::Result<Uploads> {
        std::fs::create_dir_all(&dir)?;
        Ok(Uploads {
            dir,
            next: AtomicU64::new(0),
        })
    }

    /// Aborts every upload into `bucket`: their folders and parts are removed.
    pub(crate) fn abort_all(&self, bucket: &str) -> io::Result<()> {
        for (id, _) in self.all()?.into_iter().filter(|(_, u)| u.bucket == bucket) {
            match std::fs::remove_dir_all(self.dir.join(id)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// The folder of upload `id`; `None` for an id this node never made.
    fn folder(&self, id: &str) -> Option<PathBuf> {
        valid_upload_id(id).then(|| self.dir.join(id))
    }

    fn create(&self, info: &UploadInfo) -> io::Result<String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let seed = format!("{}\0{}\0{}\0{n}", info.bucket, info.key, info.initiated_ms);
        let id = hex::encode(&Sha256::checksum(seed.as_bytes())[..16]);
        let dir = self.dir.join(&id);
        std::fs::create_dir_all(&dir)?;
        let json = serde_json::to_vec(info).map_err(io::Error::other)?;
        ndpipe_util::fs::write_durably(&dir.join("upload.json"), &json)?;
        Ok(id)
    }

    /// Upload `id` of (`bucket`, `key`); `NoSuchUpload` when there is none.
    fn info(&self, id: &str, bucket: &str, key: &str) -> S3Result<(PathBuf, UploadInfo)> {
        let no_such = || s3_error!(NoSuchUpload, "upload {id:?} does not exist");
        let dir = self.folder(id).ok_or_else(no_such)?;
        let json = match std::fs::read(dir.join("upload.json")) {
            Ok(json) => json,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(no_such()),
            Err(e) => return Err(internal(e)),
        };
        let info: UploadInfo = serde_json::from_slice(&json).map_err(internal)?;
        if info.bucket != bucket || info.key != key {
            return Err(no_such());
        }
        Ok((dir, info))
    }

    /// Every upload in progress: (id, info), in id order.
    fn all(&self) -> io::Result<Vec<(String, UploadInfo)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let id = entry.file_name().to_string_lossy().into_owned();
            let Ok(json) = std::fs::read(entry.path().join("upload.json")) else {
                continue;
            };
            if let Ok(info) = serde_json::from_slice(&json) {
                out.push((id, info));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// The parts of the upload in `dir`: (number, size, modified ms), in number order.
fn parts(dir: &Path) -> io::Result<Vec<(i32, u64, i64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = name.strip_suffix(".part").and_then(|n| n.parse().ok()) else {
            continue;
        };
        let meta = entry.metadata()?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        out.push((number, meta.len(), modified));
    }
    out.sort_unstable();
    Ok(out)
}

/// Whether `id` can be an upload id of this node (1 to 64 hex digits): anything else, such
/// as a path, names no folder.
pub(super) fn valid_upload_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn part_path(dir: &Path, number: i32) -> PathBuf {
    dir.join(format!("{number}.part"))
}

/// `CreateMultipartUpload`.
pub(crate) async fn create(
    state: &S3State,
    input: CreateMultipartUploadInput,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    require(state, &input.bucket).await?;
    let info = UploadInfo {
        bucket: input.bucket.clone(),
        key: input.key.clone(),
        content_type: input.content_type,
        metadata: input.metadata.unwrap_or_default().into_iter().collect(),
        initiated_ms: ndpipe_util::time::now_ms(),
    };
    let uploads = state.uploads.clone();
    let id = blocking(move || uploads.create(&info).map_err(internal)).await?;
    Ok(S3Response::new(CreateMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(id),
        ..CreateMultipartUploadOutput::default()
    }))
}

/// `UploadPart`: the part's body read under the upload limit, checksums verified, kept until
/// the upload completes or is aborted; its ETag is its MD5.
pub(crate) async fn upload_part(
    state: &S3State,
    mut req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    body::refuse_unsigned_chunks(&req.headers, req.credentials.is_some())?;
    let trailers = req.trailing_headers.take();
    let input = req.input;
    if !(1..=MAX_PART_NUMBER).contains(&input.part_number) {
        return Err(s3_error!(
            InvalidArgument,
            "part numbers are 1 to {MAX_PART_NUMBER}"
        ));
    }
    let uploads = state.uploads.clone();
    let (id, bucket, key) = (
        input.upload_id.clone(),
        input.bucket.clone(),
        input.key.clone(),
    );
    let (dir, _) = blocking(move || uploads.info(&id, &bucket, &key)).await?;
    let expected = Expected {
        content_md5: input.content_md5,
        checksum: Checksum {
            checksum_crc32: input.checksum_crc32,
            checksum_sha256: input.checksum_sha256,
            ..Checksum::default()
        },
    };
    let part = body::read(
        input.body,
        input.content_length,
        state.max_upload_bytes,
        expected,
        trailers,
    )
    .await?;
    let etag = hex::encode(part.md5);
    let path = part_path(&dir, input.part_number);
    blocking(move || std::fs::write(&path, &part.bytes).map_err(internal)).await?;
    Ok(S3Response::new(UploadPartOutput {
        e_tag: Some(ETag::Strong(etag)),
        ..UploadPartOutput::default()
    }))
}

/// The parts the client listed, joined: `InvalidPart` for a part that is missing or whose
/// ETag differs, `InvalidPartOrder` unless ascending, `EntityTooSmall` for a small part that
/// is not the last, `EntityTooLarge` over `max` bytes. Returns the bytes and the ETag.
/// `read_part` gives a part's staged bytes by number (`NotFound` when it was not uploaded).
pub(super) fn join(
    listed: &[CompletedPart],
    max: usize,
    read_part: impl Fn(i32) -> io::Result<Vec<u8>>,
) -> S3Result<(Bytes, String)> {
    if listed.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "the upload lists no parts to complete"
        ));
    }
    let mut joined = BytesMut::new();
    let mut digests = Vec::with_capacity(listed.len() * 16);
    let mut previous = 0;
    for (i, part) in listed.iter().enumerate() {
        let number = part.part_number.unwrap_or(0);
        if number <= previous {
            return Err(s3_error!(
                InvalidPartOrder,
                "the parts must be listed in ascending order"
            ));
        }
        previous = number;
        let bytes = match read_part(number) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(s3_error!(InvalidPart, "part {number} was not uploaded"));
            }
            Err(e) => return Err(internal(e)),
        };
        let md5 = Md5::checksum(&bytes);
        let given = part.e_tag.as_ref().map(|e| match e {
            ETag::Strong(v) | ETag::Weak(v) => v.trim_matches('"').to_ascii_lowercase(),
        });
        if given.as_deref() != Some(hex::encode(md5).as_str()) {
            return Err(s3_error!(
                InvalidPart,
                "part {number} does not have the ETag given"
            ));
        }
        if i + 1 < listed.len() && bytes.len() < MIN_PART_BYTES {
            return Err(s3_error!(
                EntityTooSmall,
                "part {number} is {} bytes; every part but the last needs {MIN_PART_BYTES}",
                bytes.len()
            ));
        }
        if joined.len() + bytes.len() > max {
            return Err(too_large((joined.len() + bytes.len()) as u64, max));
        }
        joined.extend_from_slice(&bytes);
        digests.extend_from_slice(&md5);
    }
    let etag = format!("{}-{}", hex::encode(Md5::checksum(&digests)), listed.len());
    Ok((joined.freeze(), etag))
}

/// `CompleteMultipartUpload`: the listed parts become the object (see [`join`]) if its
/// `If-None-Match: *` or `If-Match` holds; nothing is stored, and the upload stays, when they
/// do not match or it does not hold.
pub(crate) async fn complete(
    state: &S3State,
    input: CompleteMultipartUploadInput,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let condition = write_condition(input.if_match.as_ref(), input.if_none_match.as_ref())?;
    let uploads = state.uploads.clone();
    let (id, bucket, key) = (
        input.upload_id.clone(),
        input.bucket.clone(),
        input.key.clone(),
    );
    let (dir, info) = blocking(move || uploads.info(&id, &bucket, &key)).await?;
    let listed = input
        .multipart_upload
        .and_then(|m| m.parts)
        .unwrap_or_default();
    let max = state.max_upload_bytes;
    let staged = dir.clone();
    let (bytes, etag) =
        blocking(move || join(&listed, max, |n| std::fs::read(part_path(&staged, n)))).await?;
    let object = NewObject {
        bytes,
        etag,
        content_type: info.content_type,
        metadata: info.metadata,
    };
    let stored = store(state, &input.bucket, &input.key, object, &condition).await?;
    blocking(move || std::fs::remove_dir_all(&dir).map_err(internal)).await?;
    Ok(S3Response::new(CompleteMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        e_tag: Some(ETag::Strong(stored.etag)),
        ..CompleteMultipartUploadOutput::default()
    }))
}

/// `AbortMultipartUpload`: the parts are removed.
pub(crate) async fn abort(
    state: &S3State,
    input: AbortMultipartUploadInput,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let uploads = state.uploads.clone();
    blocking(move || {
        let (dir, _) = uploads.info(&input.upload_id, &input.bucket, &input.key)?;
        std::fs::remove_dir_all(dir).map_err(internal)
    })
    .await?;
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

/// `ListMultipartUploads`: the uploads in progress in a bucket under a prefix, in (key, upload
/// id) order after the markers, a page of at most `max-uploads` (1000).
pub(crate) async fn list_uploads(
    state: &S3State,
    input: ListMultipartUploadsInput,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    require(state, &input.bucket).await?;
    let uploads = state.uploads.clone();
    let mut all = blocking(move || uploads.all().map_err(internal)).await?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let marker = (
        input.key_marker.clone().unwrap_or_default(),
        input.upload_id_marker.clone().unwrap_or_default(),
    );
    all.retain(|(id, u)| {
        u.bucket == input.bucket
            && u.key.starts_with(&prefix)
            && (input.key_marker.is_none() || (&u.key, id) > (&marker.0, &marker.1))
    });
    all.sort_by(|a, b| (&a.1.key, &a.0).cmp(&(&b.1.key, &b.0)));
    let max = usize::try_from(input.max_uploads.unwrap_or(1000).clamp(0, 1000)).unwrap_or(1000);
    let truncated = all.len() > max;
    all.truncate(max);
    let (next_key_marker, next_upload_id_marker) = match all.last() {
        Some((id, u)) if truncated => (Some(u.key.clone()), Some(id.clone())),
        _ => (None, None),
    };
    let list = all
        .into_iter()
        .map(|(id, u)| MultipartUpload {
            key: Some(u.key),
            upload_id: Some(id),
            initiated: Some(timestamp(u.initiated_ms)),
            ..MultipartUpload::default()
        })
        .collect();
    Ok(S3Response::new(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: input.prefix,
        is_truncated: Some(truncated),
        key_marker: input.key_marker,
        upload_id_marker: input.upload_id_marker,
        next_key_marker,
        next_upload_id_marker,
        max_uploads: i32::try_from(max).ok(),
        uploads: Some(list),
        ..ListMultipartUploadsOutput::default()
    }))
}

/// `ListParts`: the parts uploaded so far, in number order, after `part-number-marker`.
pub(crate) async fn list_parts(
    state: &S3State,
    input: ListPartsInput,
) -> S3Result<S3Response<ListPartsOutput>> {
    let uploads = state.uploads.clone();
    let (id, bucket, key) = (
        input.upload_id.clone(),
        input.bucket.clone(),
        input.key.clone(),
    );
    let marker = input.part_number_marker.unwrap_or(0);
    let max = usize::try_from(input.max_parts.unwrap_or(1000).clamp(0, 1000)).unwrap_or(1000);
    let (listed, truncated) = blocking(move || {
        let (dir, _) = uploads.info(&id, &bucket, &key)?;
        let mut out = Vec::new();
        let all = parts(&dir).map_err(internal)?;
        let after: Vec<_> = all.into_iter().filter(|p| p.0 > marker).collect();
        for &(number, size, modified) in after.iter().take(max) {
            let bytes = std::fs::read(part_path(&dir, number)).map_err(internal)?;
            out.push(Part {
                part_number: Some(number),
                size: i64::try_from(size).ok(),
                e_tag: Some(ETag::Strong(hex::encode(Md5::checksum(&bytes)))),
                last_modified: Some(timestamp(modified)),
                ..Part::default()
            });
        }
        Ok((out, after.len() > max))
    })
    .await?;
    let next = listed.last().and_then(|p| p.part_number);
    Ok(S3Response::new(ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        is_truncated: Some(truncated),
        max_parts: i32::try_from(max).ok(),
        next_part_number_marker: if truncated { next } else { None },
        parts: Some(listed),
        ..ListPartsOutput::default()
    }))
}
