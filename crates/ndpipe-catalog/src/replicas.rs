//! Which nodes hold a copy of each photo, what was deleted, and where copies may go: what the
//! PipeStores of a replicated cluster share ([`ReplicaCatalog`]).

use crate::{BlobCatalog, CatalogError, PhotoId, PhotoMeta, Prediction, TaskName, TaskTruth};

/// A registered PipeStore as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementNode {
    /// Its name.
    pub name: String,
    /// Its gRPC URL.
    pub url: String,
    /// Whether its lease is live (it answered a heartbeat lately).
    pub live: bool,
    /// Whether it takes new photos (`active`, not `draining`).
    pub active: bool,
    /// Free bytes it last reported for new photos (`None` when it never did; 0 when it is
    /// below its free-space reserve).
    pub free_bytes: Option<u64>,
}

/// A registered PipeStore as the cluster's status shows it beside placement's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOverview {
    /// Its name.
    pub name: String,
    /// Its last heartbeat, ms since the Unix epoch.
    pub last_seen_ms: i64,
    /// The photos it holds a copy of.
    pub photos: u64,
}

/// A photo's catalog row as a front door needs it: its metadata, the node whose catalog view
/// it belongs to (its primary), and every node that holds a copy.
#[derive(Debug, Clone, PartialEq)]
pub struct PhotoCopies {
    /// The photo.
    pub id: PhotoId,
    /// Its metadata (the checksum every copy is verified against).
    pub meta: PhotoMeta,
    /// The node that labels it and answers for it in jobs.
    pub primary: String,
    /// Every node holding a copy, the primary included, by name.
    pub holders: Vec<String>,
}

/// How many photos of the cluster have how many copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationCounts {
    /// Photos with at least the wanted copies on registered nodes.
    pub at_target: u64,
    /// Photos with fewer copies than wanted, but at least one.
    pub under_replicated: u64,
    /// Photos no registered node holds.
    pub lost: u64,
    /// Deleted photos remembered so that a node coming back does not resurrect them.
    pub tombstones: u64,
}

/// What [`ReplicaCatalog::fail_over`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailOver {
    /// Photos whose primary became a live holder of a copy.
    pub moved: u64,
    /// Photos (up to 100, lowest ids first) that no other live node holds: they stay the lost
    /// node's.
    pub stranded: Vec<PhotoId>,
    /// How many photos that is in all.
    pub stranded_total: u64,
}

/// The replica map of a cluster's shared catalog; every method is one transaction. A handle is
/// one node's (the node that copies, holds and reports).
pub trait ReplicaCatalog: BlobCatalog + Send + Sync {
    /// Every registered node with its lease, state and reported free space.
    fn placement_nodes(&self) -> Result<Vec<PlacementNode>, CatalogError>;

    /// Every registered node's last heartbeat and how many photos it holds copies of (a
    /// status page's, not placement's: it counts).
    fn node_overview(&self) -> Result<Vec<NodeOverview>, CatalogError>;

    /// Records this node's free bytes for new photos (0 below its reserve), which placement
    /// weighs nodes by.
    fn report_free_space(&self, free_bytes: u64) -> Result<(), CatalogError>;

    /// Records that `node` holds a durable copy of photo `id` (kept when already recorded).
    fn add_copy(&self, id: PhotoId, node: &str) -> Result<(), CatalogError>;

    /// Forgets that `node` holds photo `id`.
    fn drop_copy(&self, id: PhotoId, node: &str) -> Result<(), CatalogError>;

    /// Photo `id`'s row and holders; `None` when it has no catalog row (never finished, or
    /// deleted).
    fn copies(&self, id: PhotoId) -> Result<Option<PhotoCopies>, CatalogError>;

    /// Up to `limit` photos of the whole cluster with ids above `after`, in id order, with
    /// their holders (a front door's listing).
    fn list_cluster(
        &self,
        after: Option<PhotoId>,
        limit: u32,
    ) -> Result<Vec<PhotoCopies>, CatalogError>;

    /// Photos recorded as held by this node, whichever node is their primary.
    fn held_here(&self) -> Result<Vec<PhotoId>, CatalogError>;

    /// Marks photo `id` deleted, for good, and removes its catalog row (whichever node's it
    /// is), in one transaction; the holders' copies go after.
    fn add_tombstone(&self, id: PhotoId) -> Result<(), CatalogError>;

    /// Photos deleted at or after `since_ms` (by the deleting node's clock), with when.
    fn tombstones_since(&self, since_ms: i64) -> Result<Vec<(PhotoId, i64)>, CatalogError>;

    /// Which of `ids` are deleted.
    fn tombstoned(&self, ids: &[PhotoId]) -> Result<Vec<PhotoId>, CatalogError>;

    /// Up to `limit` photos whose primary is this node with fewer than `wanted` copies on
    /// registered nodes, with their current holders, lowest id first.
    fn under_replicated(&self, wanted: u32, limit: u32) -> Result<Vec<PhotoCopies>, CatalogError>;

    /// Up to `limit` photos whose primary is this node with ids above `after`, in id order,
    /// with their holders (what rebalancing walks through).
    fn primaries_after(
        &self,
        after: Option<PhotoId>,
        limit: u32,
    ) -> Result<Vec<PhotoCopies>, CatalogError>;

    /// Makes `to` the primary of photo `id` when this node is its primary and `to` holds a
    /// copy; whether it did.
    fn hand_over(&self, id: PhotoId, to: &str) -> Result<bool, CatalogError>;

    /// Makes a live, active holder of a copy (the lowest name) the primary of each photo of
    /// `node`, which stopped answering, without forgetting `node`'s copies: jobs then reach
    /// every photo through a live node, each through one.
    fn fail_over(&self, node: &str) -> Result<FailOver, CatalogError>;

    /// How many photos of the cluster are at `wanted` copies, below, or lost.
    fn replication_counts(&self, wanted: u32) -> Result<ReplicationCounts, CatalogError>;

    /// [`ReplicaCatalog::copies`] of many photos in one query, in id order, leaving out those
    /// without a catalog row (a node's start-up sweep over its copies).
    fn copies_many(&self, ids: &[PhotoId]) -> Result<Vec<PhotoCopies>, CatalogError>;

    /// The ground truth of `task` of the photos whose primary is `node`, in id order (a
    /// fine-tune that lost `node` takes its training photos over from their copies).
    fn task_truths_of(&self, node: &str, task: &TaskName) -> Result<Vec<TaskTruth>, CatalogError>;

    /// Photo `id`'s predictions by model version, whichever node's row it is (what any front
    /// door answers for labels).
    fn cluster_predictions(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError>;

    /// The versions active on photo `id`'s primary (one per task), in task order.
    fn primary_active_versions(&self, id: PhotoId) -> Result<Vec<String>, CatalogError>;

    /// Photo `id`'s predictions by the versions active on its primary, one list per task in
    /// task order, best first (a task is left out before the photo is labelled for it): the
    /// labels any front door shows beside the photo.
    fn cluster_active_predictions(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, CatalogError>;
}
