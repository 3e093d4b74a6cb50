//! The crash loop of a replicated cluster: a Tuner and three PipeStores (with the model, which
//! a node needs to join a Tuner) keeping two copies of each photo on one PostgreSQL catalog, under continuous uploads through every node's front
//! door. Each cycle kills a random PipeStore with SIGKILL at a random moment and starts it
//! again while the uploads go on. At the end every acknowledged photo must read back byte for
//! byte through every node, and the cluster must come back to two copies of each.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use crate::cluster::{Spec, processes};
use crate::crash::{CrashConfig, CrashReport, Cycle, get, photo};
use crate::procs::{Proc, retrying_taken_ports};

/// PipeStores in the cluster (and in the partition harness's).
pub(crate) const NODES: usize = 3;
/// Copies of each photo (also in the partition harness's cluster).
pub(crate) const REPLICAS: usize = 2;
/// Looks at the copy counts after the last restart, this many times at most (half a second
/// apart), until every acknowledged photo has two: a node's lease may still be running out.
const SETTLE_POLLS: usize = 240;

/// Runs `config.cycles` crash cycles on a replicated cluster of `exe` in `dir` on the catalog
/// `catalog`, calling `progress` after each.
pub(crate) fn run(
    config: &CrashConfig,
    catalog: &str,
    exe: &Path,
    dir: &Path,
    mut progress: impl FnMut(&Cycle),
) -> Result<CrashReport> {
    let Some(model) = &config.model else {
        bail!("crash mode replicated needs the model: a PipeStore without one joins no Tuner");
    };
    let mut procs = retrying_taken_ports(|| start_cluster(exe, dir, catalog, &model.model_dir))?;
    let urls: Vec<String> = procs[1..].iter().map(|p| p.url.clone()).collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    wait_placeable(&agent, &urls[0]).map_err(|e| {
        let tails: Vec<String> = procs
            .iter()
            .map(|p| format!("{}: {}", p.name, p.log_tail(3)))
            .collect();
        e.context(tails.join("\n"))
    })?;
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(config.seed);
    let writers: Vec<_> = (0..config.uploaders)
        .map(|w| {
            let (agent, urls, acked, stop, tally) = (
                agent.clone(),
                urls.clone(),
                acked.clone(),
                stop.clone(),
                tally.clone(),
            );
            let seed = rng.random::<u64>() ^ w as u64;
            std::thread::spawn(move || upload_until(&agent, &urls, (&acked, &tally), &stop, seed))
        })
        .collect();
    let mut cycles = Vec::new();
    for cycle in 0..config.cycles {
        let before = acked_len(&acked);
        let killed_at_ms = rng.random_range(100..=config.max_kill_ms.max(100));
        std::thread::sleep(Duration::from_millis(killed_at_ms));
        let victim = 1 + rng.random_range(0..NODES);
        procs[victim].kill9();
        let restarted = Instant::now();
        let started = procs[victim].start();
        if let Err(e) = started {
            stop.store(true, Ordering::Relaxed);
            return Err(e.context(format!(
                "restarting {} after cycle {cycle}",
                procs[victim].name
            )));
        }
        let record = Cycle {
            cycle,
            killed_at_ms,
            acknowledged: acked_len(&acked) - before,
            deleted: 0,
            restart_ms: restarted.elapsed().as_millis() as u64,
            during_job: false,
            node: procs[victim].name.clone(),
        };
        progress(&record);
        cycles.push(record);
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.join();
    }
    let acked = acked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut refusals: Vec<String> = tally
        .kinds
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(kind, n)| format!("{n} x {kind}"))
        .collect();
    refusals.sort();
    let mut problems = Vec::new();
    let short = short_of_copies(&agent, &urls[0], &acked)?;
    for id in short.iter().take(5) {
        problems.push(format!(
            "photo {id}: acknowledged, but not back to {REPLICAS} copies"
        ));
    }
    let mut lost = 0;
    for (id, sha) in &acked {
        for url in &urls {
            if let Err(why) = reads_back(&agent, url, *id, sha) {
                lost += 1;
                problems.push(why);
                break;
            }
        }
    }
    problems.truncate(20);
    Ok(CrashReport {
        cycles,
        acknowledged: acked.len(),
        lost,
        deleted: 0,
        resurrected: 0,
        kills_during_job: 0,
        unlabelled: 0,
        short_of_copies: short.len(),
        uploads_answered: tally.answered.load(Ordering::Relaxed),
        uploads_refused: tally.refused.load(Ordering::Relaxed),
        refusals,
        problems,
    })
}

