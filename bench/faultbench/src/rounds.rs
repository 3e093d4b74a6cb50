//! One round: start a fine-tune or a deploy, hit a random process with a random fault at a
//! random moment, undo the fault, and judge the outcome: did the job end, with a message if it
//! failed, and do all nodes end on one version?

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde::Serialize;
use serde_json::{Value, json};

use crate::FaultConfig;
use crate::cluster::Cluster;
use crate::procs::Proc;

/// What is done to the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL, then a start after a pause.
    Kill9,
    /// SIGSTOP, then SIGCONT after a pause (up to twice the node timeout).
    Stop,
    /// SIGTERM (a clean shutdown), then a start.
    Restart,
}

/// How a round's job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "detail")]
pub enum Outcome {
    /// It succeeded.
    Done,
    /// It failed with this message.
    Failed(String),
    /// It neither succeeded nor failed with a message (lost, or failed without saying why).
    Unresolved(String),
    /// It had not ended when the hang guard ran out.
    Hang,
}

/// One round's record.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// Its number, from 0.
    pub round: usize,
    /// "finetune" or "deploy VERSION".
    pub job: String,
    /// The fault.
    pub fault: Fault,
    /// The process hit: "tuner" or a PipeStore's name.
    pub target: String,
    /// Milliseconds after the job started that the fault came.
    pub at_ms: u64,
    /// Milliseconds the fault lasted before it was undone.
    pub hold_ms: u64,
    /// Whether the job was still running when the fault came.
    pub during_job: bool,
    /// How the job ended.
    pub outcome: Outcome,
    /// Whether every node ended on one version, in sync with the Tuner.
    pub one_version: bool,
    /// The versions the nodes ended on, when they differ.
    pub versions: Vec<String>,
    /// Seconds the round took, recovery included.
    pub seconds: f64,
}

