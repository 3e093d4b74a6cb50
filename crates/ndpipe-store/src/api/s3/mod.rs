//! The S3-compatible API of a PipeStore (`--s3-listen`), built on the `s3s` crate: it parses
//! requests (path-style and virtual-host-style), verifies SigV4 signatures and writes S3's XML;
//! this module maps each operation onto the store.
//!
//! Objects are photos: an image PUT goes through the same ingest as `POST /v1/photos` (durable
//! write, tensor, labels, features) and its catalog row gets a bucket and a key; anything else
//! (a sidecar) is a plain object kept in a blob file (`blobs`). Overwriting a key replaces the
//! photo. Operations this module does not implement answer `NotImplemented` in S3's XML.
//!
//! - `service`: the `s3s::S3` implementation, one line per operation;
//! - `buckets`, `objects` (put, get with range, head, delete, copy), `listing`
//!   (ListObjectsV2 and V1), `multipart`, `labels` (tags and the labels header);
//! - `auth`: SigV4 with access keys and a role check for every operation;
//! - `body`: reading a body whole under the upload limit, with its checksums verified;
//! - `blobs`: the plain objects' files; `errors`: internal errors as S3 errors; `host`:
//!   virtual-host-style bucket names;
//! - `serve`: the listener.

mod auth;
mod blobs;
mod body;
mod buckets;
mod errors;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod host;
mod labels;
mod listing;
mod multipart;
mod objects;
mod serve;
mod service;

use std::sync::Arc;

use ndpipe_catalog::Catalog;
use s3s::S3Error;

use crate::ingest::Ingestor;
use crate::replication::Replication;
use crate::storage::PhotoStore;

pub(crate) use blobs::Blobs;
pub(crate) use multipart::Uploads;
pub(crate) use serve::serve;
pub(crate) use service::service;

/// The node's parts the S3 API is built on.
pub(crate) struct S3Parts {
    pub(crate) ingestor: Arc<Ingestor>,
    pub(crate) store: Arc<PhotoStore>,
    pub(crate) catalog: Arc<dyn Catalog>,
    /// With replication, photo objects are stored, read and deleted through the cluster's
    /// front door (plain objects stay on the node that took them).
    pub(crate) replication: Option<Arc<Replication>>,
}

/// What the S3 operations work with.
pub(crate) struct S3State {
    pub(crate) ingestor: Arc<Ingestor>,
    pub(crate) store: Arc<PhotoStore>,
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) replication: Option<Arc<Replication>>,
    pub(crate) blobs: Arc<Blobs>,
    pub(crate) uploads: Arc<Uploads>,
    pub(crate) max_upload_bytes: usize,
}

/// Runs blocking work (catalog queries, file reads) off the async runtime; a failed task is a
/// 500.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, S3Error> + Send + 'static,
) -> Result<T, S3Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(errors::internal)?
}
