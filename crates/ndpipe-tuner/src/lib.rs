//! The Tuner: NDPipe's training server, which fine-tunes the classifier head from features only.
//!
//! In ndpipe, PipeStores run the frozen backbone near the photos and send the Tuner features and
//! labels, never photos. The Tuner trains the classifier head on those features in `r` pipelined
//! runs (it trains run `k` while the PipeStores extract run `k+1`, warm-starting from run `k-1`),
//! then versions the head and deploys it to every PipeStore, which re-labels its store.
//!
//! [`Tuner`] is the entry point: [`Tuner::open`] from a [`Config`], then either
//! [`Tuner::start`] (the standalone `ndpipe tuner`, HTTP and gRPC on their own addresses) or
//! [`Tuner::http_router`] and [`Tuner::grpc_routes`] served by an embedding process. Jobs run in
//! the background ([`JobView`]: phase, progress, result): [`Tuner::submit_finetune`] takes a
//! [`FinetuneRequest`] and ends with a [`FinetuneReport`], [`Tuner::submit_deploy`] with a
//! [`DeployReport`]; [`Tuner::finetune`] and [`Tuner::deploy`] wait for the report. [`Head`] is
//! the head itself, usable on its own (below).
//!
//! Inside (all modules are private; the list says where to work):
//! - `tuner`: the facade;
//! - `control`: the shared state, the job lock (one fine-tuning job or deploy at a time) and
//!   how a job is submitted and run in its own task;
//! - `jobs`: the jobs' phases, progress and outcomes (a catalog `JobLog`);
//! - `config`, `error`: [`Config`] and [`TunerError`];
//! - `nodes`: the registered PipeStores (a catalog `NodeRegistry`, with leases), their gRPC
//!   clients with deadlines and stream watchdogs, and which of them a job may use;
//! - `sync`: bringing nodes that serve another version to the active one;
//! - `registry`: model versions (a catalog `ModelRegistry`) and their head files;
//! - `backbones`: backbones added for rollouts, verified and kept in `DATA/backbones/`;
//! - `rollout`: a backbone rollout as one job (stage on every node, re-extract with a
//!   checkpoint and resume after a node's restart, commit everywhere); `rollout_tasks`: every
//!   task's head trained again on the new backbone, gated, and committed with it;
//! - `finetune`: a job of one task — `request`, `report`, the node `streams`, the `intake`
//!   bookkeeping, load `balance` and take-overs, the `trainer` thread, training through a cache
//!   over the memory budget (`cached`), the `conventional` comparison mode, and what decides
//!   whether the new version deploys (`quality`: per-class figures, label rules, the gate;
//!   `assess`: the gate against the parent on the same validation photos);
//! - `deploy`: two-phase deploy (stage, abort or commit; the intent recorded before the first
//!   commit) and the re-labelling fan-out;
//! - `head`: the head (candle-nn, Adam, L2), its training runs, evaluation, prediction, growth to
//!   new classes, and its file (`head::file`, ndpipe's one head format);
//! - `schedule`: NDPipe's step learning rate with its per-run scale; the run plan is
//!   [`RunPlan`], shared with the PipeStores;
//! - `api`: the HTTP API for operators (`/v1/tuner/...`) and the gRPC service PipeStores register
//!   and heartbeat with; `server`: the standalone servers ([`Running`]).
//!
//! # Example
//!
//! Two pipelined runs over tiny synthetic features of three classes:
//!
//! ```
//! use ndpipe_tuner::{Head, HeadConfig, RunPlan};
//!
//! let classes = vec!["cat".to_string(), "cup".to_string(), "car".to_string()];
//! let config = HeadConfig { input_dim: 4, batch: 16, ..HeadConfig::new(classes) };
//! // Each class lights up its own feature; row i has class i % 3.
//! let rows = 96;
//! let labels: Vec<u32> = (0..rows).map(|i| (i % 3) as u32).collect();
//! let features: Vec<f32> = labels
//!     .iter()
//!     .flat_map(|&l| (0..4).map(move |j| if j == l as usize { 3.0 } else { 0.1 }))
//!     .collect();
//!
//! let mut head = Head::new(config)?;
//! let plan = RunPlan::new(rows, 2, 16)?;
//! for (run, chunk) in plan.chunks().iter().enumerate() {
//!     let report = head.train_run(
//!         &features[chunk.start * 4..chunk.end * 4],
//!         &labels[chunk.clone()],
//!         run,
//!         plan.runs(),
//!         head.config().epochs,
//!     )?;
//!     assert_eq!(report.losses.len(), 30);
//! }
//! assert_eq!(head.evaluate(&features, &labels)?, 1.0);
//! let top = head.predict(&features[..4])?;
//! assert_eq!(head.classes()[top[0].class], "cat");
//! # Ok::<(), ndpipe_tuner::TunerError>(())
//! ```
#![deny(missing_docs)]

mod api;
mod backbones;
mod config;
mod control;
mod deploy;
mod error;
mod failover;
mod finetune;
mod head;
mod jobs;
mod nodes;
mod registry;
mod repair;
mod resume;
mod rollout;
mod rollout_balance;
mod rollout_tasks;
mod schedule;
mod server;
mod sync;
mod tuner;

pub use backbones::{BackboneUpload, BackboneView};
pub use config::Config;
pub use deploy::DeployReport;
pub use error::TunerError;
pub use failover::FailedOver;
pub use finetune::{
    CachePolicy, CacheReport, ClassMetrics, DEFAULT_MEMORY_BUDGET, FinetuneReport, FinetuneRequest,
    Gate, Mode, NodeReport, Rebalanced, RunTimeline, ValSplit,
};
pub use head::{Head, HeadConfig, Prediction, RunReport};
pub use jobs::{JobFailure, JobKind, JobResult, JobView, NodeProgress, Phase};
pub use ndpipe_proto::RunPlan;
pub use nodes::NodeView;
pub use repair::RepairReport;
pub use rollout::{NodeRollout, RolloutReport};
pub use rollout_tasks::TaskCarry;
pub use server::Running;
pub use tuner::Tuner;
