//! PipeStore: the storage server that keeps photos and their preprocessed tensors near the model,
//! labels them there, and extracts their features for the Tuner.
//!
//! # Public API
//!
//! A binary runs a node with [`PipeStore::open`] (from a [`Config`]), [`PipeStore::start`] and
//! [`Running::stop`], and a gateway (a front door without photos) with [`Gateway::open`] (from
//! a [`GatewayConfig`]), [`Gateway::start`] and [`RunningGateway::stop`]; every failure is an
//! [`Error`]. [`KeyStore`] manages a data directory's
//! access keys without a server. The building blocks a benchmark needs are
//! public too: the [`PhotoStore`] ([`StoreConfig`], [`NewPhoto`], [`RecoveryReport`],
//! [`CompactionReport`], [`StoreError`]), the [`FeatureStore`], the similarity index's graph
//! ([`AnnIndex`], [`AnnOptions`], [`Scalar`], [`AnnError`]), and a full re-labelling with a
//! [`Relabeler`] ([`ActiveModel`], [`RelabelOptions`], [`Pending`], [`RelabelReport`],
//! [`InferenceError`]), and duplicate finding's perceptual hash ([`NearHash`],
//! [`PerceptualHasher`]) and pair search ([`near_pairs`]). The S3 API's table of refused
//! headers ([`S3_REFUSALS`], each an [`S3Refusal`]) is public for its documentation and the
//! test that walks it. Everything else is internal.
//!
//! # Module map
//!
//! Data flows one way, top to bottom:
//!
//! - `pipestore` (composition: [`PipeStore::open`]), `server` (serving: HTTP and gRPC,
//!   [`Running`]) and `membership` (registration with a Tuner and the heartbeat that renews
//!   the node's lease);
//! - `api`: the thin adapters. `api::http` is the client API (`/v1`, `/healthz`, `/metrics`;
//!   photos, labels, jobs, keys and ops route groups, JSON errors, a role for every call);
//!   `api::s3` is the S3-compatible API (SigV4 with access keys);
//!   `api::grpc` is the Tuner protocol over `node`;
//! - `objects`: where an object's bytes live, the one seam `/v1`, S3 and the gateway ask:
//!   this node alone, this node in a replicated cluster, or a gateway that stores nothing;
//! - `ingest`: validates and preprocesses each upload once (`ndpipe-model`), writes it to the
//!   store, catalogs it (`ndpipe-catalog`) and hands it to online labelling; deletes; reconciles
//!   catalog and store at start;
//! - `replication`: the cluster as one store (on a shared PostgreSQL catalog): placement of
//!   each upload on `replicas` nodes by weighted rendezvous hashing, copies made durable before
//!   the 201, reads that fall back to another copy and repair a damaged one, deletes behind a
//!   tombstone, and the background worker that repairs, sweeps and scrubs; `gateway` serves
//!   its front door alone, in a process that holds no photo;
//! - `duplicates`: exact duplicates at upload ([`ExactDuplicates`]), the worker that gives every
//!   photo a perceptual hash, near pairs by multi-index hashing, and pairs of every level
//!   grouped with a reason per member and a keeper (`GET /v1/duplicates`);
//! - `keys`: access keys ([`KeyStore`]): secrets sealed under the data directory's master key,
//!   roles, the bearer token as an admin key;
//! - `jobs`: long-running re-labellings, one at a time, resumed after a restart;
//! - `node`: the PipeStore side of the Tuner protocol (extraction plans, feature extraction,
//!   take-over of a slow node's tail, two-phase head deploys, re-labelling after a deploy),
//!   with its own error mapped to gRPC statuses once;
//! - `inference`: the node's models and their lifecycle (pretrained version, committed heads in
//!   one file format), online labelling right after each durable write, full and head-only
//!   re-labelling, features of stored photos;
//! - `storage`: append-only volumes with per-record checksums, the embedded redb index, the
//!   photo store (group commit with fsync before any acknowledgement, tombstones, compaction,
//!   crash recovery that cuts torn tails and rebuilds the index from the volumes) and the
//!   feature store;
//! - `similar`: similar photos: each node's ANN index over the stored features of its active
//!   backbone, and the front door's query fanned out to every live node;
//! - `metrics`: the Prometheus metrics served on `/metrics`.
//!
//! The byte layout of the volumes is documented in `docs/volume-format.md`.
#![deny(missing_docs)]

mod api;
mod catalog_deadline;
mod config;
mod duplicates;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod inference;
mod ingest;
mod jobs;
mod key_cache;
mod keys;
mod membership;
mod metrics;
mod node;
mod objects;
mod pipestore;
mod replication;
mod server;
mod similar;
mod storage;
#[cfg(test)]
mod testing;
mod words;

pub use api::http::guard_router;
pub use api::s3::refuse::{S3_REFUSALS, S3Refusal};
pub use config::{Config, DEFAULT_MAX_UPLOAD_BYTES, GatewayConfig};
pub use duplicates::{
    DEFAULT_NEAR_HAMMING, DEFAULT_NEAR_MIN_SIDE, DEFAULT_SEMANTIC_MIN_COSINE, ExactDuplicates,
    HASH_BITS, NearHash, NearPair, PerceptualHasher, near_pairs,
};
pub use error::Error;
pub use gateway::{Gateway, RunningGateway};
pub use inference::{
    ActiveModel, InferenceError, Pending, RelabelOptions, RelabelReport, Relabeler, TaskModel,
};
pub use keys::{
    ADMIN_ACCESS_KEY, KeyError, KeyInfo, KeyStore, NewKey, create_master_key, create_secret_file,
};
pub use pipestore::PipeStore;
pub use server::Running;
pub use similar::ann::{AnnError, AnnIndex, AnnOptions, Scalar};
pub use storage::{
    CompactionReport, DEFAULT_FEATURE_CACHE_BYTES, FeatureStore, NewPhoto, PhotoIds, PhotoStore,
    RecoveryReport, StoreConfig, StoreError,
};
