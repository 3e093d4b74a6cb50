//! Multipart uploads. An upload in progress is node-local staging, kept on disk under
//! `DATA/s3-uploads/<upload id>/`: `upload.json` (bucket, key, type, metadata, standard
//! headers, checksum algorithm and type, tags, start time) and one `<part>.part` file per part
//! (uploaded, or copied from an object by `part_copy`). A part's checksum by the upload's
//! algorithm is computed from its file when asked for. Completing is `complete`'s.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ndpipe_catalog::StandardHeaders;
use s3s::crypto::{Checksum as _, Md5, Sha256};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};
use serde::{Deserialize, Serialize};

use super::body::{self, Expected};
use super::buckets::{require, timestamp};
use super::checksums::{self, Algorithm, set_checksum};
use super::errors::internal;
use super::{MAX_PART_NUMBER, S3State, blocking, headers, tagging};

/// What an upload will become. Fields after `initiated_ms` are absent from uploads started
/// before they existed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct UploadInfo {
    pub(super) bucket: String,
    pub(super) key: String,
    pub(super) content_type: Option<String>,
    pub(super) metadata: BTreeMap<String, String>,
    initiated_ms: i64,
    #[serde(default)]
    pub(super) headers: StandardHeaders,
    /// The checksum algorithm (S3's name) and whether the object's checksum is composite.
    #[serde(default)]
    checksum: Option<(String, bool)>,
    #[serde(default)]
    pub(super) tags: BTreeMap<String, String>,
}

impl UploadInfo {
    /// The upload's checksum algorithm and whether the object's checksum is composite.
    pub(super) fn checksum(&self) -> Option<(Algorithm, bool)> {
        let (name, composite) = self.checksum.as_ref()?;
        Some((Algorithm::parse(name).ok()?, *composite))
    }

