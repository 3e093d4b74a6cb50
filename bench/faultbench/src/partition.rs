//! Partition rounds: a Tuner and three PipeStores (two copies of each photo) on one PostgreSQL
//! catalog, each process in a network namespace of its own ([`crate::netns`]). Each round runs
//! uploads, reads and deletes through random front doors and a fine-tune or a deploy, cuts the
//! network for a random time (or, kind `rolling-upgrade`, restarts the PipeStores one at a
//! time, highest ordinal first, as a StatefulSet rolls), heals it, and checks: every photo
//! acknowledged in the round reads back through every door with two copies (after repair has
//! had its chance), no acknowledged delete is back, every node on one version, the job
//! resolved, no request without an answer or past its deadline. A last check reads back every
//! photo acknowledged in the whole run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::api::TunerApi;
use crate::cluster::{Spec, processes};
use crate::crash::get;
use crate::crash_replicated::{NODES, reads_back, short_of_copies, wait_placeable};
use crate::netns::Net;
use crate::partition_load::{Ledger, Load, RequestStats, agent};
use crate::pg::Postgres;
use crate::procs::Proc;
use crate::rounds::{Outcome, converge, follow, job_for};

/// What a round does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RoundKind {
    /// A PipeStore and PostgreSQL drop every packet between them (both ways).
    NodeDb,
    /// A PipeStore and the other PipeStores drop every packet between them (both ways); it
    /// still reaches the Tuner and PostgreSQL.
    NodePeers,
    /// One direction: the connections one process opens to another are cut (the Tuner to a
    /// PipeStore, a PipeStore to the Tuner, or a PipeStore to a peer), those the other opens
    /// still work.
    OneWay,
    /// The Tuner and one or two of the three PipeStores drop every packet between them.
    TunerHalf,
    /// No cut: the PipeStores restart one at a time (SIGTERM, start), highest ordinal first,
    /// the next once the previous one serves and every front door sees all nodes live again.
    RollingUpgrade,
}

/// The round kinds that cut the network.
pub const CUTS: [RoundKind; 4] = [
    RoundKind::NodeDb,
    RoundKind::NodePeers,
    RoundKind::OneWay,
    RoundKind::TunerHalf,
];

/// How a partition run is set up.
#[derive(Debug, Clone)]
pub struct PartitionConfig {
    /// Rounds to run.
    pub rounds: usize,
    /// Seed of the kinds, targets, moments and photos.
    pub seed: u64,
    /// The kinds a round is drawn from.
    pub kinds: Vec<RoundKind>,
    /// The shortest and longest cut, in ms.
    pub hold_ms: (u64, u64),
    /// The latest moment of a cut after the job starts, in ms.
    pub max_cut_delay_ms: u64,
    /// Threads sending requests during a round.
    pub workers: usize,
    /// Fashion-MNIST photos per PipeStore, imported through the first, for the fine-tunes.
    pub photos_per_node: usize,
    /// The PipeStores' deadlines, in ms: `catalog_timeout_ms`, `catalog_checkout_ms`,
    /// `peer_timeout_ms` and `copy_timeout_ms`.
    pub deadlines: Deadlines,
    /// The model folder.
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder.
    pub fashion_mnist_dir: PathBuf,
}

/// The deadlines the PipeStores are started with, in ms.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Deadlines {
    /// `catalog_timeout_ms`.
    pub catalog_timeout_ms: u64,
    /// `catalog_checkout_ms`.
    pub catalog_checkout_ms: u64,
    /// `peer_timeout_ms`.
    pub peer_timeout_ms: u64,
    /// `copy_timeout_ms`.
    pub copy_timeout_ms: u64,
}

impl Deadlines {
    /// The longest a request that needs the catalog waits on it (checkout, statement, 1 s).
    fn catalog(&self) -> u64 {
        self.catalog_checkout_ms + self.catalog_timeout_ms + 1000
    }

    /// The deadlines of an upload, a read and a delete, in that order: an upload may wait on
    /// the catalog, its forward to its primary and a copy; a read or a delete on the catalog
    /// and a call to another node.
    pub fn of_kinds(&self) -> [u64; 3] {
        let (catalog, peer) = (self.catalog(), self.peer_timeout_ms);
        [
            catalog + peer + self.copy_timeout_ms,
            catalog + peer,
            catalog + peer,
        ]
    }
}

