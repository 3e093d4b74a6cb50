//! Replication: the PipeStores of a cluster as one store. Any node's client API is a front door
//! for the whole cluster: it places each upload on `replicas` live nodes by weighted rendezvous
//! hashing ([`placement`]), has the first of them (the primary) ingest and label it once and
//! copy the original, tensor and features to the others, and answers only when every copy is durable and the
//! catalog names them. Reads take any copy, verify it, and fall back to another copy when one
//! is damaged or missing, repairing it. Deletes write a tombstone first, so a node that was away
//! drops its copy when it returns. A background worker ([`repair`]) brings photos back to
//! `replicas` copies after a node is removed, drops what tombstones and unfinished uploads
//! leave, and scrubs the local copies; it also moves photos onto a node that joined
//! ([`rebalance`]). Plain objects' files (S3 objects that are not photos) are replicated the
//! same way, without tensors or features ([`blobs`]). The front-door logic itself ([`front`]) needs no local
//! store: `ndpipe gateway` runs it alone.
//!
//! Replication needs a shared catalog (PostgreSQL): the replica map is
//! [`ndpipe_catalog::ReplicaCatalog`].

mod blob_upkeep;
mod blobs;
mod copies;
mod detour;
mod front;
mod metrics;
mod peers;
mod placement;
mod rebalance;
mod repair;

use std::sync::Arc;

use ndpipe_catalog::{
    CatalogError, GroundTruth, PhotoIdBlocks, PhotoMeta, PhotoRecord, ReplicaCatalog,
};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};

use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::Uploaded;
use crate::inference::model::SharedModel;
use crate::ingest::{IngestError, Ingestor};
use crate::metrics::StoreMetrics;
use crate::storage::{Blobs, FeatureStore, PhotoStore, StoreError};
pub(crate) use blobs::StoredBlob;
pub(crate) use copies::CopyError;
pub(crate) use front::{ClusterStatus, FrontDoor, FrontDoorConfig};
pub(crate) use metrics::ReplicationMetrics;
pub(crate) use repair::RepairConfig;

