//! `cachebench`: the end-to-end evaluation of the `spidercache` crate's
//! policies (issue 5, part 4).
//!
//! A real `ndpipe serve` process holds Fashion-MNIST, imported with
//! `ndpipe import`. For every policy and cache size, the same candle MLP
//! (same seed, optimiser and epoch budget) trains on samples requested
//! through the policy; every miss is read from the PipeStore over loopback
//! HTTP and then pays the remote-storage model's latency and bandwidth cap.
//! The loop reports per-sample losses and penultimate embeddings back to the
//! policy, and validation accuracy after every epoch.
//!
//! - [`data`]: the PipeStore process, import, listing, decoding.
//! - [`storage`]: the remote-storage model ([`storage::TokenBucket`]) as a
//!   [`spidercache::SampleSource`].
//! - [`model`]: the candle network.
//! - [`train`]: the loop and its per-epoch measurements.
//! - [`bench`](mod@bench): one whole comparison, from [`bench::BenchConfig`].
//! - [`replay`]: record a run's batches, replay them through every policy.
//! - [`report`]: markdown tables, the issue's targets, SVG plots, JSON.
//! - [`cli`]: `ndpipe-bench cache run|replay`.
//!
//! ```no_run
//! let mut config = cachebench::bench::BenchConfig::quick();
//! config.ndpipe_bin = "target/debug/ndpipe".into();
//! config.out_dir = "/tmp/cachebench".into();
//! let results = cachebench::bench::run(&config)?;
//! println!("{}", cachebench::report::markdown(&results));
//! # Ok::<(), cachebench::BenchError>(())
//! ```
#![deny(missing_docs)]

pub mod bench;
pub mod cli;
pub mod data;
pub mod error;
pub mod model;
pub mod replay;
pub mod report;
pub mod storage;
pub mod train;

pub use error::BenchError;
