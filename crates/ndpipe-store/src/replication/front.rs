//! The front door of a replicated cluster, without a store of its own: it places each upload
//! on `replicas` live nodes and has the primary ingest it, reads any copy with its checksum
//! verified (falling back to the next holder), deletes behind a tombstone, and lists and
//! reports the whole cluster. A PipeStore's [`Replication`](super::Replication) runs one and
//! adds its local shortcuts (ingesting as the primary, reading and dropping its own copy); a
//! gateway runs one alone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_catalog::{
    GroundTruth, PhotoCopies, PhotoMeta, PhotoRecord, PlacementNode, Prediction, ReplicaCatalog,
    TaskName,
};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};
use ndpipe_util::sync::lock;
use sha2::{Digest, Sha256};

use super::copies::{intact, meta_from_json};
use super::detour::{self, Health};
use super::peers::Peers;
use super::{ReplicationError, placement};
use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::{ExactCheck, Uploaded};
use crate::metrics::StoreMetrics;

/// How long a front door reuses the node list it read from the catalog.
const NODES_TTL: Duration = Duration::from_secs(1);

/// Settings of a front door.
#[derive(Debug, Clone)]
pub(crate) struct FrontDoorConfig {
    /// Copies of each photo.
    pub(crate) replicas: u32,
    /// Deadline of each call to a node.
    pub(crate) peer_timeout: Duration,
    /// Deadline of a copy, and of the check that a primary is alive, before the upload goes
    /// to the next node of its placement.
    pub(crate) copy_timeout: Duration,
    /// Largest message between nodes: the largest upload, with room for its tensor.
    pub(crate) max_message: usize,
}

impl FrontDoorConfig {
    /// `replicas` copies, calls within `peer_timeout_ms` (copies within `copy_timeout_ms`),
    /// uploads up to `max_upload_bytes`.
    pub(crate) fn new(
        replicas: u32,
        (peer_timeout_ms, copy_timeout_ms): (u64, u64),
        max_upload_bytes: usize,
    ) -> Self {
        FrontDoorConfig {
            replicas,
            peer_timeout: Duration::from_millis(peer_timeout_ms.max(1)),
            copy_timeout: Duration::from_millis(copy_timeout_ms.max(1)),
            // The tensor of a photo is at most 3 x 224 x 224 f32 values (600 KiB) before
            // compression; the rest is metadata.
            max_message: max_upload_bytes.saturating_add(4 << 20),
        }
    }
}

/// A photo's labels by model version, and the versions active on its primary.
pub(crate) type ClusterLabels = (Vec<(String, Vec<Prediction>)>, Vec<String>);

/// The cluster as one store, seen from a front door.
pub(crate) struct FrontDoor {
    /// The node this front door runs on (`None`: a gateway, which holds no copy).
    here: Option<String>,
    pub(super) config: FrontDoorConfig,
    pub(super) catalog: Arc<dyn ReplicaCatalog>,
    pub(super) peers: Peers,
    pub(super) metrics: Arc<StoreMetrics>,
    /// The nodes that failed calls lately, passed over by placement.
    pub(super) health: Health,
    nodes: Mutex<Option<(Instant, Vec<PlacementNode>)>>,
    /// The exact-duplicate check of uploads (on the whole cluster's photos).
    exact: ExactCheck,
}

impl FrontDoor {
    /// A front door on node `here` (`None`: on no node) over the replica map `catalog`,
    /// calling the nodes with `secret` over `tls`, checking uploads with `exact`.
    pub(crate) fn new(
        here: Option<String>,
        (catalog, exact): (Arc<dyn ReplicaCatalog>, ExactCheck),
        metrics: Arc<StoreMetrics>,
        (secret, tls): (Option<ClusterSecret>, Option<Tls>),
        config: FrontDoorConfig,
    ) -> Self {
        FrontDoor {
            exact,
            here,
            peers: Peers::new(
                (secret, tls),
                config.peer_timeout,
                config.copy_timeout,
                config.max_message,
            ),
            health: Health::default(),
            config,
            catalog,
            metrics,
            nodes: Mutex::default(),
        }
    }

