//! Background jobs: a fine-tuning job, a deploy, a rollout or the following of a repair runs in a task of its own, so a client going
//! away never cancels it. Its phase, per-node progress and outcome are kept here and in the
//! Tuner's job log (a catalog [`JobLog`] in `registry.sqlite`), so `GET /v1/tuner/jobs/{id}`
//! answers while it runs and after it ended, across restarts too: the jobs that were running
//! when the Tuner stopped are handed to [`crate::resume`] when it opens again, which resumes each
//! from its checkpoints or fails it with the reason (the job's `resumed` counts the restarts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ndpipe_catalog::{JobLog, JobRecord};
use ndpipe_util::sync::lock;
use ndpipe_util::time::now_ms;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{DeployReport, FinetuneReport, RepairReport, RolloutReport, RunTimeline, TunerError};

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// A fine-tuning job (and the deploy after it, when asked).
    Finetune,
    /// A deploy of a registered version (also a rollback).
    Deploy,
    /// A rollout of a kept backbone to every node.
    Rollout,
    /// Repair after a node's removal, followed until every photo and plain object is back at
    /// its copies.
    Repair,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Asking the nodes what they hold.
    Surveying,
    /// Sending a backbone to the nodes, which keep it staged.
    Staging,
    /// The nodes stream features (the Tuner trains the runs that are complete).
    Extracting,
    /// Every node has sent its features; training finishes.
    Training,
    /// Staging and committing the head on the nodes.
    Deploying,
    /// The nodes re-label their photos.
    Relabelling,
    /// The nodes switch to the rolled-out backbone.
    Committing,
    /// The PipeStores copy a removed node's photos and plain objects again.
    Repairing,
    /// Finished; the result is there.
    Done,
    /// Failed; the error is there.
    Failed,
}

/// A node's progress in the current phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeProgress {
    /// "name (node N)".
    pub node: String,
    /// Photos done.
    pub done: u64,
    /// Photos to do (0 until the node says).
    pub total: u64,
    /// Photos per second, where the node reports it (a rollout's extraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_per_second: Option<f64>,
    /// Seconds left at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
}

/// What a finished job produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobResult {
    /// A fine-tuning job's report.
    Finetune(Box<FinetuneReport>),
    /// A deploy's report.
    Deploy(DeployReport),
    /// A rollout's report.
    Rollout(RolloutReport),
    /// A repair's report.
    Repair(RepairReport),
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFailure {
    /// The error's kind, as the HTTP API names it (`node_failed`, `deploy_aborted`, ...;
    /// `interrupted` when the Tuner restarted during the job).
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

/// A job as `GET /v1/tuner/jobs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// Unique id (`ft-<ms>` for fine-tuning, `deploy-<ms>` for deploys).
    pub id: String,
    /// What it does.
    pub kind: JobKind,
    /// Where it stands.
    pub phase: Phase,
    /// What it was asked: the fine-tuning request, or `{"version": ...}`.
    pub request: serde_json::Value,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
    /// Last change, ms since the Unix epoch.
    pub updated_ms: i64,
    /// Per node, in the current phase (extracting or re-labelling).
    pub progress: Vec<NodeProgress>,
    /// Registered nodes the job left out, with the reason (draining, lease ran out, ...).
    pub skipped: Vec<String>,
    /// When done: the report.
    pub result: Option<JobResult>,
    /// When failed: why.
    pub error: Option<JobFailure>,
    /// Times the job was taken up again after a Tuner restart (resumed from its checkpoints,
    /// or failed with the reason it could not be).
    #[serde(default)]
    pub resumed: u32,
    /// A fine-tune's runs trained so far, each as it is trained (the report, at the end, has
    /// them all): what a live chart of accuracy and loss draws.
    #[serde(default)]
    pub runs: Vec<RunTimeline>,
}

impl JobView {
    fn status(&self) -> &'static str {
        match self.phase {
            Phase::Done => "done",
            Phase::Failed => "failed",
            _ => "running",
        }
    }

    fn record(&self) -> JobRecord {
        JobRecord {
            id: self.id.clone(),
            kind: serde_json::to_value(self.kind)
                .ok()
                .and_then(|k| k.as_str().map(str::to_string))
                .unwrap_or_default(),
            status: self.status().to_string(),
            state: serde_json::to_value(self).unwrap_or_default(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
        }
    }
}

/// The jobs: those running, in memory, and all of them in the log.
pub(crate) struct Jobs {
    log: Arc<dyn JobLog>,
    running: Mutex<HashMap<String, JobView>>,
    last_ms: Mutex<i64>,
}

