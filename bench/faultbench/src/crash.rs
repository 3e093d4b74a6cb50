//! Crash loops: one `ndpipe serve` under concurrent uploads (and, by mode, deletes and
//! compactions, re-labelling jobs, or fine-tunes that deploy) is killed with SIGKILL at a random
//! moment, started again, and every acknowledged write is checked: each photo that got a 201
//! reads back byte for byte with its catalog row (and, with a model, its labels), and each photo
//! whose delete got a 204 stays gone.

use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::crash_jobs::Background;
use crate::procs::Proc;

/// Looks at the labels of the acknowledged photos after the last restart, this many times at
/// most (half a second apart), until every one has them: labelling at ingest may be queued.
const LABEL_POLLS: usize = 240;

/// What runs while the process is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CrashMode {
    /// Concurrent uploads only.
    Uploads,
    /// Uploads, deletes of acknowledged photos, and compactions.
    Compaction,
    /// Uploads labelled by the model while re-labelling jobs run one after another.
    Relabel,
    /// Uploads labelled by the model while fine-tunes run one after another, each deploying
    /// its head (a re-labelling of every photo).
    Finetune,
    /// Uploads through the front doors of three PipeStores that keep two copies of each photo
    /// on a PostgreSQL catalog, one of them killed per cycle (`crash_replicated.rs`).
    Replicated,
}

impl CrashMode {
    /// Whether the store runs with a model (and the photos get labels).
    fn with_model(self) -> bool {
        matches!(
            self,
            CrashMode::Relabel | CrashMode::Finetune | CrashMode::Replicated
        )
    }
}

