//! `ndpipe-bench`: ndpipe's benchmarks, outside the product. Each prints a table with the ratio
//! to a reference measured in the same run, because these machines are noisy, and can write its
//! figures as JSON.
//!
//! The servers run in this process through the `ndpipe-store` and `ndpipe-tuner` libraries
//! ([`cluster`]); the cache benchmark (the `cachebench` crate) and the fault-injection run (the
//! `faultbench` crate) start the `ndpipe` binary that sits next to this one.

mod balance;
mod cluster;
mod console;
mod cost;
mod crops;
mod drift;
mod dup_set;
mod dup_stats;
mod dup_store;
mod duplicates;
mod emulated;
mod finetune;
mod fuzz;
mod hostile_images;
mod infer;
mod ingest;
mod int8;
mod memory;
mod other;
mod replication;
mod replication_s3;
mod rollout;
mod rollout_slow;
mod rsweep;
mod s3;
mod s3_null;
mod scale;
mod scaling;
mod serve_process;
mod similar;
mod words;
mod words_eval;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// ndpipe's benchmarks: each prints a table with ratios to a reference measured in the same run.
#[derive(Debug, Parser)]
#[command(name = "ndpipe-bench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    which: Which,
}

#[derive(Debug, Subcommand)]
enum Which {
    /// Upload throughput over HTTP vs the decode-limited rate of the same photos.
    Ingest(ingest::IngestBench),
    /// Offline inference: model-only limit, end-to-end re-labelling, NDPipe's Python loop, feed
    /// rates, int8, and the 201-to-label latency.
    Infer(infer::InferBench),
    /// Fine-tuning across PipeStores: near-data vs conventional under bandwidth caps, r = 1, 2,
    /// 4, and 1, 2, 4 PipeStores, load balancing.
    Finetune(finetune::FinetuneBench),
    /// Scaling on emulated PipeStores (each model capped at a rate calibrated in the same run):
    /// 1, 2, 4, 8 nodes, and near-data vs conventional under a cap on the Tuner's ingress.
    Scaling(scaling::ScalingBench),
    /// Pipelined runs on emulated PipeStores, training-heavy: the time r = 1, 2, 4 runs save,
    /// (extract-only + train-only) - total, and top-1 per r.
    Rsweep(rsweep::RsweepBench),
    /// A backbone rollout on emulated PipeStores: the job's aggregate photos/s against the sum
    /// of the nodes' model-only rates measured in the same job (target 0.9).
    Rollout(rollout::RolloutBench),
    /// Load balancing on emulated PipeStores with one node 4x slower: completion without and
    /// with balancing vs the proportional ideal measured in the same run.
    Balance(balance::BalanceBench),
    /// Dollars per million images of feature extraction, near-data vs conventional, from the
    /// model-only rate and wire bytes measured in the same run and a stated price table.
    Cost(cost::CostBench),
    /// S3 throughput: the same large JPEGs up and down through aws s3 cp, s5cmd, boto3 and /v1.
    S3(s3::S3Bench),
    /// Replication: upload and read throughput with 1, 2 and 3 copies, and the repair rate after
    /// a node is removed, on three PipeStores sharing PostgreSQL.
    Replication(replication::ReplicationBench),
    /// Scale: one node filled to N photos; ingest rate, search and listing p99, disk per photo
    /// and RSS at every step, then a fine-tune from stored features and its re-labelling.
    Scale(scale::ScaleBench),
    /// Memory after hostile uploads: RSS at the start, after N valid and after N mutated
    /// images, and their ratio, over rounds on fresh servers.
    Memory(memory::MemoryBench),
    /// The web console's pages rendered at 10^5 photos: median and spread per page against
    /// the target of 100 ms.
    Console(console::ConsoleBench),
    /// Similar photos: the node's HNSW index against exact cosine search over 10^5 real and
    /// perturbed EfficientNet-Lite0 vectors: recall@10, query p50/p99, build time, bytes.
    Similar(similar::SimilarBench),
    /// Duplicates: precision and recall of exact, near and semantic pairs on real photos and
    /// their edited copies against controls, the threshold sweep, and the near-pair search's
    /// time among 10^5 hashes against a full scan.
    Duplicates(duplicates::DuplicatesBench),
    /// Drift: classes arrive in stages; stale vs fine-tuned accuracy at each stage.
    Drift(drift::DriftBench),
    /// SpiderCache and its peers on a real training run reading a PipeStore (or a replay).
    Cache(cachebench::cli::CacheArgs),
    /// Fault injection: kill -9, SIGSTOP and restarts of a random process of a real cluster at a
    /// random moment of a fine-tune or deploy; counts hangs, split versions, unresolved jobs.
    Faults(faultbench::cli::FaultArgs),
    /// Fuzzing: every cargo-fuzz target of `fuzz/` for a number of executions, with its new
    /// coverage, crashes, timeouts and peak RSS.
    Fuzz(fuzz::FuzzBench),
    /// Crash loops: kill -9 `ndpipe serve` (or, `--mode replicated`, a node of three keeping two
    /// copies of each photo) at a random moment of concurrent uploads, deletes and compactions,
    /// restart, and check every acknowledged write.
    Crash(faultbench::cli::CrashArgs),
    /// Partitions: a Tuner, three PipeStores and PostgreSQL in network namespaces; each round
    /// cuts a link (a node from the database, from its peers, one direction, the Tuner from
    /// half the nodes) or rolls the PipeStores, under uploads, reads, deletes and a job, heals,
    /// and checks every acknowledged photo, delete, version, job and deadline.
    Partition(faultbench::cli_partition::PartitionArgs),
    /// Search in words: a written query list mapped onto ImageNet's and Fashion-MNIST's classes
    /// by the words model against exact/substring matching and shuffled names; top-1, top-3,
    /// load, build and query costs.
    Words(words::WordsBench),
    /// Labels people can trust: in-task photos kept vs held-out classes and real photos sent
    /// to `other`, under each label rule (none, floor, novelty, both), over seeds.
    Other(other::OtherBench),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("NDPIPE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
        .and_then(|rt| rt.block_on(run(cli.which)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(which: Which) -> Result<()> {
    match which {
        Which::Ingest(b) => ingest::run(b).await,
        Which::Infer(b) => infer::run(b).await,
        Which::Finetune(b) => finetune::run(b).await,
        Which::Drift(b) => drift::run(b).await,
        Which::Duplicates(b) => duplicates::run(b).await,
        Which::S3(b) => s3::run(b).await,
        Which::Scaling(b) => scaling::run(b).await,
        Which::Rsweep(b) => rsweep::run(b).await,
        Which::Rollout(b) => rollout::run(b).await,
        Which::Balance(b) => balance::run(b).await,
        Which::Cost(b) => tokio::task::spawn_blocking(move || cost::run(b)).await?,
        Which::Replication(b) => replication::run(b).await,
        Which::Fuzz(b) => fuzz::run(b).await,
        Which::Scale(b) => scale::run(b).await,
        Which::Memory(b) => memory::run(b).await,
        Which::Words(b) => words::run(b).await,
        Which::Other(b) => other::run(b).await,
        Which::Similar(b) => similar::run(b).await,
        Which::Console(b) => console::run(b).await,
        Which::Cache(b) => {
            let ndpipe = ndpipe_binary()?;
            tokio::task::spawn_blocking(move || cachebench::cli::run(b, ndpipe)).await?
        }
        Which::Faults(b) => {
            let ndpipe = ndpipe_binary()?;
            tokio::task::spawn_blocking(move || faultbench::cli::run(b, ndpipe)).await?
        }
        Which::Partition(b) => {
            let ndpipe = ndpipe_binary()?;
            tokio::task::spawn_blocking(move || faultbench::cli_partition::run(b, ndpipe)).await?
        }
        Which::Crash(mut b) => {
            let ndpipe = ndpipe_binary()?;
            tokio::task::spawn_blocking(move || {
                // Mode replicated without --catalog: a throw-away PostgreSQL database.
                let db = match (b.mode, &b.catalog) {
                    (faultbench::CrashMode::Replicated, None) => {
                        let db = ndpipe_catalog::test_postgres::database("bench_crash_replicated")
                            .context("PostgreSQL is needed (NDPIPE_SKIP_POSTGRES is set)")?;
                        b.catalog = Some(db.url.clone());
                        Some(db)
                    }
                    _ => None,
                };
                let result = faultbench::cli::run_crash(b, ndpipe);
                drop(db);
                result
            })
            .await?
        }
    }
}

/// The `ndpipe` binary built beside this one (`target/<profile>/ndpipe`), which the cache
/// benchmark and the fault-injection run start.
pub(crate) fn ndpipe_binary() -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating ndpipe-bench")?;
    Ok(me.with_file_name("ndpipe"))
}
