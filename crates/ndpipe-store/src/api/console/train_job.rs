//! A Tuner job watched live: its phase and per-node progress (an htmx fragment polled every
//! second until the job ends), a uPlot chart of progress and of validation top-1 per run
//! (`charts.js` fetching [`chart`]'s JSON), and, for a finished fine-tune, the candidate
//! version's gate figures, per-class precision and recall, and its Deploy button.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, iso};
use super::tuner;

/// A job as `GET /v1/tuner/jobs/{id}` shows it (what the console reads of it).
#[derive(Debug, Deserialize)]
pub(crate) struct JobView {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) phase: String,
    #[serde(default)]
    request: serde_json::Value,
    created_ms: i64,
    updated_ms: i64,
    #[serde(default)]
    progress: Vec<NodeProgress>,
    #[serde(default)]
    skipped: Vec<String>,
    result: Option<serde_json::Value>,
    error: Option<Failure>,
    /// A fine-tune's runs trained so far, while it runs.
    #[serde(default)]
    runs: Vec<RunView>,
}

#[derive(Debug, Deserialize)]
struct NodeProgress {
    node: String,
    done: u64,
    total: u64,
}

#[derive(Debug, Deserialize)]
struct Failure {
    kind: String,
    message: String,
}

/// What a fine-tune reports (the figures the console shows).
#[derive(Debug, Deserialize)]
pub(crate) struct FinetuneReport {
    pub(crate) version: String,
    parent: Option<String>,
    train_images: u64,
    val_images: u64,
    runs: Vec<RunView>,
    val_top1_before: f32,
    gate: GateView,
    per_class: Vec<ClassMetrics>,
    deploy: Option<serde_json::Value>,
    pub(crate) cache: Option<CacheView>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct RunView {
    run: usize,
    images: u64,
    train_start: f64,
    train_seconds: f64,
    val_top1: f32,
    #[serde(default)]
    train_loss: f32,
}

#[derive(Debug, Deserialize)]
struct GateView {
    margin: f32,
    parent_val_top1: Option<f32>,
    val_top1: f32,
    passed: bool,
    forced: bool,
}

#[derive(Debug, Deserialize)]
struct ClassMetrics {
    class: String,
    precision: f32,
    recall: f32,
    support: u64,
}

/// The cache's figures of a fine-tune that trained through it.
#[derive(Debug, Deserialize)]
pub(crate) struct CacheView {
    pub(crate) policy: String,
    pub(crate) requests: u64,
    pub(crate) exact_hits: u64,
    pub(crate) substitutes: u64,
    pub(crate) misses: u64,
    pub(crate) hit_ratio: f64,
    pub(crate) fetched_bytes: u64,
}

impl JobView {
    /// The task a fine-tune trains (`default` when its request names none).
    pub(crate) fn task(&self) -> &str {
        self.request["task"].as_str().unwrap_or("default")
    }

    /// Whether it has ended.
    pub(crate) fn ended(&self) -> bool {
        self.phase == "done" || self.phase == "failed"
    }

    /// Photos done and to do, over every node.
    fn done_total(&self) -> (u64, u64) {
        let done = self.progress.iter().map(|p| p.done).sum();
        let total = self.progress.iter().map(|p| p.total).sum();
        (done, total)
    }

    /// Percent done of the current phase (100 once ended).
    pub(crate) fn percent(&self) -> u32 {
        if self.ended() {
            return 100;
        }
        let (done, total) = self.done_total();
        (done * 100).checked_div(total).unwrap_or(0).min(100) as u32
    }

    /// The fine-tune's report, once done.
    pub(crate) fn finetune(&self) -> Option<FinetuneReport> {
        let report = self.result.as_ref()?.get("finetune")?;
        serde_json::from_value(report.clone()).ok()
    }

    /// The version a deploy job deploys.
    fn deployed_version(&self) -> Option<&str> {
        (self.kind == "deploy")
            .then(|| self.request["version"].as_str())
            .flatten()
    }