/// What a store with a model needs: the model and photos with ground truth to fine-tune on.
#[derive(Debug, Clone)]
pub struct CrashModel {
    /// The model folder.
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder (Debian's `dataset-fashion-mnist`).
    pub fashion_mnist_dir: PathBuf,
    /// Fashion-MNIST photos imported before the first cycle (the fine-tune's training set).
    pub photos: usize,
}

/// How a crash loop is set up.
#[derive(Debug, Clone)]
pub struct CrashConfig {
    /// Kill-and-restart cycles.
    pub cycles: usize,
    /// Seed of the photos and the moments.
    pub seed: u64,
    /// Concurrent uploaders.
    pub uploaders: usize,
    /// The latest moment of the kill after a cycle's writes start, in ms.
    pub max_kill_ms: u64,
    /// What runs during the kill.
    pub mode: CrashMode,
    /// The model, for the modes that need one.
    pub model: Option<CrashModel>,
    /// The `postgres://` catalog of mode `replicated`.
    pub catalog: Option<String>,
}

/// One cycle's record.
#[derive(Debug, Clone, Serialize)]
pub struct Cycle {
    /// Its number, from 0.
    pub cycle: usize,
    /// Milliseconds after the writes started that the process was killed.
    pub killed_at_ms: u64,
    /// Uploads acknowledged in this cycle.
    pub acknowledged: usize,
    /// Deletes acknowledged in this cycle.
    pub deleted: usize,
    /// Milliseconds from the restart to the first `/healthz` answer.
    pub restart_ms: u64,
    /// Whether a compaction, re-labelling or fine-tune was running when the kill came.
    pub during_job: bool,
    /// The process killed.
    pub node: String,
}

/// What a crash loop found.
#[derive(Debug, Clone, Serialize)]
pub struct CrashReport {
    /// Every cycle.
    pub cycles: Vec<Cycle>,
    /// Uploads acknowledged over all cycles.
    pub acknowledged: usize,
    /// Of those, photos that did not read back byte for byte with their row (target 0).
    pub lost: usize,
    /// Deletes acknowledged over all cycles.
    pub deleted: usize,
    /// Of those, photos that came back (target 0).
    pub resurrected: usize,
    /// Cycles whose kill came while a background job ran.
    pub kills_during_job: usize,
    /// With a model: acknowledged photos still without labels after the last restart and a
    /// bounded wait (target 0).
    pub unlabelled: usize,
    /// Mode `replicated`: acknowledged photos with fewer than two copies after the last
    /// restart and a bounded wait (target 0).
    pub short_of_copies: usize,
    /// Mode `replicated`: uploads that got an HTTP answer (a front door that is down at the
    /// moment gives none).
    pub uploads_answered: usize,
    /// Of those, uploads refused (any answer but 201; target under 1% while two nodes live).
    pub uploads_refused: usize,
    /// Mode `replicated`: the refusals by status, error kind and message, with their counts.
    pub refusals: Vec<String>,
    /// What went wrong, per lost or resurrected photo (the first few).
    pub problems: Vec<String>,
}

/// The acknowledged state: photos that must be there (id to sha256), photos that must not, and
/// photos whose delete got no clear answer (either way is right for them).
#[derive(Default)]
struct Acked {
    present: HashMap<u64, String>,
    deleted: Vec<u64>,
    uncertain: Vec<u64>,
}

/// Runs `config.cycles` crash cycles on an `ndpipe serve` of `exe` in `dir`, calling
/// `progress` after each.
pub(crate) fn run(
    config: &CrashConfig,
    exe: &Path,
    dir: &Path,
    mut progress: impl FnMut(&Cycle),
) -> Result<CrashReport> {
    if config.mode == CrashMode::Replicated {
        let Some(catalog) = &config.catalog else {
            bail!("crash mode replicated needs a postgres:// catalog");
        };
        return crate::crash_replicated::run(config, catalog, exe, dir, progress);
    }
    let model = match (&config.model, config.mode.with_model()) {
        (Some(model), true) => Some(model),
        (None, true) => bail!("crash mode {:?} needs a model", config.mode),
        (_, false) => None,
    };
    let (mut proc, url) = crate::procs::retrying_taken_ports(|| serve(exe, dir, model))?;
    if let Some(model) = model {
        // The fine-tune's training set, with ground truth.
        crate::procs::import_fashion_mnist(exe, &url, &model.fashion_mnist_dir, 0, model.photos)?;
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(config.seed);
    let mut cycles = Vec::new();
    for cycle in 0..config.cycles {
        let before = counts(&acked);
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..config.uploaders)
            .map(|w| {
                let (agent, url, acked, stop) =
                    (agent.clone(), url.clone(), acked.clone(), stop.clone());
                let seed = rng.random::<u64>() ^ w as u64;
                let mode = config.mode;
                std::thread::spawn(move || write_until(&agent, &url, &acked, &stop, seed, mode))
            })
            .collect();
        let background = Background::start(config.mode, &agent, &url, &stop);
        let killed_at_ms = rng.random_range(100..=config.max_kill_ms.max(100));
        std::thread::sleep(Duration::from_millis(killed_at_ms));
        let during_job = background.as_ref().is_some_and(Background::in_job);
        proc.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = w.join();
        }
        if let Some(b) = background {
            b.join();
        }
        let restarted = Instant::now();
        proc.start()
            .with_context(|| format!("restarting after cycle {cycle}"))?;
        let after = counts(&acked);
        let record = Cycle {
            cycle,
            killed_at_ms,
            acknowledged: after.0 - before.0,
            deleted: after.1 - before.1,
            restart_ms: restarted.elapsed().as_millis() as u64,
            during_job,
            node: "serve".into(),
        };
        progress(&record);
        cycles.push(record);
    }
    let acked = acked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut problems = Vec::new();
    let mut lost = 0;
    for (id, sha) in &acked.present {
        if let Err(why) = check_present(&agent, &url, *id, sha) {
            lost += 1;
            problems.push(why);
        }
    }
    let mut resurrected = 0;
    for id in &acked.deleted {
        let (status, _) = get(&agent, &format!("{url}/v1/photos/{id}"))?;
        if status != 404 {
            resurrected += 1;
            problems.push(format!(
                "photo {id}: deleted (204) but GET answers {status}"
            ));
        }
    }
    let unlabelled = match model {
        Some(_) => {
            let ids: Vec<u64> = acked.present.keys().copied().collect();
            let missing = unlabelled(&agent, &url, &ids)?;
            for id in missing.iter().take(5) {
                problems.push(format!("photo {id}: acknowledged, but it has no labels"));
            }
            missing.len()
        }
        None => 0,
    };
    problems.truncate(20);
    Ok(CrashReport {
        kills_during_job: cycles.iter().filter(|c| c.during_job).count(),
        unlabelled,
        acknowledged: acked.present.len() + acked.deleted.len() + acked.uncertain.len(),
        deleted: acked.deleted.len(),
        cycles,
        lost,
        resurrected,
        short_of_copies: 0,
        uploads_answered: 0,
        uploads_refused: 0,
        refusals: Vec::new(),
        problems,
    })
}

