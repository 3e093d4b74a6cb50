//! The S3-compatible API of a PipeStore (`--s3-listen`), built on the `s3s` crate: it parses
//! requests (path-style and virtual-host-style), verifies SigV4 signatures and writes S3's XML;
//! this module maps each operation onto the store.
//!
//! Objects are photos: an image PUT goes through the same ingest as `POST /v1/photos` (durable
//! write, tensor, labels, features) and its catalog row gets a bucket and a key; anything else
//! (a sidecar) is a plain object kept in a file. Overwriting a key replaces the photo. In a
//! replicated cluster both kinds are placed on `replicas` PipeStores, so that every node's S3
//! API and a gateway's serve every object (`crate::objects`). Operations this module does not
//! implement answer `NotImplemented` in S3's XML, and so do the headers of features it does not
//! have (`refuse`): nothing is ever accepted and then ignored.
//!
//! - `service`: the `s3s::S3` implementation, one line per operation;
//! - `buckets`, `objects` (put, delete, copy), `get` (GET and HEAD: whole, range or part),
//!   `listing` (ListObjectsV2 and V1), `versions` (every object its one `null` version),
//!   `multipart` (staging, parts), `complete` (CompleteMultipartUpload), `part_copy`
//!   (UploadPartCopy), `attributes` (GetObjectAttributes), `labels` (the labels header and the
//!   labels' tags), `tagging` (the user's tags);
//! - what an object carries besides its bytes: `headers` (Cache-Control, Expires, ...),
//!   `checksums` (CRC32, CRC32C, CRC64NVME, SHA1, SHA256; full or composite);
//! - `auth`: SigV4 with access keys and a role check for every operation;
//! - `refuse`: every refusal of what is not implemented (SigV2, encryption, ACLs, ...);
//! - `front`: around the `s3s` service: request ids, the refusals before parsing;
//! - `body`: reading a body whole under the upload limit, with its checksums verified;
//! - `conditions`: conditional requests (`If-Match`, `If-None-Match`, `If-Modified-Since`,
//!   `If-Unmodified-Since`, CopyObject's `x-amz-copy-source-if-*`);
//! - `errors`: internal errors as S3 errors; `host`: virtual-host-style bucket names;
//! - `serve`: the listener.

mod attributes;
mod auth;
mod body;
mod buckets;
mod checksums;
mod complete;
mod conditions;
mod errors;
mod front;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod get;
mod headers;
mod host;
mod labels;
mod listing;
mod multipart;
mod objects;
mod part_copy;
pub(crate) mod refuse;
mod serve;
mod service;
mod tagging;
mod versions;

use std::sync::Arc;

use ndpipe_catalog::Catalog;
use s3s::S3Error;

use crate::objects::SharedObjects;

pub(crate) use multipart::Uploads;
pub(crate) use serve::serve;
pub(crate) use service::service;

/// S3's largest part number.
const MAX_PART_NUMBER: i32 = 10_000;

/// What the S3 operations work with.
pub(crate) struct S3State {
    /// Where objects' bytes go.
    pub(crate) objects: SharedObjects,
    /// Buckets and object rows (and, for labels, predictions).
    pub(crate) catalog: Arc<dyn Catalog>,
    /// Multipart uploads in progress, staged here until they complete.
    pub(crate) uploads: Arc<Uploads>,
    pub(crate) max_upload_bytes: usize,
}

/// Runs blocking work (catalog queries, file reads) off the async runtime, waiting at most the
/// catalog deadline (then `ServiceUnavailable`); a failed task is a 500.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, S3Error> + Send + 'static,
) -> Result<T, S3Error> {
    match crate::catalog_deadline::within(f).await {
        Ok(done) => done.map_err(errors::internal)?,
        Err(late) => Err(errors::catalog(crate::catalog_deadline::unavailable(late))),
    }
}
