//! Similar photos: nearest neighbours of a photo's features, cluster-wide.
//!
//! - [`ann`]: the usearch HNSW graph (cosine, keyed by photo id) and its options;
//! - [`persist`]: the graph on disk, its manifest and checksums, saved atomically and never
//!   trusted blindly;
//! - [`index`]: a node's index over the stored features of its active backbone, kept in step
//!   with the feature store by the store's hook, and its batch search (`Similar/Search`);
//! - [`worker`]: the index's one writer thread (changes, open and reconcile, builds, saves);
//! - [`embed`]: a query photo's features, preprocessed as an upload is and run through the
//!   backbone, never stored;
//! - [`front`]: a front door's query: the query vector (a stored photo's, or a posted photo's),
//!   the fan-out of a batch of queries to every live node with a deadline;
//! - [`merge`]: the nodes' answers as one, query by query, and the nodes that did not answer;
//! - [`hedge`]: asking one node of several (the holders of a photo, the live PipeStores), the
//!   next one when a node fails or is silent;
//! - [`neighbours`]: the batch API for semantic duplicates: this node's photos' neighbours
//!   above a cosine similarity, cluster-wide;
//! - [`peers`]: the `Similar` gRPC calls to other nodes;
//! - [`node`]: a PipeStore's parts, built from its configuration;
//! - [`metrics`]: query counts and latency, the index's size.

pub(crate) mod ann;
mod embed;
mod front;
mod hedge;
pub(crate) mod index;
pub(crate) mod merge;
pub(crate) mod metrics;
pub(crate) mod neighbours;
mod node;
mod pairs;
mod peers;
mod persist;
#[cfg(test)]
mod tests;
mod worker;

use std::path::PathBuf;

use ndpipe_model::{ModelError, PreprocessError};

pub(crate) use embed::Embedder;
pub(crate) use front::{ClusterAccess, FrontSettings, SimilarFront};
pub(crate) use index::{IndexSettings, NodeHits, Queries, SimilarIndex};
pub(crate) use merge::Answer;
pub(crate) use neighbours::Neighbours;
pub(crate) use node::{NodeSimilar, front_settings};
pub(crate) use pairs::IndexPairs;

use crate::storage::StoreError;
use ann::AnnError;

/// Why a similarity query or the index failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SimilarError {
    /// A file of the index could not be read or written.
    #[error("cannot {what} ({path})")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The graph refused an operation.
    #[error("the similarity index of backbone {backbone}")]
    Index {
        backbone: String,
        #[source]
        source: AnnError,
    },
    /// The feature store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A setting is out of range.
    #[error("{setting}: {reason}")]
    Config {
        setting: &'static str,
        reason: String,
    },
    /// Another index follows this feature store already.
    #[error("the feature store already has an index")]
    HookTaken,
    /// The queries were computed by another backbone than the node runs.
    #[error("the queries are of backbone {asked}; this node runs {serving}")]
    OtherBackbone { asked: String, serving: String },
    /// The query batch or its parameters do not add up.
    #[error("bad query: {0}")]
    BadQuery(String),
    /// No such photo.
    #[error("photo {0} does not exist")]
    NotFound(u64),
    /// The photo has no features under the active backbone yet.
    #[error(
        "photo {id} has no features under backbone {backbone} yet (it is not labelled yet); try again once it is"
    )]
    NotLabelled { id: u64, backbone: String },
    /// No model is loaded here, so no features can be computed or searched.
    #[error("no model is loaded on this node, so it computes and indexes no features")]
    NoModel,
    /// The query photo is not an acceptable image.
    #[error(transparent)]
    Rejected(#[from] PreprocessError),
    /// The backbone failed on the query photo.
    #[error("the backbone failed on the query photo")]
    Model(#[source] ModelError),
    /// No node could compute the query photo's features, or the photo's holders did not
    /// answer.
    #[error("no node answered: {0}")]
    Unavailable(String),
    /// A node answered an error for the client (passed on as it is).
    #[error("{message}")]
    Remote {
        status: u16,
        kind: &'static str,
        message: String,
    },
    /// A worker task died.
    #[error("internal error")]
    Task(#[from] tokio::task::JoinError),
}
