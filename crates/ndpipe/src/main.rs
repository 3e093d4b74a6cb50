//! `ndpipe`: the photo store that labels and learns near the data.
//!
//! One binary, one subcommand per role or tool. Library crates do the work; this crate parses
//! flags, wires the pieces together and turns errors into messages and exit codes.

mod bench;
mod client;
mod fashion_mnist;
mod import;
mod photos;
mod relabel;
mod server;

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
    /// Run the embedded single-node store (a PipeStore and its catalog) in one process.
    Serve(server::ServeArgs),
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