/// One round's record.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRound {
    /// Its number, from 0.
    pub round: usize,
    /// What it did.
    pub kind: RoundKind,
    /// The cut exactly (which hosts, which direction), or the restarts.
    pub detail: String,
    /// "finetune" or "deploy VERSION".
    pub job: String,
    /// Ms after the job started that the cut came.
    pub at_ms: u64,
    /// Ms the cut lasted (the restarts, for a rolling upgrade).
    pub hold_ms: u64,
    /// How the job ended.
    pub outcome: Outcome,
    /// Whether every node ended on one version, in sync with the Tuner.
    pub one_version: bool,
    /// The versions the nodes ended on, when they differ.
    pub versions: Vec<String>,
    /// Uploads acknowledged in the round.
    pub uploads_acked: usize,
    /// Deletes acknowledged in the round.
    pub deletes_acked: usize,
    /// Photos acknowledged in the round that do not read back through every door (target 0).
    pub lost: usize,
    /// Photos whose delete was acknowledged in the round that read back (target 0).
    pub resurrected: usize,
    /// Photos acknowledged in the round short of two copies after the wait (target 0).
    pub short_of_copies: usize,
    /// The requests by kind.
    pub requests: BTreeMap<String, RequestStats>,
    /// What went wrong, photo by photo (the first few).
    pub problems: Vec<String>,
    /// Seconds the round took, checks included.
    pub seconds: f64,
}

impl PartitionRound {
    /// Whether every count with a target of 0 is 0.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.resurrected == 0
            && self.short_of_copies == 0
            && self.one_version
            && !matches!(self.outcome, Outcome::Hang | Outcome::Unresolved(_))
            && self
                .requests
                .values()
                .all(|r| r.hangs == 0 && r.wrong_bytes == 0)
    }
}

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// Every round.
    pub rounds: Vec<PartitionRound>,
    /// Why the run stopped before its last round (a job that could not start, the cluster
    /// that could not be reached), with the processes' last log lines.
    pub aborted: Option<String>,
    /// The deadlines the nodes ran with.
    pub deadlines: Deadlines,
    /// Photos acknowledged in the run and not deleted, checked at the end.
    pub present_at_end: usize,
    /// Of those, the ones that do not read back through every door at the end (target 0).
    pub lost_at_end: usize,
    /// What the last check found wrong (the first few).
    pub problems_at_end: Vec<String>,
}

impl PartitionReport {
    /// The request figures of every round, by kind.
    pub fn requests(&self) -> BTreeMap<String, RequestStats> {
        let mut all: BTreeMap<String, RequestStats> = BTreeMap::new();
        for r in &self.rounds {
            for (kind, stats) in &r.requests {
                all.entry(kind.clone()).or_default().add(stats);
            }
        }
        all
    }

    /// Whether every count with a target of 0 is 0 (requests past their deadline aside: see
    /// [`PartitionReport::late`]).
    pub fn clean(&self) -> bool {
        self.aborted.is_none()
            && self.lost_at_end == 0
            && self.rounds.iter().all(PartitionRound::clean)
    }

    /// Requests answered after their deadline.
    pub fn late(&self) -> usize {
        self.requests().values().map(|r| r.late).sum()
    }
}

/// The running cluster and its network; dropped in this order: processes, database, network.
struct Cluster {
    procs: Vec<Proc>,
    _db: Postgres,
    net: Net,
    doors: Vec<String>,
    tuner: TunerApi,
}

/// Host numbers on the network: the Tuner, then the PipeStores, then PostgreSQL.
const TUNER: usize = 0;
const POSTGRES: usize = NODES + 1;

fn start_cluster(config: &PartitionConfig, exe: &Path, dir: &Path) -> Result<Cluster> {
    let names: Vec<String> = (0..NODES).map(|i| format!("ps-{i}")).collect();
    let mut roles = vec!["tuner"];
    roles.extend(names.iter().map(String::as_str));
    roles.push("postgres");
    let net = Net::new(&roles).context("building the network namespaces")?;
    let db = Postgres::start(&net, POSTGRES).context("starting PostgreSQL in its namespace")?;
    let d = config.deadlines;
    let numbers = [
        d.catalog_timeout_ms.to_string(),
        d.catalog_checkout_ms.to_string(),
        d.copy_timeout_ms.to_string(),
        d.peer_timeout_ms.to_string(),
    ];
    let mut node = vec!["--catalog", db.url.as_str()];
    // Two copies as in the other replicated benches, with this run's peer deadline.
    for pair in crate::TWO_COPIES.chunks(2) {
        if pair[0] != "--peer-timeout-ms" {
            node.extend(pair);
        }
    }
    node.extend([
        "--catalog-timeout-ms",
        &numbers[0],
        "--catalog-checkout-ms",
        &numbers[1],
        "--copy-timeout-ms",
        &numbers[2],
        "--peer-timeout-ms",
        &numbers[3],
    ]);
    let tuner = [
        "--catalog",
        db.url.as_str(),
        "--node-timeout-ms",
        "3000",
        "--node-lease-ms",
        "3000",
    ];
    let spec = Spec {
        nodes: NODES,
        prefix: "ps",
        model_dir: &config.model_dir,
        tuner: &tuner,
        node: &node,
        net: Some(&net),
    };
    let mut procs = processes(exe, dir, &spec)?;
    for p in &mut procs {
        p.start()?;
    }
    let doors: Vec<String> = procs[1..].iter().map(|p| p.url.clone()).collect();
    wait_placeable(&agent(), &doors[0])?;
    // Through one door: placement spreads them over the nodes.
    crate::procs::import_fashion_mnist(
        exe,
        &doors[0],
        &config.fashion_mnist_dir,
        0,
        NODES * config.photos_per_node,
    )?;
    let tuner = TunerApi::new(&procs[TUNER].url);
    let cluster = Cluster {
        procs,
        _db: db,
        net,
        doors,
        tuner,
    };
    Ok(cluster)
}

