//! Where a PipeStore's bytes live, all under its data directory.
//!
//! - [`volume`]: append-only volume files with per-record checksums (`docs/volume-format.md`);
//! - [`index`]: the embedded redb index from photo id to its records, rebuildable from volumes;
//! - [`store`]: the [`PhotoStore`] over both: one writer thread with group commit, concurrent
//!   verified reads, crash recovery and compaction;
//! - [`features`]: the [`FeatureStore`], one feature vector per (backbone, photo), a sibling of
//!   the photo store that inference fills and extraction reads;
//! - [`db`]: the redb handle both use, opened again by itself after an I/O failure;
//! - [`space`]: the free-space reserve below which writes that add data are refused;
//! - [`blobs`]: the files of plain S3 objects (anything that is not a photo).

pub(crate) mod blobs;
pub(crate) mod db;
mod error;
pub(crate) mod features;
pub(crate) mod index;
pub(crate) mod space;
pub(crate) mod store;
pub(crate) mod volume;

pub(crate) use blobs::Blobs;
pub use error::StoreError;
pub use features::{DEFAULT_FEATURE_CACHE_BYTES, FeatureStore};
pub(crate) use store::DEFAULT_INDEX_CACHE_BYTES;
pub use store::{CompactionReport, NewPhoto, PhotoIds, PhotoStore, RecoveryReport, StoreConfig};