impl Jobs {
    /// The jobs of `log`, and those that were running when the Tuner stopped (to resume or
    /// fail: [`Jobs::adopt`]). A job whose state does not parse is left as it is.
    pub(crate) fn open(log: Arc<dyn JobLog>) -> Result<(Self, Vec<JobView>), TunerError> {
        let mut unfinished = Vec::new();
        for record in log.jobs()? {
            if record.status != "running" {
                continue;
            }
            match serde_json::from_value::<JobView>(record.state) {
                Ok(view) => unfinished.push(view),
                Err(e) => {
                    warn!(job = %record.id, error = %e, "a job in the log does not parse; left as it is")
                }
            }
        }
        let jobs = Jobs {
            log,
            running: Mutex::new(HashMap::new()),
            last_ms: Mutex::new(0),
        };
        Ok((jobs, unfinished))
    }

    /// Takes up `view`, a job that was running when the Tuner stopped, counting the restart
    /// (recorded in the log); returns the handle through which it reports again, and ends.
    pub(crate) fn adopt(self: &Arc<Self>, mut view: JobView) -> Result<Progress, TunerError> {
        view.resumed += 1;
        view.updated_ms = now_ms();
        self.log.put_job(&view.record())?;
        warn!(job = %view.id, kind = ?view.kind, phase = ?view.phase, resumed = view.resumed,
            "a job was running when the Tuner stopped: taken up again");
        let id = view.id.clone();
        lock(&self.running).insert(id.clone(), view);
        Ok(Progress {
            jobs: self.clone(),
            id,
        })
    }

    /// Records a new job of `kind`, asked `request`, leaving out the `skipped` nodes; returns
    /// the handle through which it reports.
    pub(crate) fn start(
        self: &Arc<Self>,
        kind: JobKind,
        request: serde_json::Value,
        skipped: Vec<String>,
    ) -> Result<Progress, TunerError> {
        let now = {
            let mut last = lock(&self.last_ms);
            *last = now_ms().max(*last + 1);
            *last
        };
        let prefix = match kind {
            JobKind::Finetune => "ft",
            JobKind::Deploy => "deploy",
            JobKind::Rollout => "rollout",
            JobKind::Repair => "repair",
        };
        let view = JobView {
            id: format!("{prefix}-{now}"),
            kind,
            phase: match kind {
                JobKind::Finetune => Phase::Surveying,
                JobKind::Deploy => Phase::Deploying,
                JobKind::Rollout => Phase::Staging,
                JobKind::Repair => Phase::Repairing,
            },
            request,
            created_ms: now,
            updated_ms: now,
            progress: Vec::new(),
            skipped,
            result: None,
            error: None,
            resumed: 0,
            runs: Vec::new(),
        };
        self.log.put_job(&view.record())?;
        info!(job = %view.id, ?kind, "job started");
        let id = view.id.clone();
        lock(&self.running).insert(id.clone(), view);
        Ok(Progress {
            jobs: self.clone(),
            id,
        })
    }

    /// Every job, oldest first.
    pub(crate) fn list(&self) -> Result<Vec<JobView>, TunerError> {
        let running = lock(&self.running).clone();
        let mut out = Vec::new();
        for record in self.log.jobs()? {
            if let Some(view) = running.get(&record.id) {
                out.push(view.clone());
            } else if let Ok(view) = serde_json::from_value(record.state) {
                out.push(view);
            }
        }
        Ok(out)
    }

    /// One job.
    pub(crate) fn get(&self, id: &str) -> Result<JobView, TunerError> {
        if let Some(view) = lock(&self.running).get(id) {
            return Ok(view.clone());
        }
        self.list()?
            .into_iter()
            .find(|j| j.id == id)
            .ok_or_else(|| TunerError::UnknownJob(id.to_string()))
    }

    /// Changes a running job with `f`; writes it to the log when `persist`.
    fn update(&self, id: &str, persist: bool, f: impl FnOnce(&mut JobView)) {
        let record = {
            let mut running = lock(&self.running);
            let Some(view) = running.get_mut(id) else {
                return;
            };
            f(view);
            view.updated_ms = now_ms();
            persist.then(|| view.record())
        };
        if let Some(record) = record
            && let Err(e) = self.log.put_job(&record)
        {
            warn!(job = id, error = %e, "cannot record the job's state");
        }
    }
}

/// How a running job reports its phase, progress and outcome (clones report on the same job).
#[derive(Clone)]
pub(crate) struct Progress {
    jobs: Arc<Jobs>,
    id: String,
}

impl Progress {
    /// The job's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The job as it stands.
    pub(crate) fn view(&self) -> Result<JobView, TunerError> {
        self.jobs.get(&self.id)
    }

    /// Enters `phase` with a progress row per node of `nodes` (recorded in the log).
    pub(crate) fn phase(&self, phase: Phase, nodes: &[String]) {
        self.jobs.update(&self.id, true, |v| {
            v.phase = phase;
            v.progress = nodes
                .iter()
                .map(|node| NodeProgress {
                    node: node.clone(),
                    done: 0,
                    total: 0,
                    images_per_second: None,
                    eta_seconds: None,
                })
                .collect();
        });
    }