/// Starts the Tuner and the PipeStores (the model of `model_dir`, two copies of each photo, on
/// `catalog`) in `dir`; the Tuner first.
fn start_cluster(exe: &Path, dir: &Path, catalog: &str, model_dir: &Path) -> Result<Vec<Proc>> {
    let mut node = vec!["--catalog", catalog];
    node.extend(crate::TWO_COPIES);
    let spec = Spec {
        nodes: NODES,
        prefix: "rs",
        model_dir,
        tuner: &["--catalog", catalog, "--node-lease-ms", "3000"],
        node: &node,
        net: None,
    };
    let mut procs = processes(exe, dir, &spec)?;
    for p in &mut procs {
        p.start()?;
    }
    Ok(procs)
}

/// Waits (a bounded number of looks) until the front door at `url` sees every node live.
pub(crate) fn wait_placeable(agent: &ureq::Agent, url: &str) -> Result<()> {
    let mut last = String::new();
    for _ in 0..SETTLE_POLLS {
        let (status, body) = get(agent, &format!("{url}/v1/cluster"))?;
        let cluster: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let live = cluster["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["live"] == true).count());
        if status == 200 && live == NODES {
            return Ok(());
        }
        last = format!("{status} {}", String::from_utf8_lossy(&body));
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("the front door at {url} never saw {NODES} live nodes; it last answered {last}")
}

fn acked_len(acked: &Mutex<HashMap<u64, String>>) -> usize {
    acked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len()
}

/// Uploads through a random node's front door until `stop`, recording each 201 (id to
/// sha256); a refused upload or a node that is down is simply not acknowledged.
/// Uploads that got an answer, and of those the refused ones.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    refused: AtomicUsize,
    /// Refusals by status and error kind.
    kinds: Mutex<HashMap<String, usize>>,
}

fn upload_until(
    agent: &ureq::Agent,
    urls: &[String],
    (acked, tally): (&Mutex<HashMap<u64, String>>, &Tally),
    stop: &AtomicBool,
    seed: u64,
) {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let url = &urls[rng.random_range(0..urls.len())];
        let bytes = photo(rng.random());
        let sha = hex::encode(Sha256::digest(&bytes));
        let sent = agent
            .post(format!("{url}/v1/photos"))
            .header("content-type", "image/png")
            .send(&bytes[..]);
        if sent.is_ok() {
            tally.answered.fetch_add(1, Ordering::Relaxed);
        }
        let mut resp = match sent {
            Ok(resp) if resp.status().as_u16() == 201 => resp,
            Ok(mut resp) => {
                tally.refused.fetch_add(1, Ordering::Relaxed);
                let status = resp.status().as_u16();
                let body = resp.body_mut().read_to_string().unwrap_or_default();
                let reply: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let message: String = reply["message"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(90)
                    .collect();
                let kind = format!(
                    "{status} {} ({message})",
                    reply["error"].as_str().unwrap_or("?")
                );
                *tally
                    .kinds
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(kind)
                    .or_default() += 1;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        let reply: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if let Some(id) = reply["id"].as_u64() {
            acked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id, sha);
        }
    }
}

/// The acknowledged photos that have fewer than [`REPLICAS`] copies after a bounded wait.
pub(crate) fn short_of_copies(
    agent: &ureq::Agent,
    url: &str,
    acked: &HashMap<u64, String>,
) -> Result<Vec<u64>> {
    let mut short: Vec<u64> = acked.keys().copied().collect();
    for _ in 0..SETTLE_POLLS {
        let mut still = Vec::new();
        for &id in &short {
            let (status, body) = get(agent, &format!("{url}/v1/photos/{id}/meta"))?;
            let meta: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let copies = meta["copies"].as_array().map_or(0, Vec::len);
            if status != 200 || copies < REPLICAS {
                still.push(id);
            }
        }
        short = still;
        if short.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(short)
}

/// Whether photo `id` reads back with sha256 `sha` through the front door at `url`.
pub(crate) fn reads_back(agent: &ureq::Agent, url: &str, id: u64, sha: &str) -> Result<(), String> {
    let (status, bytes) =
        get(agent, &format!("{url}/v1/photos/{id}")).map_err(|e| format!("photo {id}: {e}"))?;
    if status != 200 || hex::encode(Sha256::digest(&bytes)) != sha {
        return Err(format!(
            "photo {id}: acknowledged, but GET through {url} answers {status} with other bytes"
        ));
    }
    Ok(())
}
