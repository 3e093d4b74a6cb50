//! Inference near the data: the node's models and what runs them.
//!
//! - [`model`]: the models that label the store ([`ActiveModel`]: one backbone, a classifier per
//!   task), swappable at run time, and their lifecycle on the node ([`model::Models`]): the
//!   pretrained version's registration as the general task's, each task's active head loaded at
//!   start, commits and rollbacks of heads task by task, a rollout's switch of backbone;
//! - [`heads`]: committed head files (`DATA/heads`, [`ndpipe_model::HeadFile`]);
//! - [`backbone`]: stored tensors and feature vectors of stored photos (from the feature store,
//!   or computed by the backbone);
//! - [`backbones`]: the backbones a rollout staged and committed (`DATA/backbones`), and how the
//!   node loads one;
//! - [`labeler`]: online labelling right after each upload's durable write;
//! - [`relabel`]: re-labelling the whole store, in full (backbone and classifier, pipelined and
//!   checkpointed) or head-only over stored features.

pub(crate) mod backbone;
pub(crate) mod backbones;
mod backlog;
pub(crate) mod heads;
pub(crate) mod labeler;
pub(crate) mod model;
mod pending;
pub(crate) mod relabel;

use std::path::PathBuf;

use ndpipe_catalog::CatalogError;
use ndpipe_model::{HeadError, ModelError, TensorError};

use crate::storage::StoreError;

pub use model::{ActiveModel, TaskModel};
pub use pending::Pending;
pub use relabel::{RelabelOptions, RelabelReport, Relabeler};

/// Why labelling, re-labelling or a model change failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InferenceError {
    /// The photo store or the feature store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The model failed to run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A photo has no stored tensor (it is gone, or its tensor was never written).
    #[error("photo {id} has no tensor")]
    NoTensor {
        /// The photo.
        id: u64,
    },
    /// A stored tensor does not decode.
    #[error("tensor of photo {id}: {source}")]
    CorruptTensor {
        /// The photo.
        id: u64,
        /// Why it does not decode.
        #[source]
        source: TensorError,
    },
    /// A head file is unreadable, or a head cannot be written.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// A head file of the old format (`<version>.head`) is unreadable or does not decode.
    #[error("old-format head file {}: {source}", path.display())]
    LegacyHead {
        /// The file.
        path: PathBuf,
        /// What is wrong: the read, the protobuf decode or the head's checks.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The heads directory cannot be created, or a staged head file cannot be removed.
    #[error("heads directory {}: {source}", path.display())]
    HeadsDir {
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A version to commit was neither staged nor committed before on this node.
    #[error("model version {version} is not staged on this node")]
    NotStaged {
        /// The version.
        version: String,
    },
    /// A head to commit was trained on another backbone than the one it would run on.
    #[error("model version {version} was trained on backbone {trained_on}, not {runs}")]
    OtherBackbone {
        /// The version.
        version: String,
        /// The backbone it was trained on.
        trained_on: String,
        /// The backbone it would run on.
        runs: String,
    },
}
