//! The S3 side of the catalog: buckets, and objects named by bucket and key. An object is
//! either a photo of the store (an image that went through ingest) or a plain object whose
//! bytes the PipeStore keeps in a blob file (a sidecar such as `.xmp` or `.json`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{CatalogError, PhotoId};

/// A bucket of the S3 API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// The bucket's name (unique).
    pub name: String,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
}

/// Where an object's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectBody {
    /// A photo of the store: an image with its tensor, labels and features.
    Photo(PhotoId),
    /// A plain object: the name of its blob file in the PipeStore's blob folder.
    Blob(String),
}

/// An object of the S3 API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// Its bucket.
    pub bucket: String,
    /// Its key (unique within the bucket).
    pub key: String,
    /// Where its bytes are.
    pub body: ObjectBody,
    /// Size in bytes.
    pub bytes: u64,
    /// The S3 ETag without quotes: the hex MD5 of the bytes, or for a multipart upload the MD5
    /// of the parts' MD5s followed by `-` and the number of parts.
    pub etag: String,
    /// Hex SHA-256 of the bytes (the store's checksum).
    pub sha256: String,
    /// MIME type given at upload (or found by decoding, for a photo).
    pub content_type: String,
    /// Last write, ms since the Unix epoch.
    pub modified_ms: i64,
    /// User metadata (`x-amz-meta-*` headers without the prefix), lowercase names.
    pub metadata: BTreeMap<String, String>,
    /// What S3 clients rely on besides the bytes: standard headers, checksum, parts.
    pub attributes: ObjectAttributes,
    /// The user's object tags (`PutObjectTagging`, `x-amz-tagging`), by key.
    pub tags: BTreeMap<String, String>,
}

/// What an object carries for S3 clients besides its bytes and metadata. Every field is
/// optional, so a row written before attributes existed reads back with none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ObjectAttributes {
    /// The standard headers given at upload, answered by GET and HEAD.
    #[serde(skip_serializing_if = "StandardHeaders::is_empty")]
    pub headers: StandardHeaders,
    /// The checksum given (or asked for) at upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<ObjectChecksum>,
    /// The parts of an object made by a multipart upload, in order; empty for one PUT.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<ObjectPart>,
    /// The multipart upload that made the object, so that a retried completion can be
    /// answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
}

/// The standard HTTP headers S3 keeps with an object, as the client sent them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StandardHeaders {
    /// `Cache-Control`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Content-Disposition`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    /// `Content-Encoding` (without `aws-chunked`, which only framed the upload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    /// `Content-Language`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// `Expires`, an HTTP date.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl StandardHeaders {
    /// Whether no header is kept.
    pub fn is_empty(&self) -> bool {
        *self == StandardHeaders::default()
    }
}

/// An object's checksum: of its bytes, or for a composite one of its parts' checksums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectChecksum {
    /// The algorithm, as S3 names it: `CRC32`, `CRC32C`, `CRC64NVME`, `SHA1` or `SHA256`.
    pub algorithm: String,
    /// The base64 value; a composite one ends with `-` and the number of parts.
    pub value: String,
    /// Whether it is the checksum of the parts' checksums (S3's `COMPOSITE` type) rather
    /// than of the bytes (`FULL_OBJECT`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub composite: bool,
}

/// One part of an object made by a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectPart {
    /// Its part number in the upload.
    pub number: u32,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its base64 checksum by the object's algorithm, if the object has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

impl ObjectRecord {
    /// The photo this object is, if it is one.
    pub fn photo_id(&self) -> Option<PhotoId> {
        match self.body {
            ObjectBody::Photo(id) => Some(id),
            ObjectBody::Blob(_) => None,
        }
    }
}

/// What an object write requires of the object at its key (S3's conditional writes). The
/// catalog checks it in the transaction that writes, so two writers cannot both pass it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PutCondition {
    /// Nothing: the write creates the object or replaces the one at the key.
    #[default]
    Always,
    /// Create only (`If-None-Match: *`): fails with [`CatalogError::PreconditionFailed`] when
    /// the key holds an object.
    Absent,
    /// Replace only (`If-Match`): the object at the key must have one of these ETags (without
    /// quotes; `*` stands for any). Fails with [`CatalogError::NotFound`] when the key holds no
    /// object and [`CatalogError::PreconditionFailed`] when its ETag is not listed; an empty
    /// list fails either way.
    Matches(Vec<String>),
}

impl PutCondition {
    /// Whether a write of (`bucket`, `key`) may replace `current`, the object there now: the
    /// error [`ObjectCatalog::put_object`](crate::ObjectCatalog::put_object) fails with if not.
    pub fn check(
        &self,
        bucket: &str,
        key: &str,
        current: Option<&ObjectRecord>,
    ) -> Result<(), CatalogError> {
        let what = || format!("object {bucket}/{key}");
        match (self, current) {
            (PutCondition::Always, _) | (PutCondition::Absent, None) => Ok(()),
            (PutCondition::Absent, Some(_)) => Err(CatalogError::PreconditionFailed {
                what: format!("{} exists", what()),
            }),
            (PutCondition::Matches(_), None) => Err(CatalogError::NotFound { what: what() }),
            (PutCondition::Matches(etags), Some(o)) => {
                if etags.iter().any(|e| e == "*" || *e == o.etag) {
                    Ok(())
                } else {
                    Err(CatalogError::PreconditionFailed {
                        what: format!("{} has ETag {}", what(), o.etag),
                    })
                }
            }
        }
    }
}

/// Keeps the rows of a key-ordered listing that start with `prefix`: the query asked for keys
/// from `prefix` on, so the first key without it ends the range.
pub(crate) fn within_prefix(rows: Vec<ObjectRecord>, prefix: &str) -> Vec<ObjectRecord> {
    rows.into_iter()
        .take_while(|o| o.key.starts_with(prefix))
        .collect()
}