/// Starts the cluster of `exe` in `dir` in network namespaces and runs `config.rounds` rounds,
/// calling `progress` after each. Fails when the cluster cannot start; a round that cannot
/// run (its job refused) ends the run early, with the rounds so far and the reason in the
/// report.
pub fn run(
    config: &PartitionConfig,
    exe: &Path,
    dir: &Path,
    mut progress: impl FnMut(&PartitionRound),
) -> Result<PartitionReport> {
    let mut cluster = start_cluster(config, exe, dir)?;
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(config.seed);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut rounds = Vec::with_capacity(config.rounds);
    let mut aborted = None;
    for i in 0..config.rounds {
        match run_round(i, &mut cluster, config, &ledger, &mut rng) {
            Ok(round) => {
                progress(&round);
                rounds.push(round);
            }
            Err(e) => {
                let tails: Vec<String> = cluster
                    .procs
                    .iter()
                    .map(|p| format!("== {}\n{}", p.name, p.log_tail(10)))
                    .collect();
                aborted = Some(format!(
                    "round {i}: {e:#}; the last log lines:\n{}",
                    tails.join("\n")
                ));
                break;
            }
        }
    }
    let present = ledger
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .present
        .clone();
    let mut problems_at_end = Vec::new();
    let agent = agent();
    for (id, sha) in &present {
        for door in &cluster.doors {
            if let Err(why) = reads_back(&agent, door, *id, sha) {
                problems_at_end.push(why);
                break;
            }
        }
    }
    let lost_at_end = problems_at_end.len();
    problems_at_end.truncate(20);
    Ok(PartitionReport {
        rounds,
        aborted,
        deadlines: config.deadlines,
        present_at_end: present.len(),
        lost_at_end,
        problems_at_end,
    })
}