/// Starts `ndpipe serve` (with `model`'s model, or none; S3 on a free port) on `dir/data` at a
/// free port.
fn serve(exe: &Path, dir: &Path, model: Option<&CrashModel>) -> Result<(Proc, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let data = dir.join("data").to_string_lossy().to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut args: Vec<std::ffi::OsString> = [
        "serve",
        "--data",
        &data,
        "--listen",
        &listen,
        "--s3-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(std::ffi::OsString::from)
    .collect();
    match model {
        Some(m) => args.extend(["--model-dir".into(), m.model_dir.clone().into_os_string()]),
        None => args.push("--no-model".into()),
    }
    let mut proc = Proc::new(
        "serve",
        url.clone(),
        "/healthz",
        exe,
        args,
        dir.join("serve.log"),
    );
    proc.start()?;
    Ok((proc, url))
}

/// (acknowledged uploads, acknowledged deletes) so far.
fn counts(acked: &Mutex<Acked>) -> (usize, usize) {
    let a = acked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (
        a.present.len() + a.deleted.len() + a.uncertain.len(),
        a.deleted.len(),
    )
}

/// A PNG of 64x48 whose pixels depend on `seed`.
pub(crate) fn photo(seed: u64) -> Vec<u8> {
    let img = image::RgbImage::from_fn(64, 48, |x, y| {
        let s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(x + y);
        image::Rgb([s as u8, (s >> 8) as u8 ^ x as u8, (s >> 16) as u8 ^ y as u8])
    });
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .expect("encoding a PNG in memory");
    out
}

/// Uploads (and in compaction mode deletes) until `stop`, recording what was acknowledged.
fn write_until(
    agent: &ureq::Agent,
    url: &str,
    acked: &Mutex<Acked>,
    stop: &AtomicBool,
    seed: u64,
    mode: CrashMode,
) {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        if mode == CrashMode::Compaction && rng.random_range(0..4) == 0 {
            let victim = {
                let a = acked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                a.present.keys().next().copied()
            };
            if let Some(id) = victim {
                let status = agent
                    .delete(format!("{url}/v1/photos/{id}"))
                    .call()
                    .map(|r| r.status().as_u16());
                let mut a = acked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match status {
                    Ok(204) => {
                        a.present.remove(&id);
                        a.deleted.push(id);
                    }
                    // Another writer deleted it first, or the store refused: nothing changed.
                    Ok(400..=499) => {}
                    _ => {
                        a.present.remove(&id);
                        a.uncertain.push(id);
                    }
                }
                continue;
            }
        }
        let bytes = photo(rng.random());
        let sha = hex::encode(Sha256::digest(&bytes));
        let Ok(mut resp) = agent
            .post(format!("{url}/v1/photos"))
            .header("content-type", "image/png")
            .send(&bytes[..])
        else {
            return;
        };
        if resp.status().as_u16() != 201 {
            continue;
        }
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        let reply: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if let Some(id) = reply["id"].as_u64() {
            let mut a = acked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            a.present.insert(id, sha);
        }
    }
}

pub(crate) fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, Vec<u8>)> {
    let mut resp = agent
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_vec().unwrap_or_default();
    Ok((status, body))
}

/// Whether photo `id` reads back with sha256 `sha`, and its catalog row says so too.
fn check_present(agent: &ureq::Agent, url: &str, id: u64, sha: &str) -> Result<(), String> {
    let (status, bytes) =
        get(agent, &format!("{url}/v1/photos/{id}")).map_err(|e| format!("photo {id}: {e}"))?;
    if status != 200 || hex::encode(Sha256::digest(&bytes)) != sha {
        return Err(format!(
            "photo {id}: acknowledged, but GET answers {status} with other bytes"
        ));
    }
    let (status, meta) = get(agent, &format!("{url}/v1/photos/{id}/meta"))
        .map_err(|e| format!("photo {id} meta: {e}"))?;
    let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap_or_default();
    if status != 200 || meta["sha256"] != sha {
        return Err(format!(
            "photo {id}: its catalog row is missing or wrong ({status}: {meta})"
        ));
    }
    Ok(())
}

/// Of `ids`, those with no labels after at most [`LABEL_POLLS`] looks.
fn unlabelled(agent: &ureq::Agent, url: &str, ids: &[u64]) -> Result<Vec<u64>> {
    let mut missing = ids.to_vec();
    for _ in 0..LABEL_POLLS {
        let mut still = Vec::new();
        for &id in &missing {
            let (status, body) = get(agent, &format!("{url}/v1/photos/{id}/labels"))?;
            let labels: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let labelled = labels.as_array().is_some_and(|versions| {
                versions
                    .iter()
                    .any(|v| v["labels"].as_array().is_some_and(|l| !l.is_empty()))
            });
            if status != 200 || !labelled {
                still.push(id);
            }
        }
        missing = still;
        if missing.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(missing)
}
