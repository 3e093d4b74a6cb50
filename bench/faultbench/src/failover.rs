//! A fine-tune that loses a node vs one that does not: a Tuner and three PipeStores keeping two
//! copies of each photo on one PostgreSQL catalog, Fashion-MNIST photos imported through a
//! front door, then two fine-tunes of the same request from stored features (which every copy
//! carries), timed from the request to the job's end. In the second, one PipeStore is killed
//! with SIGKILL while it extracts; the Tuner keeps the features it received, passes the lost
//! node's photos to their copies, and the holders take over those not yet received
//! (`ndpipe-tuner`'s `failover.rs` and `finetune/lost.rs`), so the time includes the wait until
//! the node counts as lost and the survivors' extra share, not a run again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;

use crate::api::TunerApi;
use crate::cluster::{Spec, processes};
use crate::procs::{Proc, import_fashion_mnist, retrying_taken_ports};

/// Looks at a job, a tenth of a second apart, before it counts as a hang (10 minutes).
const JOB_POLLS: usize = 6000;

/// How one comparison is set up.
#[derive(Debug, Clone)]
pub struct FailoverConfig {
    /// The `postgres://` catalog of the cluster (a fresh database).
    pub catalog: String,
    /// The model folder.
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder (Debian's `dataset-fashion-mnist`).
    pub fashion_mnist_dir: PathBuf,
    /// Photos imported (each stored on two of the three nodes).
    pub photos: usize,
    /// Each node's extraction rate (photos/s), so that the kill lands inside the extraction.
    pub throttle_images_per_second: f64,
    /// Milliseconds after the job starts extracting that the node is killed.
    pub kill_after_ms: u64,
}

/// The two fine-tunes of one comparison.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRound {
    /// Seconds from the request to the end of the fine-tune that keeps every node.
    pub intact_s: f64,
    /// The same for the fine-tune that loses a node.
    pub losing_s: f64,
    /// Photos the lost node's share passed to their copies.
    pub failed_over_photos: u64,
    /// The lost node's photos whose features the job had received and kept.
    pub kept: u64,
    /// Its photos the survivors took over in the job.
    pub taken_over: u64,
    /// Whether the job ran again instead (the take-over could not apply).
    pub rerun: bool,
    /// Training photos of each fine-tune (train, validation and left out), which must agree.
    pub used: (u64, u64),
}

/// Runs one comparison with `exe` in `dir`.
pub fn compare(config: &FailoverConfig, exe: &Path, dir: &Path) -> Result<FailoverRound> {
    let model_dir = config.model_dir.clone();
    let mut procs = retrying_taken_ports(|| {
        let node = ["--catalog", &config.catalog];
        let mut node = node.to_vec();
        node.extend(crate::TWO_COPIES);
        let tuner = [
            "--catalog",
            &config.catalog,
            "--node-lease-ms",
            "3000",
            "--node-timeout-ms",
            "10000",
        ];
        let spec = Spec {
            nodes: 3,
            prefix: "fo",
            model_dir: &model_dir,
            tuner: &tuner,
            node: &node,
            net: None,
        };
        let mut procs = processes(exe, dir, &spec)?;
        for p in &mut procs {
            p.start()?;
        }
        Ok(procs)
    })?;
    let tuner = TunerApi::new(&procs[0].url);
    wait_live(&tuner, 3)?;
    import_fashion_mnist(
        exe,
        &procs[1].url,
        &config.fashion_mnist_dir,
        0,
        config.photos,
    )?;
    let rate = config.throttle_images_per_second;
    let request = serde_json::json!({
        "runs": 1, "epochs": 1, "load_balance": false, "deploy": false,
        "use_stored_features": true,
        "throttle": {"fo-0": rate, "fo-1": rate, "fo-2": rate}
    });
    let (intact_s, intact) = finetune(&tuner, &request, None)?;
    let (losing_s, losing) = finetune(
        &tuner,
        &request,
        Some((&mut procs[3], config.kill_after_ms)),
    )?;
    let failed_over = &losing["failed_over"];
    ensure!(
        failed_over[0]["node"] == "fo-2",
        "the fine-tune did not fail over from fo-2: {losing}"
    );
    ensure!(
        used(&intact) == used(&losing),
        "the fine-tunes trained on different photos: {intact} vs {losing}"
    );
    Ok(FailoverRound {
        intact_s,
        losing_s,
        failed_over_photos: failed_over[0]["photos_moved"].as_u64().unwrap_or(0),
        kept: failed_over[0]["kept"].as_u64().unwrap_or(0),
        taken_over: (failed_over[0]["taken_over"].as_object())
            .map_or(0, |t| t.values().filter_map(|v| v.as_u64()).sum()),
        rerun: failed_over[0]["rerun"].as_bool().unwrap_or(true),
        used: (used(&intact), used(&losing)),
    })
}

/// Training photos a fine-tune's report counts.
fn used(report: &serde_json::Value) -> u64 {
    ["train_images", "val_images", "val_left_out"]
        .iter()
        .filter_map(|k| report[k].as_u64())
        .sum()
}

/// Runs a fine-tune of `request` (killing `kill`'s process that many ms into the extraction)
/// and waits for it: seconds from the request to its end, and its report.
fn finetune(
    tuner: &TunerApi,
    request: &serde_json::Value,
    mut kill: Option<(&mut Proc, u64)>,
) -> Result<(f64, serde_json::Value)> {
    let started = Instant::now();
    let (status, job) = tuner.post("/v1/tuner/finetune", request)?;
    ensure!(status == 202, "the fine-tune was refused: {status} {job}");
    let id = job["id"].as_str().context("a job id")?.to_string();
    let path = format!("/v1/tuner/jobs/{id}");
    for _ in 0..JOB_POLLS {
        let job = tuner.get(&path)?;
        if let Some((proc, after_ms)) = kill.as_mut()
            && job["phase"] == "extracting"
        {
            std::thread::sleep(Duration::from_millis(*after_ms));
            proc.kill9();
            kill = None;
        }
        match job["phase"].as_str() {
            Some("done") => {
                return Ok((
                    started.elapsed().as_secs_f64(),
                    job["result"]["finetune"].clone(),
                ));
            }
            Some("failed") => bail!("the fine-tune failed: {job}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    bail!("the fine-tune {id} did not end within {JOB_POLLS} looks")
}

/// Waits (a bounded number of looks) until `n` nodes are registered with a live lease.
fn wait_live(tuner: &TunerApi, n: usize) -> Result<()> {
    for _ in 0..450 {
        let live = tuner
            .nodes()
            .map(|nodes| nodes.iter().filter(|n| n["live"] == true).count())
            .unwrap_or(0);
        if live >= n {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("fewer than {n} nodes became live")
}
