//! `ndpipe bench ...`: benchmarks that print a table with the ratio to a reference measured in the
//! same run.

mod drift;
mod finetune;
mod infer;
mod ingest;

use anyhow::Result;
use clap::{Args, Subcommand};

/// Flags of `ndpipe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
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
    /// 4, and 1, 2, 4 PipeStores.
    Finetune(finetune::FinetuneBench),
    /// Drift: classes arrive in stages; stale vs fine-tuned accuracy at each stage.
    Drift(drift::DriftBench),
    /// SpiderCache and its peers on a real training run reading a PipeStore (or a replay).
    Cache(cachebench::cli::CacheArgs),
}

/// Runs `ndpipe bench`.
pub async fn run(args: BenchArgs) -> Result<()> {
    match args.which {
        Which::Ingest(b) => ingest::run(b).await,
        Which::Infer(b) => infer::run(b).await,
        Which::Finetune(b) => finetune::run(b).await,
        Which::Drift(b) => drift::run(b).await,
        Which::Cache(b) => {
            let exe = std::env::current_exe()?;
            tokio::task::spawn_blocking(move || cachebench::cli::run(b, exe)).await?
        }
    }
}