fn run_round(
    round: usize,
    cluster: &mut Cluster,
    config: &PartitionConfig,
    ledger: &Arc<Mutex<Ledger>>,
    rng: &mut impl Rng,
) -> Result<PartitionRound> {
    let started = Instant::now();
    let kind = *config.kinds.choose(rng).context("no round kinds given")?;
    let (job, path, body) = job_for(&cluster.tuner.versions()?, NODES, 40.0, rng);
    {
        let mut l = ledger.lock().unwrap_or_else(PoisonError::into_inner);
        l.fresh.clear();
        l.fresh_deleted.clear();
    }
    let deadlines = config.deadlines.of_kinds();
    let load = Load::start(
        &cluster.doors,
        deadlines,
        ledger,
        config.workers,
        rng.random(),
    );
    let (status, reply) = post_job(&cluster.tuner, &path, &body)?;
    if status != 202 {
        load.finish();
        return Err(anyhow!("POST {path} answered {status}: {reply}"));
    }
    let id = reply["id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST {path}: no job id in {reply}"))?
        .to_string();
    let at_ms = rng.random_range(0..=config.max_cut_delay_ms);
    std::thread::sleep(Duration::from_millis(at_ms));
    let cut_started = Instant::now();
    let detail = match kind {
        RoundKind::RollingUpgrade => rolling_upgrade(cluster)?,
        _ => {
            let detail = cut(&cluster.net, kind, rng)?;
            let (lo, hi) = config.hold_ms;
            std::thread::sleep(Duration::from_millis(rng.random_range(lo..=hi.max(lo))));
            cluster.net.heal()?;
            detail
        }
    };
    let hold_ms = cut_started.elapsed().as_millis() as u64;
    // Requests go on for a moment after the heal, so that the recovery is measured too.
    std::thread::sleep(Duration::from_secs(1));
    let requests = load.finish();
    let outcome = follow(&cluster.tuner, &id, Duration::from_secs(120));
    let (one_version, versions) = converge(&cluster.tuner, NODES, Duration::from_secs(90));
    let (fresh, fresh_deleted, present) = {
        let l = ledger.lock().unwrap_or_else(PoisonError::into_inner);
        (l.fresh.clone(), l.fresh_deleted.clone(), l.present.clone())
    };
    let agent = agent();
    let still: std::collections::HashMap<u64, String> = fresh
        .iter()
        .filter_map(|id| present.get(id).map(|sha| (*id, sha.clone())))
        .collect();
    let short = short_of_copies(&agent, &cluster.doors[0], &still)?;
    let mut problems: Vec<String> = short
        .iter()
        .take(5)
        .map(|id| format!("photo {id}: acknowledged, but short of two copies"))
        .collect();
    let mut lost = 0;
    for (id, sha) in &still {
        for door in &cluster.doors {
            if let Err(why) = reads_back(&agent, door, *id, sha) {
                lost += 1;
                problems.push(why);
                break;
            }
        }
    }
    let mut resurrected = 0;
    for id in &fresh_deleted {
        for door in &cluster.doors {
            let (status, _) = get(&agent, &format!("{door}/v1/photos/{id}"))?;
            if status == 200 {
                resurrected += 1;
                problems.push(format!("photo {id}: deleted, but {door} serves it"));
                break;
            }
        }
    }
    problems.truncate(20);
    Ok(PartitionRound {
        round,
        kind,
        detail,
        job,
        at_ms,
        hold_ms,
        outcome,
        one_version,
        versions,
        uploads_acked: fresh.len(),
        deletes_acked: fresh_deleted.len(),
        lost,
        resurrected,
        short_of_copies: short.len(),
        requests,
        problems,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `POST path`, again every half second for up to a minute while the Tuner answers 409
/// `job_running`: the previous round's job may have left a node being brought to the active
/// version.
fn post_job(
    tuner: &TunerApi,
    path: &str,
    body: &serde_json::Value,
) -> Result<(u16, serde_json::Value)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, reply) = tuner.post(path, body)?;
        if status != 409 || reply["error"] != "job_running" || Instant::now() > deadline {
            return Ok((status, reply));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Makes a cut of `kind` with random hosts; says exactly what it cut.
fn cut(net: &Net, kind: RoundKind, rng: &mut impl Rng) -> Result<String> {
    let node = 1 + rng.random_range(0..NODES);
    let name = |h: usize| match h {
        TUNER => "tuner".to_string(),
        POSTGRES => "postgres".to_string(),
        n => format!("ps-{}", n - 1),
    };
    match kind {
        RoundKind::NodeDb => {
            net.cut_both(node, POSTGRES)?;
            Ok(format!("{} x postgres", name(node)))
        }
        RoundKind::NodePeers => {
            for peer in (1..=NODES).filter(|&p| p != node) {
                net.cut_both(node, peer)?;
            }
            Ok(format!("{} x its peers", name(node)))
        }
        RoundKind::OneWay => {
            let peer = 1 + (node % NODES);
            let (from, to) = *[(TUNER, node), (node, TUNER), (node, peer)]
                .choose(rng)
                .expect("three pairs");
            net.cut_one_way(from, to)?;
            Ok(format!("{} -> {} cut", name(from), name(to)))
        }
        RoundKind::TunerHalf => {
            let count = rng.random_range(NODES / 2..=NODES.div_ceil(2)).max(1);
            let mut nodes: Vec<usize> = (1..=NODES).collect();
            let (cut, _) = nodes.partial_shuffle(rng, count);
            let mut names = Vec::new();
            for &n in cut.iter() {
                net.cut_both(TUNER, n)?;
                names.push(name(n));
            }
            Ok(format!("tuner x {}", names.join(", ")))
        }
        RoundKind::RollingUpgrade => Err(anyhow!("a rolling upgrade is not a cut")),
    }
}

/// Restarts the PipeStores one at a time, highest ordinal first; each next one only once the
/// previous serves again and its front door sees every node live.
fn rolling_upgrade(cluster: &mut Cluster) -> Result<String> {
    let agent = agent();
    for i in (0..NODES).rev() {
        cluster.procs[1 + i].restart()?;
        wait_placeable(&agent, &cluster.doors[i])?;
    }
    Ok(format!(
        "restarted {}",
        (0..NODES)
            .rev()
            .map(|i| format!("ps-{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
