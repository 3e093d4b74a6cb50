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

/// A label supplied by a person or a data set, with its split, for one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// The task the label belongs to (records from before tasks belong to [`TaskName::default_task`]).
    #[serde(default = "TaskName::default_task")]
    pub task: TaskName,
    /// The class name.
    pub label: String,
    /// The split.
    pub split: Split,
}

impl GroundTruth {
    /// A label of the default task.
    pub fn new(label: impl Into<String>, split: Split) -> Self {
        GroundTruth {
            task: TaskName::default_task(),
            label: label.into(),
            split,
        }
    }
}

/// One photo's ground truth in a task, as a job's training and validation sets are built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTruth {
    /// The photo.
    pub id: PhotoId,
    /// Its class.
    pub label: String,
    /// Its split.
    pub split: Split,
    /// Hex SHA-256 of its original: copies of the same bytes share it, so a carve by it never
    /// puts two copies on both sides of the train/validation line.
    pub sha256: String,
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
///
/// Written to the catalog, `meta.ground_truth` is the uploader's label (filed under its task);
/// read from it, `meta.ground_truth` is the photo's label in the default task (what clients of
/// before tasks read) and `ground_truths` holds every task's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhotoRecord {
    /// Store-assigned id.
    pub id: PhotoId,
    /// Everything else.
    #[serde(flatten)]
    pub meta: PhotoMeta,
    /// The photo's ground truth in every task that has one, by task name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ground_truths: Vec<GroundTruth>,
}

impl PhotoRecord {
    /// A photo with no ground truth but what `meta` carries.
    pub fn new(id: PhotoId, meta: PhotoMeta) -> Self {
        PhotoRecord {
            id,
            meta,
            ground_truths: Vec::new(),
        }
    }
}

/// One predicted label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Class name.
    pub label: String,
    /// Probability in [0, 1].
    pub score: f32,
}

/// A model version known to the system: one task's classifier over one backbone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelVersion {
    /// Unique id, e.g. a content hash.
    pub id: String,
    /// The task it labels for: [`TaskName::general`] for a backbone's own classifier.
    #[serde(default = "TaskName::default_task")]
    pub task: TaskName,
    /// The backbone this version runs on (sha256 of its ONNX file).
    pub backbone: String,
    /// The version this one was derived from.
    pub parent: Option<String>,
    /// Free-form metrics (accuracy, churn, ...).
    pub metrics: serde_json::Value,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Whether this is the version currently serving its task (on the node the catalog handle
    /// belongs to: each node of a shared catalog has its own active versions).
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

/// A search hit of one of several versions: the task and version that gave the label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskHit {
    /// The task.
    pub task: TaskName,
    /// The version.
    pub model_version: String,
    /// The hit, with the node that holds the photo.
    #[serde(flatten)]
    pub hit: NodeHit,
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

/// A task's name: 1 to 64 of `a-z`, `0-9`, `-` and `_`, starting with a letter or a digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskName(String);

impl TaskName {
    /// The built-in task: the backbone's own classifier (ImageNet's 1,000 classes for the
    /// default model). A fine-tune never replaces it.
    pub const GENERAL: &'static str = "general";
    /// The task of labels and fine-tunes that name none (and of every label and head from
    /// before tasks).
    pub const DEFAULT: &'static str = "default";

    /// The built-in `general` task.
    pub fn general() -> Self {
        TaskName(Self::GENERAL.to_string())
    }

    /// The `default` task.
    pub fn default_task() -> Self {
        TaskName(Self::DEFAULT.to_string())
    }

    /// Whether this is the built-in `general` task.
    pub fn is_general(&self) -> bool {
        self.0 == Self::GENERAL
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TaskName {
    type Err = CatalogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid = (1..=64).contains(&s.len())
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if valid {
            Ok(TaskName(s.to_string()))
        } else {
            Err(CatalogError::Invalid(format!(
                "task name {s:?}: 1 to 64 of a-z, 0-9, '-' and '_', starting with a letter or digit"
            )))
        }
    }
}

impl TryFrom<String> for TaskName {
    type Error = CatalogError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<TaskName> for String {
    fn from(t: TaskName) -> String {
        t.0
    }
}

impl PartialEq<str> for TaskName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

/// The class name that stands for "none of this task's classes": a head labels a photo
/// `other` when no class reaches its floor or the photo lies outside what the head was trained
/// on, and photos labelled `other` as ground truth train it as a class of its own.
pub const OTHER_CLASS: &str = "other";

/// A named classifier over the backbone's features, with its own classes, versions and labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Its name.
    pub name: TaskName,
    /// The least probability a class label needs to be kept, set by an operator; `None` uses
    /// the floor calibrated with the task's active head (the general task: no floor).
    pub floor: Option<f32>,
    /// Creation time, ms since the Unix epoch (0 for the built-in tasks).
    pub created_ms: i64,
}