    /// The node this front door runs on (`None` on a gateway).
    pub(super) fn here(&self) -> Option<&String> {
        self.here.as_ref()
    }

    /// The largest message this front door sends or takes.
    pub(crate) fn max_message(&self) -> usize {
        self.config.max_message
    }

    /// The registered nodes, read at most once per [`NODES_TTL`].
    pub(super) async fn placement_nodes(&self) -> Result<Vec<PlacementNode>, ReplicationError> {
        if let Some((at, nodes)) = &*lock(&self.nodes)
            && at.elapsed() < NODES_TTL
        {
            return Ok(nodes.clone());
        }
        let catalog = self.catalog.clone();
        let nodes = crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
            catalog.placement_nodes()
        })
        .await?;
        *lock(&self.nodes) = Some((Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    /// How many registered nodes placement may choose now (live, active, above their
    /// free-space reserve), from a fresh read of the catalog.
    pub(crate) async fn nodes_taking_photos(&self) -> Result<usize, ReplicationError> {
        let catalog = self.catalog.clone();
        let nodes = crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
            catalog.placement_nodes()
        })
        .await?;
        Ok(nodes.iter().filter(|n| placement::eligible(n)).count())
    }

    /// Copies wanted of each photo.
    pub(crate) fn replicas(&self) -> u32 {
        self.config.replicas
    }

    /// Where an upload goes: its primary (the first node of its placement that answers), and
    /// the nodes after it that it is copied to; nodes that failed calls lately are passed
    /// over ([`detour`](super::detour)).
    pub(super) async fn place(
        &self,
        bytes: &[u8],
    ) -> Result<(PlacementNode, Vec<pb::Peer>), ReplicationError> {
        let wanted = self.config.replicas as usize;
        let key = placement::key_of(&hex::encode(Sha256::digest(bytes)));
        // Once more when a node did not answer: the order then passes over it, and counts
        // nodes whose lease ran out if they answer.
        let (mut chosen, at) = match self.primary_of(key, wanted).await? {
            (chosen, Some(at)) => (chosen, at),
            (_, None) => match self.primary_of(key, wanted).await? {
                (chosen, Some(at)) => (chosen, at),
                (chosen, None) => {
                    return Err(ReplicationError::NotEnoughNodes {
                        wanted: self.config.replicas,
                        live: chosen.len(),
                    });
                }
            },
        };
        let primary = chosen.remove(at);
        chosen.truncate(at + wanted - 1);
        chosen.drain(..at);
        Ok((primary, chosen.into_iter().map(peer_of).collect()))
    }

    /// The placement order of the photo with `key`, and where in it the primary is: the first
    /// node that answers with enough nodes after it for the copies (`None`: none).
    async fn primary_of(
        &self,
        key: u64,
        wanted: usize,
    ) -> Result<(Vec<PlacementNode>, Option<usize>), ReplicationError> {
        let chosen = self.order(key).await?;
        for (i, node) in chosen.iter().enumerate() {
            if wanted == 0 || chosen.len() - i < wanted {
                break;
            }
            if self.here.as_ref() == Some(&node.name) || self.alive(node).await {
                return Ok((chosen, Some(i)));
            }
        }
        Ok((chosen, None))
    }

    /// Stores an upload on `replicas` nodes: ingested by the primary, copied to the others, and
    /// catalogued once every copy is durable; bytes the cluster already has are answered as
    /// `mode` says, before anything is sent.
    pub(crate) async fn upload(
        &self,
        mode: ExactDuplicates,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, ReplicationError> {
        self.exact
            .upload(mode, bytes, truth, |b, t| self.place_and_forward(b, t))
            .await
    }

    /// The exact-duplicate check of this front door's uploads.
    pub(crate) fn exact(&self) -> &ExactCheck {
        &self.exact
    }

    /// Places an upload and has its primary ingest it; a primary that cannot be reached
    /// (nothing stored) is passed over once for the next node of the placement.
    async fn place_and_forward(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, ReplicationError> {
        let (primary, copies) = self.place(&bytes).await?;
        match self
            .forward(&primary, copies, bytes.clone(), truth.clone())
            .await
        {
            Err(ReplicationError::Remote(s)) if detour::forward_again(&s) => {
                let (primary, copies) = self.place(&bytes).await?;
                self.forward(&primary, copies, bytes, truth).await
            }
            done => done,
        }
    }

    /// Has `primary` ingest an upload and copy it to `copies` (`Replication/Ingest`).
    pub(super) async fn forward(
        &self,
        primary: &PlacementNode,
        copies: Vec<pb::Peer>,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, ReplicationError> {
        let (label, split, task) = match truth {
            Some(t) => (t.label, t.split.as_str().to_string(), t.task.to_string()),
            None => (String::new(), String::new(), String::new()),
        };
        let req = pb::IngestRequest {
            original: bytes.to_vec(),
            label,
            split,
            copies,
            task,
        };
        let reply = match self.peers.ingest(&primary.url, req).await {
            Ok(reply) => {
                self.health.answered(&primary.name);
                reply
            }
            Err(status) => {
                if detour::unreachable(&status) {
                    self.health.failed(&primary.name);
                }
                return Err(ReplicationError::Remote(status));
            }
        };
        let meta = meta_from_json(&reply.meta_json).map_err(|reason| ReplicationError::Peer {
            url: primary.url.clone(),
            reason,
        })?;
        Ok(PhotoRecord::new(reply.id, meta))
    }

    /// Photo `id`'s catalog row and holders; `None` when it is deleted or was never catalogued.
    pub(crate) async fn copies_of(&self, id: u64) -> Result<Option<PhotoCopies>, ReplicationError> {
        let catalog = self.catalog.clone();
        crate::catalog_deadline::catalog::<_, ReplicationError>(move || catalog.copies(id)).await
    }

    /// Photo `id`'s labels by model version, from whichever node's row it is, and the versions
    /// active on its primary; `None` when it is deleted or was never catalogued.
    pub(crate) async fn labels_of(
        &self,
        id: u64,
    ) -> Result<Option<ClusterLabels>, ReplicationError> {
        let catalog = self.catalog.clone();
        crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
            match catalog.copies(id)? {
                Some(_) => Ok(Some((
                    catalog.cluster_predictions(id)?,
                    catalog.primary_active_versions(id)?,
                ))),
                None => Ok(None),
            }
        })
        .await
    }

    /// Photo `id`'s labels under the versions active on its primary, per task, best first
    /// (a task is left out before the photo is labelled for it).
    pub(crate) async fn active_labels(
        &self,
        id: u64,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, ReplicationError> {
        let catalog = self.catalog.clone();
        crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
            catalog.cluster_active_predictions(id)
        })
        .await
    }

    /// Up to `limit` photos of the whole cluster after `after`, with their holders.
    pub(crate) async fn list(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<PhotoCopies>, ReplicationError> {
        let catalog = self.catalog.clone();
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
            catalog.list_cluster(after, limit)
        })
        .await
    }

    /// Photo `id`'s original from the first holder whose copy is intact. `None` when no such
    /// photo exists.
    pub(crate) async fn read(
        &self,
        id: u64,
    ) -> Result<Option<(PhotoMeta, Vec<u8>)>, ReplicationError> {
        let Some(copies) = self.copies_of(id).await? else {
            return Ok(None);
        };
        let copy = self.fetch_intact(&copies).await?;
        Ok(Some((copies.meta, copy.original)))
    }

    /// An intact copy of the photo from a holder other than this node, live ones first.
    pub(super) async fn fetch_intact(
        &self,
        copies: &PhotoCopies,
    ) -> Result<pb::PhotoCopy, ReplicationError> {
        let nodes = self.placement_nodes().await?;
        let mut holders: Vec<_> = nodes
            .iter()
            .filter(|n| Some(&n.name) != self.here.as_ref() && copies.holders.contains(&n.name))
            .collect();
        holders.sort_by_key(|n| !n.live);
        let mut tried = Vec::new();
        for node in holders {
            match self.peers.read_copy(&node.url, copies.id).await {
                Ok(copy) if intact(&copies.meta, &copy.original) => return Ok(copy),
                Ok(_) => tried.push(format!("{}: damaged in transit", node.name)),
                Err(e) => tried.push(format!("{}: {}", node.name, e.message())),
            }
        }
        if tried.is_empty() {
            tried.push("no other node holds a copy".into());
        }
        Err(ReplicationError::NoIntactCopy {
            id: copies.id,
            reason: tried.join("; "),
        })
    }

    /// Deletes photo `id` everywhere but here: a tombstone and the catalog row first (in one
    /// transaction), then every other holder's copy; a holder that cannot be reached drops its
    /// copy when it returns. The photo's holders as they were (the caller drops its own
    /// copy), `None` when it did not exist.
    pub(crate) async fn delete(&self, id: u64) -> Result<Option<PhotoCopies>, ReplicationError> {
        let Some(copies) = self.copies_of(id).await? else {
            return Ok(None);
        };
        let catalog = self.catalog.clone();
        crate::catalog_deadline::catalog::<_, ReplicationError>(move || catalog.add_tombstone(id))
            .await?;
        let nodes = self.placement_nodes().await?;
        for holder in &copies.holders {
            if Some(holder) == self.here.as_ref() {
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
        Ok(Some(copies))
    }

    /// The cluster as this front door sees it.
    pub(crate) async fn status(&self) -> Result<ClusterStatus, ReplicationError> {
        let catalog = self.catalog.clone();
        let wanted = self.config.replicas;
        let (nodes, overview, counts, files) =
            crate::catalog_deadline::catalog::<_, ReplicationError>(move || {
                Ok((
                    catalog.placement_nodes()?,
                    catalog.node_overview()?,
                    catalog.replication_counts(wanted)?,
                    catalog.blob_counts(wanted)?,
                ))
            })
            .await?;
        let m = &self.metrics.replication;
        Ok(ClusterStatus {
            replicas: wanted,
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let seen = overview.iter().find(|o| o.name == n.name);
                    NodeStatus {
                        live: n.live,
                        active: n.active,
                        free_bytes: n.free_bytes,
                        last_seen_ms: seen.map(|o| o.last_seen_ms),
                        photos: seen.map(|o| o.photos),
                        name: n.name,
                    }
                })
                .collect(),
            at_target: counts.at_target,
            under_replicated: counts.under_replicated,
            lost: counts.lost,
            tombstones: counts.tombstones,
            plain_objects: PlainObjects {
                at_target: files.at_target,
                under_replicated: files.under_replicated,
                lost: files.lost,
            },
            copies_made: m.copies_made.get(),
            copies_received: m.copies_received.get(),
            repaired: m.repaired.get(),
            rebalanced: m.rebalanced.get(),
        })
    }
}

/// What `GET /v1/cluster` answers: the nodes placement sees, the cluster's copy counts and this
/// node's replication work (0 on a gateway).
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
    /// The copy counts of plain objects (S3 objects that are not photos).
    pub(crate) plain_objects: PlainObjects,
    /// This node's copies made by repair.
    pub(crate) copies_made: u64,
    /// This node's copies received.
    pub(crate) copies_received: u64,
    /// This node's damaged copies found and replaced.
    pub(crate) repaired: u64,
    /// This node's photos moved to where placement puts them.
    pub(crate) rebalanced: u64,
}

/// How many plain objects' files are at the wanted copies, below, or lost.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct PlainObjects {
    at_target: u64,
    under_replicated: u64,
    lost: u64,
}

/// A node as [`ClusterStatus`] shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct NodeStatus {
    name: String,
    live: bool,
    active: bool,
    free_bytes: Option<u64>,
    /// Its last heartbeat, ms since the Unix epoch.
    last_seen_ms: Option<i64>,
    /// The photos it holds a copy of.
    photos: Option<u64>,
}

/// A node as the peer a primary copies to.
pub(super) fn peer_of(node: PlacementNode) -> pb::Peer {
    pb::Peer {
        name: node.name,
        url: node.url,
    }
}
