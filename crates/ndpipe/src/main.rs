//! `ndpipe`: the photo store that labels and learns near the data.
//!
//! One binary, one subcommand per role or tool. Library crates do the work; this crate parses
//! flags, wires the pieces together and turns errors into messages and exit codes.

mod bench;
mod client;
mod fashion_mnist;
mod finetune;
mod grpc;
mod import;
mod photos;
mod relabel;
mod server;
mod tuner;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ndpipe: a photo store that labels photos with a deep-learning model on the storage servers.
#[derive(Debug, Parser)]
#[command(name = "ndpipe", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the embedded default: a PipeStore, its catalog and a Tuner in one process.
    Serve(server::ServeArgs),
    /// Run a PipeStore that registers with a remote Tuner (`--tuner URL`).
    Pipestore(server::ServeArgs),
    /// Run the Tuner: training server and coordinator of PipeStores.
    Tuner(tuner::TunerArgs),
    /// Fine-tune a new classifier head from the PipeStores' features, deploy it, re-label.
    Finetune(finetune::FinetuneArgs),
    /// List the model versions the Tuner knows (* marks the serving one).
    Versions(client::ServerArgs),
    /// Serve an earlier model version again (deploy + re-label).
    Rollback(finetune::RollbackArgs),
    /// Upload a folder of photos, or the Fashion-MNIST data set, to a running store.
    Import(import::ImportArgs),
    /// List, fetch, inspect or delete photos in a running store.
    Photos(photos::PhotosArgs),
    /// Re-label every stored photo with the model, on the store, and report label churn.
    Relabel(relabel::RelabelArgs),
    /// Reclaim the space of deleted photos in a running store.
    Compact(client::ServerArgs),
    /// Benchmarks that print a table with ratios to a reference measured in the same run.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => server::run(args).await,
            Command::Pipestore(args) => {
                if args.tuner.is_none() {
                    anyhow::bail!("ndpipe pipestore needs --tuner URL (the Tuner's gRPC address)");
                }
                server::run(args).await
            }
            Command::Tuner(args) => tuner::run(args).await,
            Command::Finetune(args) => finetune::finetune(args).await,
            Command::Versions(args) => finetune::versions(args).await,
            Command::Rollback(args) => finetune::rollback(args).await,
            Command::Import(args) => import::run(args).await,
            Command::Photos(args) => photos::run(args).await,
            Command::Compact(args) => photos::compact(args).await,
            Command::Relabel(args) => relabel::run(args).await,
            Command::Bench(args) => bench::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NDPIPE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
