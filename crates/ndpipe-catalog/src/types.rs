use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CatalogError;

/// A photo's id, assigned by the store, never reused.
pub type PhotoId = u64;

/// Which part of a labelled data set a photo belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Used to train heads.
    Train,
    /// Used to pick and validate versions.
    Val,
    /// Held out.
    Test,
}

impl Split {
    /// The lowercase name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = CatalogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "train" => Ok(Split::Train),
            "val" => Ok(Split::Val),
            "test" => Ok(Split::Test),
            other => Err(CatalogError::Invalid(format!(
                "split must be train, val or test, not {other:?}"
            ))),
        }
    }
}

/// A label supplied by a person or a data set, with its split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// The class name.
    pub label: String,
    /// The split.
    pub split: Split,
}

/// What is known about a photo without reading its bytes. The store keeps it in the photo's
/// volume record (so the index and the catalog can be rebuilt) and the catalog in its row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhotoMeta {
    /// Hex SHA-256 of the original bytes.
    pub sha256: String,
    /// Size of the original in bytes.
    pub bytes: u64,
    /// Width after EXIF orientation.
    pub width: u32,
    /// Height after EXIF orientation.
    pub height: u32,
    /// MIME type of the original.
    pub content_type: String,
    /// Upload time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Ground truth, when known.
    pub ground_truth: Option<GroundTruth>,
}

/// A stored photo as the catalog lists it: its id and metadata (one flat JSON object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhotoRecord {
    /// Store-assigned id.
    pub id: PhotoId,
    /// Everything else.
    #[serde(flatten)]
    pub meta: PhotoMeta,
}

/// One predicted label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Class name.
    pub label: String,
    /// Probability in [0, 1].
    pub score: f32,
}

/// A model version known to the system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelVersion {
    /// Unique id, e.g. a content hash.
    pub id: String,
    /// The backbone this version runs on (sha256 of its ONNX file).
    pub backbone: String,
    /// The version this one was derived from.
    pub parent: Option<String>,
    /// Free-form metrics (accuracy, churn, ...).
    pub metrics: serde_json::Value,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Whether this is the version currently serving (on the node the catalog handle belongs
    /// to: each node of a shared catalog has its own active version).
    pub active: bool,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The photo.
    pub id: PhotoId,
    /// The matching predicted label.
    pub label: String,
    /// Its probability.
    pub score: f32,
    /// Its rank among the photo's predictions (0 = top-1).
    pub rank: u32,
}

/// One result of a search over every node of a shared catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHit {
    /// The node that holds the photo; `None` for a catalog that only one node uses.
    pub node: Option<String>,
    /// Whether that node can serve it now: it is registered and its lease has not run out (a
    /// removed or silent node's photos are found but unavailable).
    pub available: bool,
    /// The hit.
    #[serde(flatten)]
    pub hit: SearchHit,
}

/// A long-running job (e.g. a re-labelling), with its resumable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Unique id.
    pub id: String,
    /// What kind of job, e.g. "relabel".
    pub kind: String,
    /// "running", "done", "failed" or "interrupted".
    pub status: String,
    /// Kind-specific progress and results.
    pub state: serde_json::Value,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
    /// Last update, ms since the Unix epoch.
    pub updated_ms: i64,
}

/// Whether a registered PipeStore takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Takes part in fine-tuning jobs and deploys.
    Active,
    /// Takes no new work (an operator is taking it out of the cluster).
    Draining,
}

impl NodeState {
    /// The lowercase name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeState {
    type Err = CatalogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(NodeState::Active),
            "draining" => Ok(NodeState::Draining),
            other => Err(CatalogError::Invalid(format!(
                "node state must be active or draining, not {other:?}"
            ))),
        }
    }
}

/// A PipeStore registered with the Tuner, with its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Unique id, given at first registration and never reused.
    pub id: u32,
    /// The name it registers with (unique).
    pub name: String,
    /// Where its PipeStore gRPC service is.
    pub url: String,
    /// Whether it takes new work.
    pub state: NodeState,
    /// Its lease runs until then (ms since the Unix epoch); a node whose lease ran out is not
    /// waited for.
    pub lease_expires_ms: i64,
    /// The model version the node last reported serving (`None` before it reported one).
    pub version: Option<String>,
    /// First registration, ms since the Unix epoch.
    pub registered_ms: i64,
    /// Last registration or heartbeat, ms since the Unix epoch.
    pub last_seen_ms: i64,
}