/// Why a replicated operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicationError {
    /// Fewer live nodes than copies wanted.
    #[error("{wanted} copies are wanted but only {live} nodes are live and active")]
    NotEnoughNodes {
        /// Copies wanted.
        wanted: u32,
        /// Nodes that could take one.
        live: usize,
    },
    /// Another node could not be reached or refused.
    #[error("node {url}: {reason}")]
    Peer {
        /// The node's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The primary answered an error, as `status kind message`.
    #[error("{0}")]
    Remote(tonic::Status),
    /// No intact copy of a plain object's file could be read.
    #[error("no intact copy of plain object file {name} could be read: {reason}")]
    NoIntactFile {
        /// The file.
        name: String,
        /// What each holder answered.
        reason: String,
    },
    /// The local plain objects' files could not be read or written.
    #[error("plain objects' files: {0}")]
    Files(#[from] std::io::Error),
    /// No copy of the photo could be read intact.
    #[error("no intact copy of photo {id} could be read: {reason}")]
    NoIntactCopy {
        /// The photo.
        id: u64,
        /// What each holder answered.
        reason: String,
    },
    /// The local ingest failed.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A node was asked to drop its copy of a photo it is the primary of.
    #[error("node {node} is photo {id}'s primary: it keeps its copy until it hands the photo over")]
    IsPrimary {
        /// The photo.
        id: u64,
        /// The node.
        node: String,
    },
    /// A worker task died.
    #[error("internal error: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// One node's part of the replicated store: the cluster's front door on this node, with the
/// local shortcuts (ingesting as the primary, the local copy first) and the copies it holds.
pub(crate) struct Replication {
    name: String,
    front: FrontDoor,
    repair: RepairConfig,
    catalog: Arc<dyn ReplicaCatalog>,
    blocks: Arc<dyn PhotoIdBlocks>,
    store: Arc<PhotoStore>,
    blobs: Arc<Blobs>,
    features: Arc<FeatureStore>,
    model: Option<SharedModel>,
    ingestor: Arc<Ingestor>,
    metrics: Arc<StoreMetrics>,
}

/// What a [`Replication`] is built from.
pub(crate) struct ReplicationParts {
    pub(crate) name: String,
    pub(crate) catalog: Arc<dyn ReplicaCatalog>,
    pub(crate) blocks: Arc<dyn PhotoIdBlocks>,
    pub(crate) store: Arc<PhotoStore>,
    /// The plain objects' files this node holds copies of.
    pub(crate) blobs: Arc<Blobs>,
    /// The features copies carry, sent and received.
    pub(crate) features: Arc<FeatureStore>,
    /// The model this node runs (`None`: none loaded; received features are then not kept).
    pub(crate) model: Option<SharedModel>,
    pub(crate) ingestor: Arc<Ingestor>,
    pub(crate) metrics: Arc<StoreMetrics>,
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) tls: Option<Tls>,
}

impl Replication {
    /// Node `parts.name`'s replication: a front door with `front`, a worker with `repair`.
    pub(crate) fn new(
        parts: ReplicationParts,
        front: FrontDoorConfig,
        repair: RepairConfig,
    ) -> Self {
        Replication {
            front: FrontDoor::new(
                Some(parts.name.clone()),
                (parts.catalog.clone(), parts.ingestor.exact().clone()),
                parts.metrics.clone(),
                (parts.secret, parts.tls),
                front,
            ),
            repair,
            name: parts.name,
            catalog: parts.catalog,
            blocks: parts.blocks,
            store: parts.store,
            blobs: parts.blobs,
            features: parts.features,
            model: parts.model,
            ingestor: parts.ingestor,
            metrics: parts.metrics,
        }
    }

    /// The cluster's front door on this node (listing, holders, status).
    pub(crate) fn front(&self) -> &FrontDoor {
        &self.front
    }

    /// Copies wanted of each photo.
    fn replicas(&self) -> u32 {
        self.front.replicas()
    }

    /// Stores an upload on `replicas` nodes: ingested here when this node is its primary,
    /// else forwarded to the primary ([`FrontDoor::upload`]); bytes the cluster already has
    /// are answered as `mode` says.
    pub(crate) async fn upload(
        &self,
        mode: ExactDuplicates,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ReplicationError> {
        let check = self.front.exact();
        check
            .upload(mode, bytes, truth, |b, t| self.place_here(b, t))
            .await
    }

    /// Places an upload and ingests it here as its primary, or has its primary ingest it (a
    /// primary that cannot be reached is passed over once).
    async fn place_here(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, ReplicationError> {
        let (primary, copies) = self.front.place(&bytes).await?;
        if primary.name == self.name {
            return self.ingest_primary(bytes, truth, copies).await;
        }
        match self
            .front
            .forward(&primary, copies, bytes.clone(), truth.clone())
            .await
        {
            // A primary that cannot be reached stored nothing: once more, around it.
            Err(ReplicationError::Remote(s)) if detour::forward_again(&s) => {
                let (primary, copies) = self.front.place(&bytes).await?;
                if primary.name == self.name {
                    return self.ingest_primary(bytes, truth, copies).await;
                }
                self.front.forward(&primary, copies, bytes, truth).await
            }
            done => done,
        }
    }

    /// Ingests an upload here, as its primary, copying it to `copies` before it is catalogued.
    pub(crate) async fn ingest_primary(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
        copies: Vec<pb::Peer>,
    ) -> Result<PhotoRecord, ReplicationError> {
        let record = self
            .ingestor
            .ingest_then(bytes, truth, |id, photo| {
                self.push_copies(id, photo, copies)
            })
            .await?;
        Ok(record)
    }

    /// Photo `id`'s original, from this node's copy or, when that is missing or damaged, from
    /// another holder's (repairing this node's copy from it). `None` when no such photo exists.
    pub(crate) async fn read(
        &self,
        id: u64,
    ) -> Result<Option<(PhotoMeta, Vec<u8>)>, ReplicationError> {
        let store = self.store.clone();
        let local = tokio::task::spawn_blocking(move || store.original(id)).await?;
        let damaged = match local {
            Ok(Some((entry, bytes))) => return Ok(Some((entry.meta, bytes))),
            Ok(None) => false,
            Err(StoreError::Corrupt { .. }) => true,
            Err(e) => return Err(e.into()),
        };
        let Some(copies) = self.front.copies_of(id).await? else {
            return Ok(None);
        };
        let copy = self.front.fetch_intact(&copies).await?;
        if damaged {
            self.metrics.replication.damaged.inc();
            self.replace_local(id, &copy).await?;
        }
        let meta = copies.meta;
        Ok(Some((meta, copy.original)))
    }

    /// Deletes photo `id` everywhere ([`FrontDoor::delete`]), this node's copy included.
    /// Whether the photo existed.
    pub(crate) async fn delete(&self, id: u64) -> Result<bool, ReplicationError> {
        let Some(copies) = self.front.delete(id).await? else {
            return Ok(false);
        };
        if copies.holders.contains(&self.name) {
            self.drop_local(id).await?;
        }
        Ok(true)
    }
}
