//! Which nodes hold a copy of each plain object's file (an S3 object that is not a photo): what
//! lets any front door of a replicated cluster read, repair and delete plain objects as it does
//! photos ([`BlobCatalog`]).

use crate::CatalogError;

/// How many plain objects' files of the cluster have how many copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobCounts {
    /// Files with at least the wanted copies on registered nodes.
    pub at_target: u64,
    /// Files with fewer copies than wanted, but at least one.
    pub under_replicated: u64,
    /// Files an object names that no registered node holds.
    pub lost: u64,
}

/// A plain object's file that has fewer copies than wanted, with what repair needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobHolders {
    /// The file's name (what the object row names).
    pub name: String,
    /// The bytes' hex SHA-256, which every copy is verified against and placement hashes.
    pub sha256: String,
    /// Every registered node holding a copy, by name.
    pub holders: Vec<String>,
}

/// The copies of the plain objects' files in a cluster's shared catalog; every method is one
/// transaction. A handle is one node's (the node that holds, drops and repairs).
pub trait BlobCatalog: Send + Sync {
    /// Records that this node holds a durable copy of file `name` (kept when already recorded);
    /// whether it was not recorded before.
    fn add_blob_copy(&self, name: &str) -> Result<bool, CatalogError>;

    /// Forgets that this node holds file `name`.
    fn drop_blob_copy(&self, name: &str) -> Result<(), CatalogError>;

    /// The registered nodes that hold file `name`, by name.
    fn blob_holders(&self, name: &str) -> Result<Vec<String>, CatalogError>;

    /// Which of `names` an object row names (the others are left over by a failed upload or a
    /// delete that could not reach this node).
    fn referenced_blobs(&self, names: &[String]) -> Result<Vec<String>, CatalogError>;

    /// Which of `names` this node has recorded as held.
    fn recorded_here(&self, names: &[String]) -> Result<Vec<String>, CatalogError>;

    /// Up to `limit` files this node holds that an object names, with names above `after`, in
    /// name order, with every registered holder (what scrub and rebalancing walk through).
    fn held_blobs_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BlobHolders>, CatalogError>;

    /// How many files that an object names are at `wanted` copies, below, or lost.
    fn blob_counts(&self, wanted: u32) -> Result<BlobCounts, CatalogError>;

    /// Up to `limit` files an object names with fewer than `wanted` copies on registered nodes
    /// whose live holder with the lowest name is this node (so one node repairs each), in
    /// name order.
    fn under_replicated_blobs(
        &self,
        wanted: u32,
        limit: u32,
    ) -> Result<Vec<BlobHolders>, CatalogError>;
}
