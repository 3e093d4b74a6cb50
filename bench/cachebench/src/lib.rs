//! `cachebench`: the end-to-end evaluation of the `spidercache` crate's
//! policies (issues 5 and 12).
//!
//! A real `ndpipe serve` process holds Fashion-MNIST, imported with
//! `ndpipe import`. For every model (an MLP and a small CNN), policy, cache
//! size and seed, the same candle network (same seeds, optimiser and epoch
//! budget) trains on samples requested
//! through the policy; every read, the loop's after a miss and the policy's
//! own, goes to the PipeStore over loopback HTTP and then pays the
//! remote-storage model's latency and bandwidth cap. The loop reports
//! per-sample losses and penultimate embeddings back to the policy, and
//! validation accuracy after every epoch. The primary figure is storage
//! reads per requested sample, beside exact hits, substitutes, distinct
//! samples trained per epoch and top-1, as means and spreads over seeds.
//!
//! - [`data`]: the PipeStore process, import, listing, decoding.
//! - [`storage`]: the remote-storage model ([`storage::TokenBucket`]) as a
//!   [`spidercache::SampleSource`].
//! - [`model`]: the candle networks.
//! - [`train`]: the loop; [`metrics`]: what one run measured.
//! - [`bench`](mod@bench): one whole comparison, from [`bench::BenchConfig`];
//!   [`knobs`]: the flags that override policies' settings.
//! - [`summary`]: every policy over its seeds (what `--json` writes).
//! - [`replay`]: record a run's batches, replay them through every policy.
//! - [`report`]: markdown tables, the issue's targets; [`plot`]: PNG charts.
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
pub mod knobs;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod replay;
pub mod report;
pub mod storage;
pub mod summary;
pub mod train;

pub use error::BenchError;
