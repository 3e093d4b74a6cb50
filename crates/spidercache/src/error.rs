//! The crate's one error type.

use crate::api::SampleId;

/// Everything that can go wrong inside a cache policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A sample id outside `0..num_samples`.
    #[error("sample id {id} is outside the dataset of {num_samples} samples")]
    UnknownSample {
        /// The offending id.
        id: SampleId,
        /// The dataset size the policy was built for.
        num_samples: usize,
    },
    /// A batch report whose slices disagree in length.
    #[error("malformed batch report: {0}")]
    MalformedBatch(String),
    /// A configuration value that cannot work.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The approximate-nearest-neighbour index failed.
    #[error("ANN index error: {0}")]
    Index(String),
    /// The [`SampleSource`](crate::SampleSource) could not produce a sample.
    #[error("sample source failed for sample {id}: {reason}")]
    Source {
        /// The sample that could not be fetched.
        id: SampleId,
        /// Why the source failed.
        reason: String,
    },
    /// The background scoring worker stopped.
    #[error("the scoring worker stopped unexpectedly")]
    WorkerGone,
}
