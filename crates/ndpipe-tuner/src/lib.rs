//! The Tuner's training core: NDPipe's classifier-head training from features only.
//!
//! In ndpipe, PipeStores run the frozen backbone near the photos and send the Tuner features and
//! labels, never photos. The Tuner trains the classifier head on those features in `r` pipelined
//! runs (it trains run `k` while the PipeStores extract run `k+1`, warm-starting from run `k-1`),
//! then versions the head and deploys it to every PipeStore, which re-labels its store.
//!
//! This crate holds the pieces that need no network:
//! - [`schedule`]: the run plan (chunks aligned to the extraction batch) and NDPipe's step
//!   learning rate with its per-run scale;
//! - [`head`]: the head itself (candle-nn, Adam, L2), its training runs, evaluation, prediction,
//!   growth to new classes and the safetensors file that is deployed to PipeStores.
//!
//! The model registry, deploy and the gRPC side of the Tuner build on these.
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

pub mod api;
pub mod cached;
pub mod coordinator;
mod error;
pub mod head;
pub mod nodes;
pub mod schedule;
pub mod versions;

pub use error::TunerError;
pub use head::{Head, HeadConfig, Prediction, RunReport};
pub use schedule::RunPlan;
