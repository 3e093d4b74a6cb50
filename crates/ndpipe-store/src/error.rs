//! The crate's error for opening and serving a PipeStore.

use std::net::SocketAddr;
use std::path::PathBuf;

use ndpipe_catalog::CatalogError;
use ndpipe_model::ModelError;

use crate::inference::InferenceError;
use crate::storage::StoreError;

/// Why a PipeStore could not open, start or stop. Each variant says which part failed and on
/// what (file, directory, address); the cause is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is invalid.
    #[error("invalid setting {setting}: {reason}")]
    Config {
        /// The [`Config`](crate::Config) field.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The cluster secret file cannot be read or holds no secret.
    #[error("reading the cluster secret file {}: {source}", path.display())]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file cannot be read or holds no token.
    #[error("reading the token file {}: {source}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The photo store or the feature store could not be opened or recovered.
    #[error("opening {}: {source}", path.display())]
    Store {
        /// The store's directory or file.
        path: PathBuf,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The access keys could not be opened (their master key file).
    #[error("opening the access keys: {0}")]
    Keys(#[from] crate::keys::KeyError),
    /// A folder of the data directory could not be created or opened.
    #[error("opening {}: {source}", path.display())]
    Io {
        /// The folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A thread of the node could not be started.
    #[error("starting the {what} thread")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The catalog could not be opened.
    #[error("opening the catalog {what}: {source}")]
    Catalog {
        /// The SQLite file or PostgreSQL URL (without its password).
        what: String,
        /// Why.
        #[source]
        source: CatalogError,
    },
    /// The model could not be loaded.
    #[error(
        "loading the model from {} (run `make setup`, or set the model directory, or run without a model to store photos unlabelled): {source}",
        dir.display()
    )]
    Model {
        /// The model directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// The node's model versions or committed heads could not be set up.
    #[error("setting up the model versions and heads in {}: {source}", heads.display())]
    Models {
        /// The heads directory.
        heads: PathBuf,
        /// Why.
        #[source]
        source: InferenceError,
    },
    /// A start-up step over the store and the catalog failed (reconciling them, resuming an
    /// interrupted job).
    #[error("{step}: {source}")]
    Startup {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A worker thread could not start.
    #[error("starting {what}: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A listening address could not be bound.
    #[error("binding the {what} address {addr}: {source}")]
    Bind {
        /// `HTTP` or `gRPC`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed while serving.
    #[error("the gRPC server failed: {0}")]
    Grpc(#[source] tonic::transport::Error),
    /// A background task panicked.
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
