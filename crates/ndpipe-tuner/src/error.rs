//! The crate's error type.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong in the Tuner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TunerError {
    /// A features slice whose length is not a whole number of `input_dim` rows.
    #[error("features have {len} values, not a multiple of the input dimension {input_dim}")]
    FeatureShape {
        /// Length of the slice.
        len: usize,
        /// The head's input dimension.
        input_dim: usize,
    },
    /// A different number of labels than feature rows.
    #[error("{rows} feature rows but {labels} labels")]
    LabelCount {
        /// Feature rows.
        rows: usize,
        /// Labels given.
        labels: usize,
    },
    /// A label that names no class of the head.
    #[error("label {label} at row {row} is out of range for {classes} classes")]
    LabelOutOfRange {
        /// Row of the label.
        row: usize,
        /// The label.
        label: u32,
        /// Number of classes of the head.
        classes: usize,
    },
    /// A head whose input dimension is not the one expected (e.g. the backbone's feature size).
    #[error("head input dimension is {found}, expected {expected}")]
    InputDimMismatch {
        /// The dimension required.
        expected: usize,
        /// The head's dimension.
        found: usize,
    },
    /// Training was asked to run on no rows.
    #[error("no training rows")]
    EmptyData,
    /// A class name that is already a class of the head.
    #[error("duplicate class {0:?}")]
    DuplicateClass(String),
    /// A configuration or call argument outside its valid range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No PipeStore is registered.
    #[error("no PipeStore is registered with the Tuner")]
    NoNodes,
    /// PipeStores are registered, but none can take part in a job now (each is draining, has
    /// a lease that ran out, or is being brought to the active version).
    #[error("no PipeStore can take part in a job: {0}")]
    NoEligibleNodes(String),
    /// Another fine-tuning job or deploy is running (or a node is being brought to the active
    /// version).
    #[error("another job is running (or a node is being brought to the active version)")]
    Busy,
    /// A PipeStore failed or answered wrongly during a job.
    #[error("PipeStore {node} failed: {message}")]
    Node {
        /// The node, as "name (node N)".
        node: String,
        /// What went wrong.
        message: String,
    },
    /// A deploy was refused by a node and rolled back everywhere.
    #[error("deploy of {version} aborted: {reason}")]
    DeployAborted {
        /// The version.
        version: String,
        /// Which node refused and why.
        reason: String,
    },
    /// A backbone that cannot be added: not base64, over the size limit, or a file ONNX Runtime
    /// does not load or whose graph is not the manifest's.
    #[error("invalid backbone: {0}")]
    InvalidBackbone(String),
    /// A backbone the Tuner does not keep.
    #[error("unknown backbone {0}")]
    UnknownBackbone(String),
    /// A model version that the registry does not have.
    #[error("unknown model version {0}")]
    UnknownVersion(String),
    /// A node name that is not registered.
    #[error("no node named {0:?} is registered")]
    UnknownNode(String),
    /// A task that no node's catalog holds.
    #[error("unknown task {0} (create it with `ndpipe tasks create` or POST /v1/tasks)")]
    UnknownTask(String),
    /// A fine-tune of a task whose ground truth has fewer than two classes with training
    /// photos.
    #[error("task {task} has training photos of {} class(es) ({}): a fine-tune needs at least 2; label photos of more classes", classes.len(), classes.join(", "))]
    TooFewClasses {
        /// The task.
        task: String,
        /// The classes with training photos.
        classes: Vec<String>,
    },
    /// A backbone rollout that cannot carry a task's head to the new backbone: its retrained
    /// head fell below its quality gate, or could not be trained.
    #[error(
        "the rollout cannot carry every task to the new backbone: {0}; fix the task (more labels) or roll out with force, which leaves such a task without a head until it is fine-tuned again"
    )]
    TasksNotCarried(String),
    /// A job id that the Tuner does not know.
    #[error("unknown job {0}")]
    UnknownJob(String),
    /// Repair after a node's removal stopped making progress.
    #[error("repair stalled: {0}")]
    RepairStalled(String),
    /// The registry's catalog failed.
    #[error(transparent)]
    Catalog(#[from] ndpipe_catalog::CatalogError),
    /// A protocol message or plan that does not hold together.
    #[error(transparent)]
    Protocol(#[from] ndpipe_proto::ProtoError),
    /// Loading the Tuner's own backbone failed.
    #[error(transparent)]
    Model(#[from] ndpipe_model::ModelError),
    /// A head file that is not a valid head.
    #[error("invalid head file {path}: {reason}")]
    InvalidHeadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing a file (a head, the token file) failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Binding or running one of the Tuner's servers failed.
    #[error("{server} server on {addr}: {source}")]
    Server {
        /// "HTTP" or "gRPC".
        server: &'static str,
        /// The address it was to listen on.
        addr: SocketAddr,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The Tuner restarted during a job that cannot be resumed; the reason says why and what
    /// to do.
    #[error("{0}")]
    Interrupted(String),
    /// A broken invariant inside the Tuner (a panicked thread or task, a failing training cache):
    /// a bug or a fault of this process, not of the request.
    #[error("internal error: {0}")]
    Internal(String),
}

impl TunerError {
    /// The stable name of the error's kind, as the HTTP API and the job log report it.
    pub fn kind(&self) -> &'static str {
        match self {
            TunerError::Busy => "job_running",
            TunerError::NoNodes | TunerError::NoEligibleNodes(_) => "no_nodes",
            TunerError::UnknownVersion(_) => "unknown_model",
            TunerError::InvalidBackbone(_) => "invalid_backbone",
            TunerError::UnknownBackbone(_) => "unknown_backbone",
            TunerError::UnknownNode(_) => "unknown_node",
            TunerError::UnknownTask(_) => "unknown_task",
            TunerError::TooFewClasses { .. } => "too_few_classes",
            TunerError::TasksNotCarried(_) => "tasks_not_carried",
            TunerError::UnknownJob(_) => "unknown_job",
            TunerError::RepairStalled(_) => "repair_stalled",
            TunerError::Interrupted(_) => "interrupted",
            TunerError::Node { .. } => "node_failed",
            TunerError::DeployAborted { .. } => "deploy_aborted",
            TunerError::EmptyData => "no_training_data",
            TunerError::InvalidArgument(_) | TunerError::InputDimMismatch { .. } => {
                "invalid_request"
            }
            _ => "internal",
        }
    }
}
