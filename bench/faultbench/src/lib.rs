//! Fault injection against real ndpipe processes.
//!
//! Crash loops ([`crash()`]): one `ndpipe serve` under concurrent uploads (and deletes and
//! compactions, re-labelling jobs, or fine-tunes that deploy) is killed with SIGKILL at a random
//! moment and restarted; every acknowledged upload must read back byte for byte with its
//! catalog row (and its labels, with a model), every acknowledged delete must stay deleted. In
//! mode `replicated` a random node of three with two copies of each photo is killed instead,
//! and every acknowledged photo must read back through every node with two copies.
//!
//! Cluster rounds ([`run`]):
//! A Tuner and `nodes` PipeStores of the `ndpipe` binary run on loopback (with a cluster
//! secret, on SQLite or on one PostgreSQL catalog). Each round starts a fine-tune that deploys,
//! or a deploy of a known version, and at a random moment kills (-9), stops (SIGSTOP) or
//! restarts a random process, the Tuner included, then undoes the fault. A round is judged on
//! three counts, each with a target of 0: the job did not end (a hang), it ended neither done
//! nor failed with a message (unresolved), and the nodes did not settle on one version.
//!
//! - `procs`: one process that can be killed, stopped and started again;
//! - `cluster`: the processes, their ports and data, the photos imported;
//! - `api`: the Tuner's HTTP API;
//! - `rounds`: one round and its judgement;
//! - `crash`: the crash loops;
//! - `crash_jobs`: the jobs a crash loop runs beside its uploads;
//! - `crash_replicated`: the crash loop of a replicated cluster (three PipeStores, two copies);
//! - `failover`: a fine-tune that loses a node vs one that does not, on such a cluster;
//! - `netns`: the network namespaces of the partition rounds, their cuts and heals;
//! - `pg`: PostgreSQL in a namespace;
//! - `partition`: the partition rounds (and rolling upgrades) and their checks;
//! - `partition_load`: the uploads, reads and deletes of a partition round, timed;
//! - `cli`: `ndpipe-bench faults` and `ndpipe-bench crash`, their tables and JSON;
//! - `cli_partition`: `ndpipe-bench partition`, its table and JSON.

mod api;
pub mod cli;
pub mod cli_partition;
mod cluster;
mod crash;
mod crash_jobs;
mod crash_replicated;
mod failover;
mod netns;
mod partition;
mod partition_load;
mod pg;
mod procs;
mod rounds;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use rand::SeedableRng;
use serde::Serialize;

pub use crash::{CrashConfig, CrashMode, CrashModel, CrashReport, Cycle};
pub use failover::{FailoverConfig, FailoverRound, compare as compare_failover};
pub use netns::unavailable as namespaces_unavailable;
pub use partition::{
    CUTS, Deadlines, PartitionConfig, PartitionReport, PartitionRound, RoundKind, run as partition,
};
pub use partition_load::RequestStats;
pub use rounds::{Fault, Outcome, Round};

/// The flags of a PipeStore of a test cluster keeping two copies of each photo (besides its
/// catalog): quick repair rounds, no scrub, calls to other nodes within 5 s. The crash loop of
/// mode `replicated` and the replication tests start their nodes with them.
pub const TWO_COPIES: [&str; 8] = [
    "--replicas",
    "2",
    "--repair-interval-ms",
    "200",
    "--scrub-photos-per-second",
    "0",
    "--peer-timeout-ms",
    "5000",
];

/// Runs a crash loop (see [`CrashConfig`]) on an `ndpipe serve` of `exe` in `dir`.
pub fn crash(
    config: &CrashConfig,
    exe: &Path,
    dir: &Path,
    progress: impl FnMut(&Cycle),
) -> Result<CrashReport> {
    crash::run(config, exe, dir, progress)
}

/// How a fault-injection run is set up.
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// Rounds to run.
    pub rounds: usize,
    /// Seed of the choice of faults, targets and moments.
    pub seed: u64,
    /// PipeStores.
    pub nodes: usize,
    /// Fashion-MNIST photos imported into each PipeStore.
    pub photos_per_node: usize,
    /// The Tuner's `--node-timeout-ms`.
    pub node_timeout_ms: u64,
    /// The Tuner's `--node-lease-ms`.
    pub node_lease_ms: u64,
    /// The latest moment of a fault, in ms after the job starts.
    pub max_fault_delay_ms: u64,
    /// Each node's extraction rate in a fine-tune, so that the job lasts long enough for faults
    /// to land inside it.
    pub throttle_images_per_second: f64,
    /// A `postgres://` catalog for every process (default: each keeps SQLite).
    pub catalog: Option<String>,
    /// The model folder for the PipeStores.
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder (Debian's `dataset-fashion-mnist`).
    pub fashion_mnist_dir: PathBuf,
}

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    /// Every round.
    pub rounds: Vec<Round>,
    /// Rounds whose job had not ended when the hang guard ran out (target 0).
    pub hangs: usize,
    /// Rounds after which the nodes did not settle on one version (target 0).
    pub split_versions: usize,
    /// Rounds whose job neither succeeded nor failed with a message (target 0).
    pub unresolved: usize,
    /// Rounds whose job succeeded.
    pub done: usize,
    /// Rounds whose job failed with a message.
    pub failed: usize,
    /// Rounds whose fault came while the job ran.
    pub during_job: usize,
}

impl FaultReport {
    fn of(rounds: Vec<Round>) -> Self {
        let count = |f: &dyn Fn(&Round) -> bool| rounds.iter().filter(|r| f(r)).count();
        FaultReport {
            hangs: count(&|r| r.outcome == Outcome::Hang),
            split_versions: count(&|r| !r.one_version),
            unresolved: count(&|r| matches!(r.outcome, Outcome::Unresolved(_))),
            done: count(&|r| r.outcome == Outcome::Done),
            failed: count(&|r| matches!(r.outcome, Outcome::Failed(_))),
            during_job: count(&|r| r.during_job),
            rounds,
        }
    }

    /// Whether every count with a target of 0 is 0.
    pub fn clean(&self) -> bool {
        self.hangs == 0 && self.split_versions == 0 && self.unresolved == 0
    }
}

/// Starts a cluster of `exe` in `dir` and runs `config.rounds` rounds on it, calling `progress`
/// after each. Fails when the cluster cannot start or a round cannot start its job.
pub fn run(
    config: &FaultConfig,
    exe: &Path,
    dir: &Path,
    mut progress: impl FnMut(&Round),
) -> Result<FaultReport> {
    let cluster = procs::retrying_taken_ports(|| cluster::Cluster::start(config, exe, dir))
        .context("starting the cluster")?;
    let cluster = Arc::new(Mutex::new(cluster));
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(config.seed);
    let mut rounds = Vec::with_capacity(config.rounds);
    for i in 0..config.rounds {
        let round = rounds::run(i, &cluster, config, &mut rng).map_err(|e| {
            let logs = tails(&cluster);
            e.context(format!("round {i}; the last log lines:\n{logs}"))
        })?;
        progress(&round);
        rounds.push(round);
    }
    Ok(FaultReport::of(rounds))
}

/// The last log lines of every process.
fn tails(cluster: &Mutex<cluster::Cluster>) -> String {
    let cluster = cluster
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cluster
        .procs
        .iter()
        .map(|p| format!("== {}\n{}", p.name, p.log_tail(15)))
        .collect::<Vec<_>>()
        .join("\n")
}
