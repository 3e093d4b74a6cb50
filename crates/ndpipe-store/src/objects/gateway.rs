//! A gateway: a front door that stores nothing, every copy on the cluster's PipeStores.

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::{GroundTruth, PhotoId, PhotoMeta, PhotoRecord, Prediction, TaskName};

use super::{Objects, ObjectsError, PhotoPage, StoredPhoto, VersionedLabels, page_of};
use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::replication::{ClusterStatus, FrontDoor, StoredBlob};

/// The cluster's objects, seen from a gateway.
pub(crate) struct Gateway {
    front: Arc<FrontDoor>,
}

impl Gateway {
    /// The objects behind `front`.
    pub(crate) fn new(front: Arc<FrontDoor>) -> Self {
        Gateway { front }
    }
}

#[async_trait::async_trait]
impl Objects for Gateway {
    fn exact_duplicates(&self) -> ExactDuplicates {
        self.front.exact().mode()
    }

    async fn put_photo(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ObjectsError> {
        Ok(self.front.upload(mode, bytes, truth).await?)
    }

    async fn read_photo(&self, id: PhotoId) -> Result<Option<(PhotoMeta, Vec<u8>)>, ObjectsError> {
        Ok(self.front.read(id).await?)
    }

    async fn photo(&self, id: PhotoId) -> Result<Option<StoredPhoto>, ObjectsError> {
        front_photo(&self.front, id).await
    }

    async fn page(&self, after: Option<u64>, limit: usize) -> Result<PhotoPage, ObjectsError> {
        front_page(&self.front, after, limit).await
    }

    async fn delete_photo(&self, id: PhotoId) -> Result<bool, ObjectsError> {
        Ok(self.front.delete(id).await?.is_some())
    }

    async fn labels(&self, id: PhotoId) -> Result<Option<VersionedLabels>, ObjectsError> {
        let found = self.front.labels_of(id).await?;
        Ok(found.map(|(by_version, active)| VersionedLabels { by_version, active }))
    }

    async fn active_labels(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, ObjectsError> {
        Ok(self.front.active_labels(id).await?)
    }

    async fn put_blob(&self, bytes: Bytes) -> Result<StoredBlob, ObjectsError> {
        Ok(self.front.put_blob(bytes).await?)
    }

    async fn read_blob(&self, name: &str, sha256: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        Ok(Some(self.front.read_blob(name, sha256, None).await?))
    }

    async fn delete_blob(&self, name: &str) -> Result<(), ObjectsError> {
        Ok(self.front.delete_blob(name).await?)
    }

    async fn cluster(&self) -> Result<Option<ClusterStatus>, ObjectsError> {
        Ok(Some(self.front.status().await?))
    }
}

/// Any node's photo `id` with its holders, from the cluster's replica map.
pub(super) async fn front_photo(
    front: &FrontDoor,
    id: PhotoId,
) -> Result<Option<StoredPhoto>, ObjectsError> {
    let found = front.copies_of(id).await?;
    Ok(found.map(|c| StoredPhoto {
        record: PhotoRecord::new(id, c.meta),
        copies: Some(c.holders),
    }))
}

/// A page of every node's photos with their holders.
pub(super) async fn front_page(
    front: &FrontDoor,
    after: Option<u64>,
    limit: usize,
) -> Result<PhotoPage, ObjectsError> {
    let copies = front.list(after, limit + 1).await?;
    let photos = copies
        .into_iter()
        .map(|c| StoredPhoto {
            record: PhotoRecord::new(c.id, c.meta),
            copies: Some(c.holders),
        })
        .collect();
    Ok(page_of(photos, limit))
}
