//! Replication: the PipeStores of a cluster as one store. Any node's client API is a front door
//! for the whole cluster: it places each upload on `replicas` live nodes by weighted rendezvous
//! hashing ([`placement`]), has the first of them (the primary) ingest it once and copy the
//! original and tensor to the others, and answers only when every copy is durable and the
//! catalog names them. Reads take any copy, verify it, and fall back to another copy when one
//! is damaged or missing, repairing it. Deletes write a tombstone first, so a node that was away
//! drops its copy when it returns. A background worker ([`repair`]) brings photos back to
//! `replicas` copies after a node is removed, drops what tombstones and unfinished uploads
//! leave, and scrubs the local copies.
//!
//! Replication needs a shared catalog (PostgreSQL): the replica map is
//! [`ndpipe_catalog::ReplicaCatalog`].

mod copies;
mod metrics;
mod peers;
mod placement;
mod repair;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_catalog::{
    CatalogError, GroundTruth, PhotoIdBlocks, PhotoMeta, PhotoRecord, PlacementNode, ReplicaCatalog,
};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};
use ndpipe_util::sync::lock;

use crate::ingest::{IngestError, Ingestor};
use crate::metrics::StoreMetrics;
use crate::storage::{PhotoStore, StoreError};
pub(crate) use copies::CopyError;
pub(crate) use metrics::ReplicationMetrics;
use peers::Peers;
pub(crate) use repair::RepairConfig;

/// How long a front door reuses the node list it read from the catalog.
const NODES_TTL: Duration = Duration::from_secs(1);

/// Settings of replication.
#[derive(Debug, Clone)]
pub(crate) struct ReplicationConfig {
    /// Copies of each photo (1: placement only).
    pub(crate) replicas: u32,
    /// Deadline of each call to another node.
    pub(crate) peer_timeout: Duration,
    /// Largest message between nodes: the largest upload, with room for its tensor.
    pub(crate) max_message: usize,
    /// The background worker's settings.
    pub(crate) repair: RepairConfig,
}

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
    /// A worker task died.
    #[error("internal error: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// One node's part of the replicated store.
pub(crate) struct Replication {
    name: String,
    config: ReplicationConfig,
    catalog: Arc<dyn ReplicaCatalog>,
    blocks: Arc<dyn PhotoIdBlocks>,
    store: Arc<PhotoStore>,
    ingestor: Arc<Ingestor>,
    metrics: Arc<StoreMetrics>,
    peers: Peers,
    nodes: Mutex<Option<(Instant, Vec<PlacementNode>)>>,
}

/// What a [`Replication`] is built from.
pub(crate) struct ReplicationParts {
    pub(crate) name: String,
    pub(crate) catalog: Arc<dyn ReplicaCatalog>,
    pub(crate) blocks: Arc<dyn PhotoIdBlocks>,
    pub(crate) store: Arc<PhotoStore>,
    pub(crate) ingestor: Arc<Ingestor>,
    pub(crate) metrics: Arc<StoreMetrics>,
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) tls: Option<Tls>,
}

impl Replication {
    /// Node `parts.name`'s replication with `config`.
    pub(crate) fn new(parts: ReplicationParts, config: ReplicationConfig) -> Self {
        Replication {
            peers: Peers::new(
                parts.secret,
                parts.tls,
                config.peer_timeout,
                config.max_message,
            ),
            name: parts.name,
            config,
            catalog: parts.catalog,
            blocks: parts.blocks,
            store: parts.store,
            ingestor: parts.ingestor,
            metrics: parts.metrics,
            nodes: Mutex::default(),
        }
    }