    pub(crate) fn created(&self) -> String {
        iso(self.created_ms)
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "console/train_job.html")]
pub(crate) struct JobPage {
    chrome: Chrome,
    /// The CSRF token of the Deploy form (the live part's name for it).
    csrf: String,
    job: JobView,
    report: Option<FinetuneReport>,
}

/// The live part of the page.
#[derive(Template, WebTemplate)]
#[template(path = "console/train_job_status.html")]
pub(crate) struct JobStatus {
    csrf: String,
    job: JobView,
    report: Option<FinetuneReport>,
}

/// The job `id`, as the Tuner answers it.
async fn job(console: &Console, viewer: &Viewer, id: &str) -> Result<JobView, ConsoleError> {
    let path = format!("/v1/tuner/jobs/{}", encode(id));
    tuner::call(console, viewer, (Method::GET, &path), None).await
}

/// `id` as one path segment.
fn encode(id: &str) -> String {
    form_urlencoded::byte_serialize(id.as_bytes()).collect()
}

/// `GET /ui/train/jobs/{id}`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Result<JobPage, ConsoleError> {
    let job = job(&console, &viewer, &id).await?;
    Ok(JobPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        csrf: viewer.session.csrf.clone(),
        report: job.finetune(),
        job,
    })
}

/// `GET /ui/train/jobs/{id}/status`: the live part, polled until the job ends.
pub(crate) async fn status(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Result<JobStatus, ConsoleError> {
    let job = job(&console, &viewer, &id).await?;
    Ok(JobStatus {
        csrf: viewer.session.csrf.clone(),
        report: job.finetune(),
        job,
    })
}

/// What the chart draws: the job's phase and progress now, and each run trained so far (its
/// validation top-1 and training loss).
#[derive(Debug, Serialize)]
pub(crate) struct Chart {
    phase: String,
    ended: bool,
    /// Seconds since the job started, by the Tuner's clock.
    elapsed: f64,
    percent: u32,
    runs: Vec<RunView>,
}

/// `GET /ui/train/jobs/{id}/chart`.
pub(crate) async fn chart(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Result<Json<Chart>, ConsoleError> {
    let job = job(&console, &viewer, &id).await?;
    let runs = match job.finetune() {
        Some(report) => report.runs,
        None => job.runs.clone(),
    };
    Ok(Json(Chart {
        phase: job.phase.clone(),
        ended: job.ended(),
        elapsed: (job.updated_ms - job.created_ms).max(0) as f64 / 1000.0,
        percent: job.percent(),
        runs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_running_job_shows_its_share_done_and_a_done_one_its_report() {
        let running: JobView = serde_json::from_value(json!({
            "id": "ft-1", "kind": "finetune", "phase": "extracting",
            "request": {"task": "tops"}, "created_ms": 0, "updated_ms": 1500,
            "progress": [{"node": "a", "done": 30, "total": 100}, {"node": "b", "done": 20, "total": 100}],
            "skipped": [], "result": null, "error": null
        }))
        .unwrap();
        assert_eq!((running.task(), running.percent()), ("tops", 25));
        assert!(running.finetune().is_none() && !running.ended());
        let done: JobView = serde_json::from_value(json!({
            "id": "ft-1", "kind": "finetune", "phase": "done", "request": {},
            "created_ms": 0, "updated_ms": 0, "progress": [], "skipped": [], "error": null,
            "result": {"finetune": {
                "version": "v2", "parent": "v1", "train_images": 90, "val_images": 10,
                "runs": [{"run": 0, "images": 90, "train_start": 1.0, "train_seconds": 2.0, "val_top1": 0.8, "ready_at": 1.0}],
                "val_top1_before": 0.7, "per_class": [], "deploy": null, "cache": null,
                "gate": {"margin": 0.01, "parent_val_top1": 0.7, "val_top1": 0.8, "passed": true, "forced": false}
            }}
        }))
        .unwrap();
        let report = done.finetune().unwrap();
        assert_eq!((done.task(), done.percent()), ("default", 100));
        assert_eq!((report.version.as_str(), report.runs.len()), ("v2", 1));
        assert!(report.gate.passed && report.deploy.is_none());
    }
}
