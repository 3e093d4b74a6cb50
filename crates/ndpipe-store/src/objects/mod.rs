//! Where an object's bytes live: the one seam that `/v1`, the S3 API and the gateway ask.
//!
//! [`Objects`] covers photos (put through ingest, read, metadata, pages, delete, labels) and
//! plain objects' files (put, read, delete). It has three implementations, one per deployment:
//! - [`Local`]: one PipeStore on its own, with single copies in its store and files;
//! - [`Replicated`]: a PipeStore of a replicated cluster, placing `replicas` copies and
//!   reading its own copy first;
//! - [`Gateway`]: a storage-less front door, every copy on the PipeStores.
//!
//! The catalog rows every deployment shares (buckets, object rows, tasks) stay with the
//! callers; what differs by deployment is here and nowhere else.

mod gateway;
mod local;
mod replicated;
mod thumbnail;

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::TaskName;
use ndpipe_catalog::{CatalogError, GroundTruth, PhotoId, PhotoMeta, PhotoRecord, Prediction};

use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::ingest::IngestError;
use crate::replication::{ClusterStatus, ReplicationError, StoredBlob};
use crate::storage::StoreError;
pub(crate) use gateway::Gateway;
pub(crate) use local::Local;
pub(crate) use replicated::Replicated;

/// Why an operation on objects failed; each cause keeps its own mapping to HTTP and S3.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ObjectsError {
    /// This node's ingest refused or failed.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The cluster could not do it (a node, a copy, the placement).
    #[error(transparent)]
    Cluster(#[from] ReplicationError),
    /// This node's store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// This node's plain objects' files could not be read or written.
    #[error("plain objects' files: {0}")]
    Files(std::io::Error),
    /// A thumbnail could not be made.
    #[error(transparent)]
    Thumbnail(#[from] thumbnail::ThumbnailError),
    /// A worker task died.
    #[error("internal error: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A stored photo: its catalog row, and the nodes holding its copies in a replicated cluster.
pub(crate) struct StoredPhoto {
    pub(crate) record: PhotoRecord,
    /// `None` where photos have one copy, on this node.
    pub(crate) copies: Option<Vec<String>>,
}

/// A page of stored photos in id order.
pub(crate) struct PhotoPage {
    pub(crate) photos: Vec<StoredPhoto>,
    /// The last id of this page when more follow.
    pub(crate) next_after: Option<u64>,
}

/// A photo's labels under every model version that labelled it, and the versions active
/// where it is labelled (its primary, in a cluster).
pub(crate) struct VersionedLabels {
    pub(crate) by_version: Vec<(String, Vec<Prediction>)>,
    pub(crate) active: Vec<String>,
}

/// Photos and plain objects' bytes, wherever this deployment keeps them.
#[async_trait::async_trait]
pub(crate) trait Objects: Send + Sync {
    /// What an upload of bytes the catalog already has does (`exact_duplicates`).
    fn exact_duplicates(&self) -> ExactDuplicates;

    /// Stores a photo durably (ingested once, labelled near its data), or with `mode`
    /// [`ExactDuplicates::Existing`] answers the photo that has its bytes already.
    async fn put_photo(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ObjectsError>;

    /// Photo `id`'s metadata and original; `None` when it is gone.
    async fn read_photo(&self, id: PhotoId) -> Result<Option<(PhotoMeta, Vec<u8>)>, ObjectsError>;

    /// Photo `id`'s catalog row (and holders); `None` when it is gone or being deleted.
    async fn photo(&self, id: PhotoId) -> Result<Option<StoredPhoto>, ObjectsError>;

    /// Up to `limit` photos after `after`, in id order.
    async fn page(&self, after: Option<u64>, limit: usize) -> Result<PhotoPage, ObjectsError>;

    /// Deletes photo `id`, every copy; whether it existed.
    async fn delete_photo(&self, id: PhotoId) -> Result<bool, ObjectsError>;

    /// Photo `id`'s labels under every version; `None` when it is gone.
    async fn labels(&self, id: PhotoId) -> Result<Option<VersionedLabels>, ObjectsError>;

    /// Photo `id`'s predictions by the versions its labeller runs, per task in task order,
    /// best first (a task is left out before the photo is labelled for it).
    async fn active_labels(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, ObjectsError>;

    /// Writes a plain object's bytes durably (on every copy's node); its file's name and the
    /// bytes' SHA-256.
    async fn put_blob(&self, bytes: Bytes) -> Result<StoredBlob, ObjectsError>;

    /// The bytes of file `name`, which must have `sha256`; `None` when it is gone.
    async fn read_blob(&self, name: &str, sha256: &str) -> Result<Option<Vec<u8>>, ObjectsError>;

    /// Removes file `name`, every copy.
    async fn delete_blob(&self, name: &str) -> Result<(), ObjectsError>;

    /// The replicated cluster as this front door sees it; `None` where photos have one copy.
    async fn cluster(&self) -> Result<Option<ClusterStatus>, ObjectsError>;

    /// A small JPEG of photo `id` (the console's thumbnails, which it caches); `None` when it
    /// is gone. By default the original is decoded and resized; a node with the stored
    /// tensor makes it from that.
    async fn thumbnail(&self, id: PhotoId) -> Result<Option<Vec<u8>>, ObjectsError> {
        let Some((_, original)) = self.read_photo(id).await? else {
            return Ok(None);
        };
        let jpeg = tokio::task::spawn_blocking(move || thumbnail::from_original(&original));
        Ok(Some(jpeg.await??))
    }
}

/// Shared handle to a deployment's objects.
pub(crate) type SharedObjects = Arc<dyn Objects>;

/// Runs blocking work (catalog queries, file reads) off the async runtime.
async fn blocking<T, E>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ObjectsError>
where
    T: Send + 'static,
    E: Into<ObjectsError> + Send + 'static,
{
    match crate::catalog_deadline::within(f).await {
        Ok(done) => done?.map_err(Into::into),
        Err(late) => Err(crate::catalog_deadline::unavailable(late).into()),
    }
}

/// A page of `limit` from rows fetched with one extra (`limit + 1` asked): the extra one
/// only says that more follow.
fn page_of(mut photos: Vec<StoredPhoto>, limit: usize) -> PhotoPage {
    let more = photos.len() > limit;
    photos.truncate(limit);
    let next_after = more.then(|| photos.last().map(|p| p.record.id)).flatten();
    PhotoPage { photos, next_after }
}