/// Runs round `round` on `cluster`.
pub(crate) fn run(
    round: usize,
    cluster: &Arc<Mutex<Cluster>>,
    config: &FaultConfig,
    rng: &mut impl Rng,
) -> Result<Round> {
    let started = Instant::now();
    let (job, path, body) = pick_job(cluster, config, rng)?;
    let fault = *[Fault::Kill9, Fault::Stop, Fault::Restart]
        .choose(rng)
        .expect("three faults");
    let target = rng.random_range(0..=config.nodes);
    let at_ms = rng.random_range(0..=config.max_fault_delay_ms);
    let hold_ms = match fault {
        Fault::Stop => rng.random_range(0..=2 * config.node_timeout_ms),
        Fault::Kill9 => rng.random_range(0..=2_000),
        Fault::Restart => 0,
    };
    let api = crate::api::TunerApi::new(&lock(cluster).procs[0].url);
    let (status, reply) = api.post(&path, &body)?;
    if status != 202 {
        return Err(anyhow!("POST {path} answered {status}: {reply}"));
    }
    let id = reply["id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST {path}: no job id in {reply}"))?
        .to_string();
    let injector = {
        let cluster = cluster.clone();
        let job = format!("/v1/tuner/jobs/{id}");
        std::thread::spawn(move || inject(&cluster, &job, target, fault, (at_ms, hold_ms)))
    };
    let guard = Duration::from_millis(6 * config.node_timeout_ms) + Duration::from_secs(60);
    let outcome = follow(&api, &id, guard);
    let during_job = injector
        .join()
        .map_err(|_| anyhow!("the fault thread panicked"))??;
    let (one_version, versions) = converge(&api, config.nodes, Duration::from_secs(90));
    let target = lock(cluster).procs[target].name.clone();
    Ok(Round {
        round,
        job,
        fault,
        target,
        at_ms,
        hold_ms,
        during_job,
        outcome,
        one_version,
        versions,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn lock(cluster: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    cluster
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fine-tune that deploys (two times in three), or a deploy of a known version. The
/// fine-tune's extraction is throttled on every node so that faults land inside it.
fn pick_job(
    cluster: &Mutex<Cluster>,
    config: &FaultConfig,
    rng: &mut impl Rng,
) -> Result<(String, String, Value)> {
    let versions = lock(cluster).tuner.versions()?;
    Ok(job_for(
        &versions,
        config.nodes,
        config.throttle_images_per_second,
        rng,
    ))
}

/// A fine-tune that deploys (two times in three, and always while fewer than two versions
/// exist), or a deploy of one of `versions`: its name, API path and body. The fine-tune's
/// extraction is throttled to `throttle` photos/s on each of the `nodes` PipeStores.
pub(crate) fn job_for(
    versions: &[String],
    nodes: usize,
    throttle: f64,
    rng: &mut impl Rng,
) -> (String, String, Value) {
    if versions.len() >= 2 && rng.random_range(0..3) == 0 {
        let version = versions.choose(rng).expect("two versions").clone();
        return (
            format!("deploy {version}"),
            format!("/v1/tuner/deploy/{version}"),
            json!({}),
        );
    }
    let throttle: serde_json::Map<String, Value> = (0..nodes)
        .map(|i| (format!("ps-{i}"), json!(throttle)))
        .collect();
    (
        "finetune".into(),
        "/v1/tuner/finetune".into(),
        json!({"runs": 2, "epochs": 2, "chunk_size": 8, "load_balance": false, "deploy": true,
               "throttle": throttle}),
    )
}

/// Waits `at_ms`, hits process `target` with `fault`, and undoes it after `hold_ms`. Returns
/// whether the job at `job` (its API path) was still running when the fault came.
fn inject(
    cluster: &Mutex<Cluster>,
    job: &str,
    target: usize,
    fault: Fault,
    (at_ms, hold_ms): (u64, u64),
) -> Result<bool> {
    std::thread::sleep(Duration::from_millis(at_ms));
    let during_job = {
        let cluster = lock(cluster);
        let phase = cluster.tuner.get(job).map(|j| j["phase"].clone());
        phase.is_ok_and(|p| p != "done" && p != "failed")
    };
    let hit = |f: &dyn Fn(&mut Proc) -> Result<()>| f(&mut lock(cluster).procs[target]);
    match fault {
        Fault::Kill9 => hit(&|p| {
            p.kill9();
            Ok(())
        })?,
        Fault::Stop => hit(&|p| p.stop())?,
        Fault::Restart => {
            hit(&|p| p.restart())?;
            return Ok(during_job);
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    hit(&|p| p.recover())?;
    Ok(during_job)
}

/// Polls job `id` until it is done or failed, or `guard` runs out. A Tuner that does not answer
/// (killed, stopped) is polled again.
pub(crate) fn follow(api: &crate::api::TunerApi, id: &str, guard: Duration) -> Outcome {
    let deadline = Instant::now() + guard;
    while Instant::now() < deadline {
        match api.get(&format!("/v1/tuner/jobs/{id}")) {
            Ok(job) if job["phase"] == "done" => return Outcome::Done,
            Ok(job) if job["phase"] == "failed" => {
                let message = job["error"]["message"].as_str().unwrap_or("").trim();
                return if message.is_empty() {
                    Outcome::Unresolved(format!("failed without a message: {job}"))
                } else {
                    Outcome::Failed(message.to_string())
                };
            }
            Ok(_) => {}
            Err(e) if e.to_string().contains("HTTP 404") => {
                return Outcome::Unresolved(format!("the job is gone: {e}"));
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Outcome::Hang
}

/// Waits until all `nodes_wanted` nodes are live, in sync and on one version; returns whether that happened
/// within `limit`, and the versions seen last when it did not.
pub(crate) fn converge(
    api: &crate::api::TunerApi,
    nodes_wanted: usize,
    limit: Duration,
) -> (bool, Vec<String>) {
    let deadline = Instant::now() + limit;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        if let Ok(nodes) = api.nodes() {
            let versions: Vec<String> = nodes
                .iter()
                .map(|n| n["version"].as_str().unwrap_or("none").to_string())
                .collect();
            let settled = nodes.len() == nodes_wanted
                && nodes
                    .iter()
                    .all(|n| n["live"] == true && n["in_sync"] == true)
                && versions.windows(2).all(|w| w[0] == w[1]);
            if settled {
                return (true, Vec::new());
            }
            last = versions;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (false, last)
}
