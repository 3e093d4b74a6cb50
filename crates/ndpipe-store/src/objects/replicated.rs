//! A PipeStore of a replicated cluster: every photo and file on `replicas` nodes, placed by
//! the cluster's front door on this node, this node's own copies read first.

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::{Catalog, GroundTruth, PhotoId, PhotoMeta, Prediction, TaskName};

use super::gateway::{front_page, front_photo};
use super::local::catalog_labels;
use super::{Objects, ObjectsError, PhotoPage, StoredPhoto, VersionedLabels};
use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::ingest::Ingestor;
use crate::replication::{ClusterStatus, Replication, StoredBlob};

/// The cluster's objects, as a PipeStore that holds some of them sees them.
pub(crate) struct Replicated {
    replication: Arc<Replication>,
    /// This node's ingest, whose unfinished deletes are already gone to clients.
    ingestor: Arc<Ingestor>,
    /// This node's catalog, whose photos' labels are answered without asking the cluster's.
    catalog: Arc<dyn Catalog>,
}

impl Replicated {
    /// The objects of the node whose replication, ingest and catalog these are.
    pub(crate) fn new(
        replication: Arc<Replication>,
        ingestor: Arc<Ingestor>,
        catalog: Arc<dyn Catalog>,
    ) -> Self {
        Replicated {
            replication,
            ingestor,
            catalog,
        }
    }
}

#[async_trait::async_trait]
impl Objects for Replicated {
    fn exact_duplicates(&self) -> ExactDuplicates {
        self.replication.front().exact().mode()
    }

    async fn put_photo(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ObjectsError> {
        Ok(self.replication.upload(mode, bytes, truth).await?)
    }

    async fn read_photo(&self, id: PhotoId) -> Result<Option<(PhotoMeta, Vec<u8>)>, ObjectsError> {
        Ok(self.replication.read(id).await?)
    }

    async fn photo(&self, id: PhotoId) -> Result<Option<StoredPhoto>, ObjectsError> {
        if self.ingestor.is_deleted(id) {
            return Ok(None);
        }
        front_photo(self.replication.front(), id).await
    }

    async fn page(&self, after: Option<u64>, limit: usize) -> Result<PhotoPage, ObjectsError> {
        front_page(self.replication.front(), after, limit).await
    }

    async fn delete_photo(&self, id: PhotoId) -> Result<bool, ObjectsError> {
        Ok(self.replication.delete(id).await?)
    }

    async fn labels(&self, id: PhotoId) -> Result<Option<VersionedLabels>, ObjectsError> {
        if self.ingestor.is_deleted(id) {
            return Ok(None);
        }
        if let Some(here) = catalog_labels(&self.catalog, id).await? {
            return Ok(Some(here));
        }
        let found = self.replication.front().labels_of(id).await?;
        Ok(found.map(|(by_version, active)| VersionedLabels { by_version, active }))
    }

    async fn active_labels(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, ObjectsError> {
        Ok(self.replication.front().active_labels(id).await?)
    }

    async fn put_blob(&self, bytes: Bytes) -> Result<StoredBlob, ObjectsError> {
        Ok(self.replication.upload_blob(bytes).await?)
    }

    async fn read_blob(&self, name: &str, sha256: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        Ok(Some(self.replication.read_blob(name, sha256).await?))
    }

    async fn delete_blob(&self, name: &str) -> Result<(), ObjectsError> {
        Ok(self.replication.delete_blob(name).await?)
    }

    async fn cluster(&self) -> Result<Option<ClusterStatus>, ObjectsError> {
        Ok(Some(self.replication.front().status().await?))
    }
}
