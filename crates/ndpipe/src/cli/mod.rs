//! The subcommands: servers (`serve`, `pipestore`, `tuner`, `gateway`), operator tools over HTTP, and the
//! configuration file.

mod cluster;
mod cluster_init;
mod config;
mod finetune;
mod flags;
mod gateway;
mod import;
mod keys;
mod label;
mod models;
mod nodes;
mod photos;
mod relabel;
mod secure;
mod serve;
mod tasks;
mod tuner;

use anyhow::Result;
use clap::{Parser, Subcommand};
use ndpipe::client::ServerArgs;

/// ndpipe: a photo store that labels photos with a deep-learning model on the storage servers.
#[derive(Debug, Parser)]
#[command(name = "ndpipe", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the embedded default: a PipeStore, its catalog and a Tuner in one process.
    Serve(serve::ServeArgs),
    /// Run a PipeStore that registers with a remote Tuner (`--tuner URL`).
    Pipestore(serve::ServeArgs),
    /// Run the Tuner: training server and coordinator of PipeStores.
    Tuner(tuner::TunerArgs),
    /// Run a gateway: a front door to a replicated cluster that holds no photo itself.
    Gateway(gateway::GatewayArgs),
    /// Fine-tune a new classifier head of a task from the PipeStores' features; deploy it (when
    /// it validates no worse than the task's head now) and re-label.
    Finetune(finetune::FinetuneArgs),
    /// List the model versions the Tuner knows, with their task (* marks the serving ones).
    Versions(ServerArgs),
    /// Serve a model version of its task (deploy + re-label): an earlier one, or a candidate.
    Rollback(finetune::RollbackArgs),
    /// Tasks: named classifiers over the backbone, each with its own classes and labels.
    Tasks(tasks::TasksArgs),
    /// Give many photos a task's class as ground truth (by ids, a search or a CSV file), or
    /// accept their predicted labels.
    Label(label::LabelArgs),
    /// Backbones the Tuner keeps for rollouts: add one (an ONNX file and its manifest), list them.
    Models(models::ModelsArgs),
    /// Serve another backbone on every node: stage it, re-extract and label every photo with
    /// it while the old one serves, then switch everywhere.
    Rollout(models::RolloutArgs),
    /// The Tuner's PipeStores: list them, drain, activate or remove one.
    Nodes(nodes::NodesArgs),
    /// A replicated cluster as a PipeStore sees it: copy counts, nodes, repair progress.
    Cluster(cluster::ClusterArgs),
    /// Upload a folder of photos, or the Fashion-MNIST data set, to a running store.
    Import(import::ImportArgs),
    /// List, fetch, inspect or delete photos in a running store.
    Photos(photos::PhotosArgs),
    /// Re-label every stored photo with the model, on the store, and report label churn.
    Relabel(relabel::RelabelArgs),
    /// Access keys of a store (S3 SigV4 and /v1 bearer tokens): create, list, delete.
    Keys(keys::KeysArgs),
    /// Reclaim the space of deleted photos in a running store.
    Compact(ServerArgs),
    /// The configuration file: print a commented example, or check a file.
    Config(config::ConfigArgs),
}

impl Cli {
    /// Runs the chosen subcommand.
    pub(crate) async fn run(self) -> Result<()> {
        match self.command {
            Command::Serve(args) => serve::serve(args).await,
            Command::Pipestore(args) => serve::pipestore(args).await,
            Command::Tuner(args) => tuner::run(args).await,
            Command::Gateway(args) => gateway::run(args).await,
            Command::Finetune(args) => finetune::finetune(args).await,
            Command::Versions(args) => finetune::versions(args).await,
            Command::Rollback(args) => finetune::rollback(args).await,
            Command::Tasks(args) => tasks::run(args).await,
            Command::Label(args) => label::run(args).await,
            Command::Models(args) => models::run(args).await,
            Command::Rollout(args) => models::rollout(args).await,
            Command::Nodes(args) => nodes::run(args).await,
            Command::Cluster(args) => cluster::run(args).await,
            Command::Import(args) => import::run(args).await,
            Command::Photos(args) => photos::run(args).await,
            Command::Compact(args) => photos::compact(args).await,
            Command::Keys(args) => keys::run(args).await,
            Command::Relabel(args) => relabel::run(args).await,
            Command::Config(args) => config::run(args),
        }
    }
}

/// What every server does first: warns when a secret was given on the command line (any user
/// can read it in the process list; `--token-file` or `NDPIPE_TOKEN` keep it out), and raises
/// the soft limit of open files to the hard one, so that many idle clients cannot starve the
/// server of descriptors at the usual 1,024.
pub(crate) fn server_preflight() {
    let on_command_line = std::env::args().any(|a| a == "--token" || a.starts_with("--token="));
    if on_command_line {
        tracing::warn!(
            "the bearer token was given with --token: any user can read it in the process list; use --token-file or NDPIPE_TOKEN"
        );
    }
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open files limit"),
    }
}

/// Waits for Ctrl-C or SIGTERM.
pub(crate) async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
