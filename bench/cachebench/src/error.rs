//! The crate's one error type.

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The `ndpipe` binary is missing or its process misbehaved.
    #[error("PipeStore process: {0}")]
    Process(String),
    /// An HTTP request to the PipeStore failed.
    #[error("HTTP {what}: {reason}")]
    Http {
        /// The request.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// The PipeStore's data does not fit the benchmark.
    #[error("dataset: {0}")]
    Dataset(String),
    /// A stored photo is not a decodable 28x28 image.
    #[error("photo {id}: {reason}")]
    Decode {
        /// The photo's PipeStore id.
        id: u64,
        /// Why it could not be decoded.
        reason: String,
    },
    /// A trace file is malformed.
    #[error("trace: {0}")]
    Trace(String),
    /// A plot could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
    /// A cache policy failed.
    #[error(transparent)]
    Cache(#[from] spidercache::CacheError),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] candle_core::Error),
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Results could not be (de)serialised.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Shorthand for this crate's results.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