    /// The algorithm and type as `CreateMultipartUpload` and `ListParts` answer them.
    fn checksum_answer(&self) -> (Option<ChecksumAlgorithm>, Option<ChecksumType>) {
        match self.checksum() {
            Some((a, composite)) => (
                Some(ChecksumAlgorithm::from_static(a.name())),
                Some(ChecksumType::from_static(if composite {
                    ChecksumType::COMPOSITE
                } else {
                    ChecksumType::FULL_OBJECT
                })),
            ),
            None => (None, None),
        }
    }
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
    pub(super) fn info(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
    ) -> S3Result<(PathBuf, UploadInfo)> {
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

pub(super) fn part_path(dir: &Path, number: i32) -> PathBuf {
    dir.join(format!("{number}.part"))
}

/// `InvalidArgument` unless `number` is a part number (1 to 10,000).
pub(super) fn check_part_number(number: i32) -> S3Result<()> {
    if (1..=MAX_PART_NUMBER).contains(&number) {
        Ok(())
    } else {
        Err(s3_error!(
            InvalidArgument,
            "part numbers are 1 to {MAX_PART_NUMBER}"
        ))
    }
}

/// Upload `id` of (`bucket`, `key`): its folder and what it will become.
pub(super) async fn upload(
    state: &S3State,
    id: &str,
    bucket: &str,
    key: &str,
) -> S3Result<(PathBuf, UploadInfo)> {
    let uploads = state.uploads.clone();
    let (id, bucket, key) = (id.to_string(), bucket.to_string(), key.to_string());
    blocking(move || uploads.info(&id, &bucket, &key)).await
}

/// Keeps `bytes` as part `number` of the upload in `dir`, replacing an earlier one.
pub(super) async fn write_part(dir: &Path, number: i32, bytes: bytes::Bytes) -> S3Result<()> {
    let path = part_path(dir, number);
    blocking(move || std::fs::write(&path, &bytes).map_err(internal)).await
}

/// The checksum answered for a part: the one the client sent (verified), else the one of
/// the upload's algorithm; none when neither.
pub(super) fn part_checksum(sent: &Checksum, info: &UploadInfo, bytes: &[u8]) -> Checksum {
    if let Some((a, value)) = checksums::sent(sent) {
        return a.dto(value);
    }
    match info.checksum() {
        Some((a, _)) => a.dto(a.base64(bytes)),
        None => Checksum::default(),
    }
}

/// `CreateMultipartUpload`: what the object will be (type, metadata, standard headers,
/// checksum algorithm and type, tags), checked before anything is staged.
pub(crate) async fn create(
    state: &S3State,
    input: CreateMultipartUploadInput,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    require(state, &input.bucket).await?;
    let checksum = checksums::of_multipart(
        input.checksum_algorithm.as_ref(),
        input.checksum_type.as_ref(),
    )?;
    let info = UploadInfo {
        bucket: input.bucket.clone(),
        key: input.key.clone(),
        content_type: input.content_type,
        metadata: input.metadata.unwrap_or_default().into_iter().collect(),
        initiated_ms: ndpipe_util::time::now_ms(),
        headers: headers::given(
            input.cache_control,
            input.content_disposition,
            input.content_encoding,
            input.content_language,
            input.expires.as_ref(),
        ),
        checksum: checksum.map(|(a, composite)| (a.name().to_string(), composite)),
        tags: tagging::from_header(input.tagging.as_deref())?,
    };
    let (checksum_algorithm, checksum_type) = info.checksum_answer();
    let uploads = state.uploads.clone();
    let id = blocking(move || uploads.create(&info).map_err(internal)).await?;
    Ok(S3Response::new(CreateMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(id),
        checksum_algorithm,
        checksum_type,
        ..CreateMultipartUploadOutput::default()
    }))
}

/// `UploadPart`: the part's body read under the upload limit, checksums verified, kept until
/// the upload completes or is aborted; its ETag is its MD5, and its checksum is answered (see
/// [`part_checksum`]).
pub(crate) async fn upload_part(
    state: &S3State,
    mut req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    body::refuse_unsigned_chunks(&req.headers, req.credentials.is_some())?;
    let trailers = req.trailing_headers.take();
    let input = req.input;
    check_part_number(input.part_number)?;
    let (dir, info) = upload(state, &input.upload_id, &input.bucket, &input.key).await?;
    let expected = Expected {
        content_md5: input.content_md5,
        checksum: Checksum {
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_crc64nvme: input.checksum_crc64nvme,
            checksum_sha1: input.checksum_sha1,
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
    let sum = part_checksum(&part.checksum, &info, &part.bytes);
    write_part(&dir, input.part_number, part.bytes).await?;
    let mut out = UploadPartOutput {
        e_tag: Some(ETag::Strong(hex::encode(part.md5))),
        ..UploadPartOutput::default()
    };
    set_checksum!(out, sum);
    Ok(S3Response::new(out))
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
    let (listed, truncated, info) = blocking(move || {
        let (dir, info) = uploads.info(&id, &bucket, &key)?;
        let mut out = Vec::new();
        let all = parts(&dir).map_err(internal)?;
        let after: Vec<_> = all.into_iter().filter(|p| p.0 > marker).collect();
        for &(number, size, modified) in after.iter().take(max) {
            let bytes = std::fs::read(part_path(&dir, number)).map_err(internal)?;
            let mut part = Part {
                part_number: Some(number),
                size: i64::try_from(size).ok(),
                e_tag: Some(ETag::Strong(hex::encode(Md5::checksum(&bytes)))),
                last_modified: Some(timestamp(modified)),
                ..Part::default()
            };
            set_checksum!(part, part_checksum(&Checksum::default(), &info, &bytes));
            out.push(part);
        }
        Ok((out, after.len() > max, info))
    })
    .await?;
    let next = listed.last().and_then(|p| p.part_number);
    let (checksum_algorithm, checksum_type) = info.checksum_answer();
    Ok(S3Response::new(ListPartsOutput {
        checksum_algorithm,
        checksum_type,
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
