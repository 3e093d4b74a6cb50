//! PipeStore: the storage server that keeps photos and their preprocessed tensors near the model.
//!
//! Data flows one way through this crate:
//!
//! - [`http`] accepts uploads and reads (axum, JSON errors, bearer token on writes);
//! - [`ingest`] validates and preprocesses each photo once (`ndpipe-model`), writes it to the
//!   store, then records it in the catalog (`ndpipe-catalog`);
//! - [`store`] makes it durable: append-only [`volume`]s with per-record checksums, an embedded
//!   [`index`] (redb), group commit with fsync before any acknowledgement, tombstones and
//!   compaction, crash recovery that cuts torn tails and rebuilds the index from the volumes;
//! - [`labeler`] labels each photo right after its write (online inference near the data) and
//!   keeps its feature vector in the [`features`] store;
//! - [`relabel`] re-labels the whole store with a pipelined offline-inference job, run and
//!   resumed by [`jobs`].
//!
//! The byte layout is documented in `docs/volume-format.md`.
#![deny(missing_docs)]

mod error;
pub mod features;
pub mod grpc;
pub mod http;
pub mod index;
pub mod ingest;
pub mod jobs;
pub mod labeler;
pub mod metrics;
pub mod relabel;
pub mod store;
pub mod volume;

pub use error::StoreError;
pub use index::{PhotoEntry, PhotoMeta};
pub use ingest::{IngestConfig, IngestError, Ingestor};
pub use store::{CompactionReport, NewPhoto, PhotoStore, RecoveryReport, StoreConfig};
