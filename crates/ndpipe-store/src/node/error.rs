//! The node's domain error, and its one mapping to a gRPC status.

use ndpipe_catalog::CatalogError;
use ndpipe_model::ModelError;
use ndpipe_proto::ProtoError;
use tonic::Status;

use crate::inference::InferenceError;

/// Why a request of the Tuner protocol failed on this node.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    /// A request field is out of range or does not parse.
    #[error("{0}")]
    InvalidArgument(String),
    /// A staged head does not hold together (checksum, shape).
    #[error(transparent)]
    BadHead(ProtoError),
    /// A backbone sent for a rollout does not hold together (chunks, checksum, sha256) or does
    /// not load with its manifest.
    #[error("backbone refused: {0}")]
    BadBackbone(String),
    /// A rollout phase named a backbone that is not staged on this node.
    #[error("backbone {0} is not staged on this node")]
    BackboneNotStaged(String),
    /// A staged or committed backbone's files cannot be written, read or moved.
    #[error("backbone files {}: {source}", path.display())]
    BackboneFiles {
        /// The file or folder.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The job's extraction never started on this node.
    #[error("unknown job {0}")]
    UnknownJob(String),
    /// A re-fetch asked for a chunk the run does not have.
    #[error("no chunk {seq} in run {run}")]
    NoChunk {
        /// The run.
        run: u32,
        /// The chunk's number.
        seq: u32,
    },
    /// A head was trained on another backbone than this node runs.
    #[error("head {version} was trained on backbone {trained_on}, this node runs {runs}")]
    WrongBackbone {
        /// The head's version.
        version: String,
        /// Its backbone.
        trained_on: String,
        /// This node's backbone.
        runs: String,
    },
    /// A head takes features of another length than the backbone gives.
    #[error("head {version} takes {input_dim}-d features, the backbone gives {feature_dim}")]
    WrongInputDim {
        /// The head's version.
        version: String,
        /// Its input length.
        input_dim: usize,
        /// The backbone's feature length.
        feature_dim: usize,
    },
    /// A re-labelling asked for another version than the active one.
    #[error("the active version is {active}, not {requested}")]
    NotActive {
        /// The active version.
        active: String,
        /// The version asked for.
        requested: String,
    },
    /// Another node could not be reached or failed (take-over).
    #[error("{what} {url}: {reason}")]
    Peer {
        /// What failed ("cannot reach", "fetching tensors from").
        what: &'static str,
        /// The other node.
        url: String,
        /// Why.
        reason: String,
    },
    /// Labelling, features, tensors or a head commit failed.
    #[error(transparent)]
    Inference(#[from] InferenceError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The backbone failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A worker task or thread failed.
    #[error("internal error: {0}")]
    Task(String),
    /// Testing only: a fault the configuration asked for.
    #[error("testing: {0}")]
    Injected(&'static str),
}

impl From<NodeError> for Status {
    fn from(e: NodeError) -> Self {
        let message = e.to_string();
        match e {
            NodeError::InvalidArgument(_) | NodeError::BadHead(_) | NodeError::BadBackbone(_) => {
                Status::invalid_argument(message)
            }
            NodeError::UnknownJob(_)
            | NodeError::BackboneNotStaged(_)
            | NodeError::NoChunk { .. }
            | NodeError::Inference(
                InferenceError::NoTensor { .. } | InferenceError::NotStaged { .. },
            ) => Status::not_found(message),
            NodeError::WrongBackbone { .. }
            | NodeError::WrongInputDim { .. }
            | NodeError::NotActive { .. } => Status::failed_precondition(message),
            NodeError::Inference(InferenceError::CorruptTensor { .. }) => {
                Status::data_loss(message)
            }
            NodeError::Peer { .. } | NodeError::Injected(_) => Status::unavailable(message),
            NodeError::Inference(_)
            | NodeError::BackboneFiles { .. }
            | NodeError::Catalog(_)
            | NodeError::Model(_)
            | NodeError::Task(_) => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_error_maps_to_its_status_code() {
        let cases = [
            (
                NodeError::InvalidArgument("x".into()),
                Code::InvalidArgument,
            ),
            (NodeError::UnknownJob("j".into()), Code::NotFound),
            (
                InferenceError::NotStaged {
                    version: "v".into(),
                }
                .into(),
                Code::NotFound,
            ),
            (InferenceError::NoTensor { id: 3 }.into(), Code::NotFound),
            (
                NodeError::WrongInputDim {
                    version: "v".into(),
                    input_dim: 512,
                    feature_dim: 1280,
                },
                Code::FailedPrecondition,
            ),
            (
                InferenceError::CorruptTensor {
                    id: 3,
                    source: ndpipe_model::TensorBlob::decode(b"junk").unwrap_err(),
                }
                .into(),
                Code::DataLoss,
            ),
            (
                NodeError::Peer {
                    what: "cannot reach",
                    url: "http://x".into(),
                    reason: "refused".into(),
                },
                Code::Unavailable,
            ),
            (NodeError::Task("panicked".into()), Code::Internal),
        ];
        for (error, code) in cases {
            let message = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message);
        }
    }
}
