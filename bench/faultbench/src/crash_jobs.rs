//! The work a crash loop runs beside its uploads, so that the kill lands inside it: compactions,
//! re-labelling jobs, or fine-tunes that deploy (each started again as soon as one ends).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::CrashMode;

/// Pause between two looks at a running job.
const POLL: Duration = Duration::from_millis(100);

/// A thread that starts jobs of one kind one after another until it is stopped.
pub(crate) struct Background {
    running: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Background {
    /// Starts the background work of `mode` against the store at `url` (none for uploads only).
    pub(crate) fn start(
        mode: CrashMode,
        agent: &ureq::Agent,
        url: &str,
        stop: &Arc<AtomicBool>,
    ) -> Option<Self> {
        let job: fn(&ureq::Agent, &str, &AtomicBool, &AtomicBool) = match mode {
            CrashMode::Uploads | CrashMode::Replicated => return None,
            CrashMode::Compaction => compact_until,
            CrashMode::Relabel => relabel_until,
            CrashMode::Finetune => finetune_until,
        };
        let running = Arc::new(AtomicBool::new(false));
        let (agent, url, stop, flag) = (
            agent.clone(),
            url.to_string(),
            stop.clone(),
            running.clone(),
        );
        let handle = std::thread::spawn(move || job(&agent, &url, &stop, &flag));
        Some(Background { running, handle })
    }

    /// Whether a job (a compaction, re-labelling or fine-tune) is running now.
    pub(crate) fn in_job(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Waits for the thread, which ends once the store is gone or `stop` is set.
    pub(crate) fn join(self) {
        let _ = self.handle.join();
    }
}

/// Compacts the store again and again until `stop`.
fn compact_until(agent: &ureq::Agent, url: &str, stop: &AtomicBool, running: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        running.store(true, Ordering::Relaxed);
        let answered = agent
            .post(format!("{url}/v1/admin/compact"))
            .send_empty()
            .is_ok();
        running.store(false, Ordering::Relaxed);
        if !answered {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Re-labels every photo with the active model, job after job, until `stop`.
fn relabel_until(agent: &ureq::Agent, url: &str, stop: &AtomicBool, running: &AtomicBool) {
    let start = format!("{url}/v1/jobs/relabel");
    jobs_until(
        agent,
        stop,
        running,
        || agent.post(&start).send_empty(),
        |id| format!("{url}/v1/jobs/{id}"),
    );
}

/// Fine-tunes the head on the imported photos and deploys it, job after job, until `stop`.
fn finetune_until(agent: &ureq::Agent, url: &str, stop: &AtomicBool, running: &AtomicBool) {
    let start = format!("{url}/v1/tuner/finetune");
    let request = serde_json::json!({
        "runs": 1, "epochs": 2, "load_balance": false, "deploy": true
    });
    jobs_until(
        agent,
        stop,
        running,
        || {
            agent
                .post(&start)
                .header("content-type", "application/json")
                .send(request.to_string().as_bytes())
        },
        |id| format!("{url}/v1/tuner/jobs/{id}"),
    );
}

/// Starts a job with `start` and follows it at `job_url(id)` until it ends, again and again
/// until `stop` or until the store stops answering. `running` is set while a job runs.
fn jobs_until(
    agent: &ureq::Agent,
    stop: &AtomicBool,
    running: &AtomicBool,
    start: impl Fn() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    job_url: impl Fn(&str) -> String,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut started) = start() else { return };
        match started.status().as_u16() {
            202 => {}
            // Another job runs: one that resumed after a restart, or one started elsewhere.
            409 => {
                running.store(true, Ordering::Relaxed);
                std::thread::sleep(POLL);
                continue;
            }
            _ => {
                running.store(false, Ordering::Relaxed);
                std::thread::sleep(POLL);
                continue;
            }
        }
        let job: serde_json::Value = json(started.body_mut());
        let Some(id) = job["id"].as_str().map(str::to_string) else {
            return;
        };
        running.store(true, Ordering::Relaxed);
        let ended = follow(agent, &job_url(&id), stop);
        running.store(false, Ordering::Relaxed);
        if !ended {
            return;
        }
    }
}

/// Polls a job until it is done or failed (true) or the store stops answering (false).
fn follow(agent: &ureq::Agent, url: &str, stop: &AtomicBool) -> bool {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut resp) = agent.get(url).call() else {
            return false;
        };
        let job: serde_json::Value = json(resp.body_mut());
        if ended(&job) {
            return true;
        }
        std::thread::sleep(POLL);
    }
    false
}

/// Whether a job has ended: a Tuner job's `phase` is done or failed; a store job's `status` is
/// no longer "running".
fn ended(job: &serde_json::Value) -> bool {
    match (job["phase"].as_str(), job["status"].as_str()) {
        (Some(phase), _) => matches!(phase, "done" | "failed"),
        (None, Some(status)) => status != "running",
        (None, None) => false,
    }
}

/// A JSON body, or `null` when it is not JSON.
fn json(body: &mut ureq::Body) -> serde_json::Value {
    let text = body.read_to_string().unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_default()
}
