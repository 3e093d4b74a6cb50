//! Where the S3 API keeps objects' bytes: on this PipeStore alone, through the cluster's front
//! door on a replicated PipeStore (this node's copies first), or through the front door of a
//! gateway, which holds nothing. Photos go through ingest and plain objects into files either
//! way; the object rows are in the catalog in every case.

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::{Catalog, GroundTruth, PhotoId, Prediction, TaskName};
use s3s::S3Result;
use s3s::crypto::{Checksum as _, Sha256};

use super::blocking;
use super::errors::{self, catalog as catalog_error};
use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::ingest::Ingestor;
use crate::replication::{FrontDoor, Replication, StoredBlob};
use crate::storage::{Blobs, PhotoStore, blobs};

/// The objects' bytes, by where they live.
pub(crate) enum Backend {
    /// One PipeStore on its own: photos in its store, plain objects in its files.
    Local {
        ingestor: Arc<Ingestor>,
        store: Arc<PhotoStore>,
        blobs: Arc<Blobs>,
    },
    /// A PipeStore of a replicated cluster: both on `replicas` nodes.
    Node(Arc<Replication>),
    /// A gateway: both on `replicas` PipeStores, none here.
    Gateway(Arc<FrontDoor>),
}

impl Backend {
    /// Stores a photo (ingested once, labelled near its data), or with `mode`
    /// [`ExactDuplicates::Existing`] answers the photo that has its bytes already.
    pub(crate) async fn put_photo(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
    ) -> S3Result<Uploaded> {
        match self {
            Backend::Local { ingestor, .. } => ingestor
                .upload_as(mode, bytes, truth)
                .await
                .map_err(errors::ingest),
            Backend::Node(r) => r
                .upload_as(mode, bytes, truth)
                .await
                .map_err(errors::replication),
            Backend::Gateway(f) => f
                .upload_as(mode, bytes, truth)
                .await
                .map_err(errors::replication),
        }
    }

    /// What an upload of bytes the catalog already has does here (`exact_duplicates`).
    pub(crate) fn exact_duplicates(&self) -> ExactDuplicates {
        match self {
            Backend::Local { ingestor, .. } => ingestor.exact().mode(),
            Backend::Node(r) => r.front().exact().mode(),
            Backend::Gateway(f) => f.exact().mode(),
        }
    }

    /// Photo `id`'s original; `None` when it is gone.
    pub(crate) async fn read_photo(&self, id: PhotoId) -> S3Result<Option<Vec<u8>>> {
        let found = match self {
            Backend::Local { store, .. } => {
                let store = store.clone();
                blocking(move || store.original(id).map_err(errors::store))
                    .await?
                    .map(|(_, bytes)| bytes)
            }
            Backend::Node(r) => r.read(id).await.map_err(errors::replication)?.map(|c| c.1),
            Backend::Gateway(f) => f.read(id).await.map_err(errors::replication)?.map(|c| c.1),
        };
        Ok(found)
    }

    /// Deletes photo `id` (every copy); a failure is the message to log.
    pub(crate) async fn delete_photo(&self, id: PhotoId) -> Result<(), String> {
        match self {
            Backend::Local { ingestor, .. } => ingestor
                .delete(id)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Backend::Node(r) => r.delete(id).await.map(drop).map_err(|e| e.to_string()),
            Backend::Gateway(f) => f.delete(id).await.map(drop).map_err(|e| e.to_string()),
        }
    }

    /// Writes a plain object's bytes durably (on every copy's node); its file's name and the
    /// bytes' SHA-256.
    pub(crate) async fn put_blob(&self, bytes: Bytes) -> S3Result<StoredBlob> {
        match self {
            Backend::Local { store, blobs, .. } => {
                store
                    .check_space(bytes.len() as u64)
                    .map_err(errors::store)?;
                let blobs = blobs.clone();
                blocking(move || {
                    let sha256 = hex::encode(Sha256::checksum(&bytes));
                    let name = blobs::new_name(&sha256);
                    blobs.write(&name, &bytes).map_err(errors::internal)?;
                    Ok(StoredBlob { name, sha256 })
                })
                .await
            }
            Backend::Node(r) => r.upload_blob(bytes).await.map_err(errors::replication),
            Backend::Gateway(f) => f.put_blob(bytes).await.map_err(errors::replication),
        }
    }

    /// The bytes of file `name`, which must have `sha256`; `None` when it is gone.
    pub(crate) async fn read_blob(&self, name: &str, sha256: &str) -> S3Result<Option<Vec<u8>>> {
        match self {
            Backend::Local { blobs, .. } => {
                let (blobs, name) = (blobs.clone(), name.to_string());
                blocking(move || blobs.read(&name).map_err(errors::internal)).await
            }
            Backend::Node(r) => r
                .read_blob(name, sha256)
                .await
                .map(Some)
                .map_err(errors::replication),
            Backend::Gateway(f) => f
                .read_blob(name, sha256, None)
                .await
                .map(Some)
                .map_err(errors::replication),
        }
    }

    /// Removes file `name` (every copy); a failure is the message to log.
    pub(crate) async fn delete_blob(&self, name: &str) -> Result<(), String> {
        match self {
            Backend::Local { blobs, .. } => {
                let (blobs, name) = (blobs.clone(), name.to_string());
                tokio::task::spawn_blocking(move || blobs.remove(&name))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Backend::Node(r) => r.delete_blob(name).await.map_err(|e| e.to_string()),
            Backend::Gateway(f) => f.delete_blob(name).await.map_err(|e| e.to_string()),
        }
    }

    /// Photo `id`'s predictions by the versions its labeller runs, per task in task order,
    /// best first (a task is left out before the photo is labelled for it).
    pub(crate) async fn active_labels(
        &self,
        catalog: &Arc<dyn Catalog>,
        id: PhotoId,
    ) -> S3Result<Vec<(TaskName, Vec<Prediction>)>> {
        match self {
            Backend::Local { .. } => {
                let catalog = catalog.clone();
                blocking(move || {
                    let active = catalog.active_models().map_err(catalog_error)?;
                    let mut all = catalog.predictions(id).map_err(catalog_error)?;
                    Ok(active
                        .into_iter()
                        .filter_map(|v| {
                            let at = all.iter().position(|(version, _)| *version == v.id)?;
                            Some((v.task, all.swap_remove(at).1))
                        })
                        .collect())
                })
                .await
            }
            Backend::Node(r) => r
                .front()
                .active_labels(id)
                .await
                .map_err(errors::replication),
            Backend::Gateway(f) => f.active_labels(id).await.map_err(errors::replication),
        }
    }
}