    /// Node `i` (of the phase's list) has done `done` of `total` photos.
    pub(crate) fn node(&self, i: usize, done: u64, total: u64) {
        self.jobs.update(&self.id, false, |v| {
            if let Some(p) = v.progress.get_mut(i) {
                (p.done, p.total) = (done, total);
            }
        });
    }

    /// Node `i` has done `done` of `total` photos at `images_per_second`: also shows the time
    /// left at that rate.
    pub(crate) fn node_rate(&self, i: usize, done: u64, total: u64, images_per_second: f64) {
        self.jobs.update(&self.id, false, |v| {
            if let Some(p) = v.progress.get_mut(i) {
                (p.done, p.total) = (done, total);
                p.images_per_second = Some(images_per_second);
                p.eta_seconds = (images_per_second > 0.0)
                    .then(|| total.saturating_sub(done) as f64 / images_per_second);
            }
        });
    }

    /// A fine-tune has trained `run` (kept in memory only: the report records every run).
    pub(crate) fn trained(&self, run: RunTimeline) {
        self.jobs.update(&self.id, false, |v| v.runs.push(run));
    }

    /// Ends the job with its outcome (recorded in the log).
    pub(crate) fn finish(self, outcome: Result<JobResult, &TunerError>) {
        self.jobs.update(&self.id, true, |v| match outcome {
            Ok(result) => {
                v.phase = Phase::Done;
                v.result = Some(result);
            }
            Err(e) => {
                v.phase = Phase::Failed;
                v.error = Some(JobFailure {
                    kind: e.kind().to_string(),
                    message: e.to_string(),
                });
            }
        });
        let ended = lock(&self.jobs.running).remove(&self.id);
        if let Some(view) = ended {
            info!(job = %view.id, phase = ?view.phase, "job ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::SqliteCatalog;

    use super::*;

    #[test]
    fn jobs_report_progress_and_a_restart_hands_over_the_running_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.sqlite");
        let open = || {
            let log: Arc<dyn JobLog> = Arc::new(SqliteCatalog::open(&path).unwrap());
            let (jobs, unfinished) = Jobs::open(log).unwrap();
            (Arc::new(jobs), unfinished)
        };
        let (jobs, unfinished) = open();
        assert!(unfinished.is_empty());
        let done = jobs
            .start(
                JobKind::Deploy,
                serde_json::json!({"version": "v1"}),
                vec![],
            )
            .unwrap();
        done.phase(Phase::Relabelling, &["a (node 1)".into()]);
        done.node(0, 5, 10);
        let view = done.view().unwrap();
        assert_eq!(view.phase, Phase::Relabelling);
        assert_eq!((view.progress[0].done, view.progress[0].total), (5, 10));
        let id = done.id().to_string();
        done.finish(Ok(JobResult::Deploy(DeployReport::default())));
        let view = jobs.get(&id).unwrap();
        assert_eq!(view.phase, Phase::Done);
        assert!(matches!(view.result, Some(JobResult::Deploy(_))));

        let failed = jobs
            .start(
                JobKind::Finetune,
                serde_json::json!({}),
                vec!["b: draining".into()],
            )
            .unwrap();
        assert_ne!(failed.id(), id, "ids are unique");
        let failed_id = failed.id().to_string();
        failed.finish(Err(&TunerError::NoNodes));
        let error = jobs.get(&failed_id).unwrap().error.unwrap();
        assert_eq!(error.kind, "no_nodes");

        let running = jobs
            .start(JobKind::Finetune, serde_json::json!({}), vec![])
            .unwrap();
        running.phase(Phase::Extracting, &[]);
        let running_id = running.id().to_string();
        drop(jobs);
        // The restart hands over the running job, as it was, to be taken up again.
        let (reopened, unfinished) = open();
        assert_eq!(reopened.list().unwrap().len(), 3);
        assert_eq!(unfinished.len(), 1);
        assert_eq!(
            (unfinished[0].id.as_str(), unfinished[0].phase),
            (running_id.as_str(), Phase::Extracting)
        );
        let again = reopened.adopt(unfinished[0].clone()).unwrap();
        assert_eq!(reopened.get(&running_id).unwrap().resumed, 1);
        again.finish(Err(&TunerError::Interrupted("start it again".into())));
        // Ended, it is not handed over again; the log keeps the count and the reason.
        drop(reopened);
        let (reopened, unfinished) = open();
        assert!(unfinished.is_empty());
        let interrupted = reopened.get(&running_id).unwrap();
        assert_eq!((interrupted.phase, interrupted.resumed), (Phase::Failed, 1));
        let error = interrupted.error.unwrap();
        assert_eq!(
            (error.kind.as_str(), error.message.as_str()),
            ("interrupted", "start it again")
        );
        assert_eq!(reopened.get(&id).unwrap().phase, Phase::Done);
        assert!(matches!(
            reopened.get("nope"),
            Err(TunerError::UnknownJob(_))
        ));
    }
}