    /// The registered nodes, read at most once per [`NODES_TTL`].
    async fn placement_nodes(&self) -> Result<Vec<PlacementNode>, ReplicationError> {
        if let Some((at, nodes)) = &*lock(&self.nodes)
            && at.elapsed() < NODES_TTL
        {
            return Ok(nodes.clone());
        }
        let catalog = self.catalog.clone();
        let nodes = tokio::task::spawn_blocking(move || catalog.placement_nodes()).await??;
        *lock(&self.nodes) = Some((Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    /// The largest message this node sends or takes from another node.
    pub(crate) fn max_message(&self) -> usize {
        self.config.max_message
    }

    /// Stores an upload on `replicas` nodes: ingested by the primary, copied to the others, and
    /// catalogued once every copy is durable.
    pub(crate) async fn upload(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, ReplicationError> {
        let nodes = self.placement_nodes().await?;
        let wanted = self.config.replicas;
        let chosen = placement::place(placement::key_of(&bytes), &nodes, wanted as usize);
        if chosen.len() < wanted as usize {
            return Err(ReplicationError::NotEnoughNodes {
                wanted,
                live: chosen.len(),
            });
        }
        let (primary, copies) = chosen.split_first().expect("at least one copy is wanted");
        let copies: Vec<pb::Peer> = copies
            .iter()
            .map(|n| pb::Peer {
                name: n.name.clone(),
                url: n.url.clone(),
            })
            .collect();
        if primary.name == self.name {
            return self.ingest_primary(bytes, truth, copies).await;
        }
        let (label, split) = match truth {
            Some(t) => (t.label, t.split.as_str().to_string()),
            None => (String::new(), String::new()),
        };
        let req = pb::IngestRequest {
            original: bytes.to_vec(),
            label,
            split,
            copies,
        };
        let reply = self
            .peers
            .ingest(&primary.url, req)
            .await
            .map_err(ReplicationError::Remote)?;
        let meta =
            copies::meta_from_json(&reply.meta_json).map_err(|reason| ReplicationError::Peer {
                url: primary.url.clone(),
                reason,
            })?;
        Ok(PhotoRecord { id: reply.id, meta })
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

    /// Photo `id`'s catalog row and holders; `None` when it is deleted or was never catalogued.
    pub(crate) async fn copies_of(
        &self,
        id: u64,
    ) -> Result<Option<ndpipe_catalog::PhotoCopies>, ReplicationError> {
        let catalog = self.catalog.clone();
        Ok(tokio::task::spawn_blocking(move || catalog.copies(id)).await??)
    }

    /// Up to `limit` photos of the whole cluster after `after`, with their holders.
    pub(crate) async fn list(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<ndpipe_catalog::PhotoCopies>, ReplicationError> {
        let catalog = self.catalog.clone();
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        Ok(tokio::task::spawn_blocking(move || catalog.list_cluster(after, limit)).await??)
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
        let Some(copies) = self.copies_of(id).await? else {
            return Ok(None);
        };
        let copy = self.fetch_intact(&copies).await?;
        if damaged {
            self.metrics.replication.damaged.inc();
            self.replace_local(id, &copy).await?;
        }
        let meta = copies.meta;
        Ok(Some((meta, copy.original)))
    }

    /// Deletes photo `id` everywhere: a tombstone and the catalog row first (in one
    /// transaction), then every holder's copy; a holder that cannot be reached drops its copy
    /// when it returns. Whether the photo existed.
    pub(crate) async fn delete(&self, id: u64) -> Result<bool, ReplicationError> {
        let Some(copies) = self.copies_of(id).await? else {
            return Ok(false);
        };
        let catalog = self.catalog.clone();
        tokio::task::spawn_blocking(move || catalog.add_tombstone(id)).await??;
        let nodes = self.placement_nodes().await?;
        for holder in &copies.holders {
            if *holder == self.name {
                self.drop_local(id).await?;
                continue;
            }
            let Some(node) = nodes.iter().find(|n| n.name == *holder) else {
                continue;
            };
            if let Err(e) = self.peers.drop_copy(&node.url, id).await {
                tracing::warn!(photo = id, node = %holder, error = %e,
                    "a holder could not drop its copy now; it will when it returns");
            }
        }
        self.metrics.replication.deletes.inc();
        Ok(true)
    }
}

/// What `GET /v1/cluster` answers: the nodes placement sees, the cluster's copy counts and this
/// node's replication work.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ClusterStatus {
    /// Copies wanted of each photo.
    pub(crate) replicas: u32,
    /// Every registered node.
    pub(crate) nodes: Vec<NodeStatus>,
    /// Photos at the wanted copies.
    pub(crate) at_target: u64,
    /// Photos below it (at least one copy left).
    pub(crate) under_replicated: u64,
    /// Photos no registered node holds.
    pub(crate) lost: u64,
    /// Deleted photos remembered.
    pub(crate) tombstones: u64,
    /// This node's copies made by repair.
    pub(crate) copies_made: u64,
    /// This node's copies received.
    pub(crate) copies_received: u64,
    /// This node's damaged copies found and replaced.
    pub(crate) repaired: u64,
}

/// A node as [`ClusterStatus`] shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct NodeStatus {
    name: String,
    live: bool,
    active: bool,
    free_bytes: Option<u64>,
}

impl Replication {
    /// The cluster as this node sees it.
    pub(crate) async fn status(&self) -> Result<ClusterStatus, ReplicationError> {
        let catalog = self.catalog.clone();
        let wanted = self.config.replicas;
        let (nodes, counts) = tokio::task::spawn_blocking(move || {
            Ok::<_, CatalogError>((
                catalog.placement_nodes()?,
                catalog.replication_counts(wanted)?,
            ))
        })
        .await??;
        let m = &self.metrics.replication;
        Ok(ClusterStatus {
            replicas: wanted,
            nodes: nodes
                .into_iter()
                .map(|n| NodeStatus {
                    name: n.name,
                    live: n.live,
                    active: n.active,
                    free_bytes: n.free_bytes,
                })
                .collect(),
            at_target: counts.at_target,
            under_replicated: counts.under_replicated,
            lost: counts.lost,
            tombstones: counts.tombstones,
            copies_made: m.copies_made.get(),
            copies_received: m.copies_received.get(),
            repaired: m.repaired.get(),
        })
    }
}
