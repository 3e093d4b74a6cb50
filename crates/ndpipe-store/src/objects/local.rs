//! One PipeStore on its own: photos in its store through its ingest, plain objects in its
//! files, one copy of each.

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::{
    Catalog, CatalogError, GroundTruth, PhotoId, PhotoMeta, Prediction, TaskName,
};
use sha2::{Digest, Sha256};

use super::{Objects, ObjectsError, PhotoPage, StoredPhoto, VersionedLabels, blocking, page_of};
use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::ingest::Ingestor;
use crate::replication::{ClusterStatus, StoredBlob};
use crate::storage::{Blobs, PhotoStore, blobs};

/// A PipeStore's own objects.
pub(crate) struct Local {
    ingestor: Arc<Ingestor>,
    store: Arc<PhotoStore>,
    blobs: Arc<Blobs>,
    catalog: Arc<dyn Catalog>,
}

impl Local {
    /// The objects of the node whose ingest, store, files and catalog these are.
    pub(crate) fn new(
        ingestor: Arc<Ingestor>,
        store: Arc<PhotoStore>,
        blobs: Arc<Blobs>,
        catalog: Arc<dyn Catalog>,
    ) -> Self {
        Local {
            ingestor,
            store,
            blobs,
            catalog,
        }
    }
}

#[async_trait::async_trait]
impl Objects for Local {
    fn exact_duplicates(&self) -> ExactDuplicates {
        self.ingestor.exact().mode()
    }

    async fn put_photo(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ObjectsError> {
        Ok(self.ingestor.upload(mode, bytes, truth).await?)
    }

    async fn read_photo(&self, id: PhotoId) -> Result<Option<(PhotoMeta, Vec<u8>)>, ObjectsError> {
        let store = self.store.clone();
        let found = blocking(move || store.original(id)).await?;
        Ok(found.map(|(entry, bytes)| (entry.meta, bytes)))
    }

    async fn photo(&self, id: PhotoId) -> Result<Option<StoredPhoto>, ObjectsError> {
        if self.ingestor.is_deleted(id) {
            return Ok(None);
        }
        let catalog = self.catalog.clone();
        let row = blocking(move || catalog.photo(id)).await?;
        Ok(row.map(|record| StoredPhoto {
            record,
            copies: None,
        }))
    }

    async fn page(&self, after: Option<u64>, limit: usize) -> Result<PhotoPage, ObjectsError> {
        // Rows of unfinished deletes are left out: ask for that many more.
        let asked = limit + 1 + self.ingestor.unfinished_deletes();
        let catalog = self.catalog.clone();
        let mut rows = blocking(move || catalog.list_photos(after, asked)).await?;
        rows.retain(|p| !self.ingestor.is_deleted(p.id));
        let photos = rows
            .into_iter()
            .map(|record| StoredPhoto {
                record,
                copies: None,
            })
            .collect();
        Ok(page_of(photos, limit))
    }

    async fn delete_photo(&self, id: PhotoId) -> Result<bool, ObjectsError> {
        Ok(self.ingestor.delete(id).await?)
    }

    async fn labels(&self, id: PhotoId) -> Result<Option<VersionedLabels>, ObjectsError> {
        if self.ingestor.is_deleted(id) {
            return Ok(None);
        }
        catalog_labels(&self.catalog, id).await
    }

    async fn active_labels(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, ObjectsError> {
        let catalog = self.catalog.clone();
        blocking(move || {
            let active = catalog.active_models()?;
            let mut all = catalog.predictions(id)?;
            Ok::<_, CatalogError>(
                active
                    .into_iter()
                    .filter_map(|v| {
                        let at = all.iter().position(|(version, _)| *version == v.id)?;
                        Some((v.task, all.swap_remove(at).1))
                    })
                    .collect(),
            )
        })
        .await
    }

    async fn put_blob(&self, bytes: Bytes) -> Result<StoredBlob, ObjectsError> {
        self.store.check_space(bytes.len() as u64)?;
        let blobs = self.blobs.clone();
        blocking(move || {
            let sha256 = hex::encode(Sha256::digest(&bytes));
            let name = blobs::new_name(&sha256);
            blobs.write(&name, &bytes).map_err(ObjectsError::Files)?;
            Ok::<_, ObjectsError>(StoredBlob { name, sha256 })
        })
        .await
    }

    async fn read_blob(&self, name: &str, _sha256: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        let (blobs, name) = (self.blobs.clone(), name.to_string());
        blocking(move || blobs.read(&name).map_err(ObjectsError::Files)).await
    }

    async fn delete_blob(&self, name: &str) -> Result<(), ObjectsError> {
        let (blobs, name) = (self.blobs.clone(), name.to_string());
        blocking(move || {
            blobs.remove(&name);
            Ok::<_, ObjectsError>(())
        })
        .await
    }

    async fn cluster(&self) -> Result<Option<ClusterStatus>, ObjectsError> {
        Ok(None)
    }

    /// From the stored tensor: no original is decoded.
    async fn thumbnail(&self, id: PhotoId) -> Result<Option<Vec<u8>>, ObjectsError> {
        let store = self.store.clone();
        let Some((_, blob)) = blocking(move || store.tensor(id)).await? else {
            return Ok(None);
        };
        let jpeg = tokio::task::spawn_blocking(move || super::thumbnail::from_tensor(&blob));
        Ok(Some(jpeg.await??))
    }
}

/// Photo `id`'s labels from this node's catalog, with the versions active here; `None` when
/// the catalog has no such photo.
pub(super) async fn catalog_labels(
    catalog: &Arc<dyn Catalog>,
    id: PhotoId,
) -> Result<Option<VersionedLabels>, ObjectsError> {
    let catalog = catalog.clone();
    blocking(move || {
        if catalog.photo(id)?.is_none() {
            return Ok(None);
        }
        let by_version = catalog.predictions(id)?;
        let active = (catalog.models()?.into_iter())
            .filter(|v| v.active)
            .map(|v| v.id)
            .collect();
        Ok::<_, CatalogError>(Some(VersionedLabels { by_version, active }))
    })
    .await
}
