//! Long-running jobs of a PipeStore (re-labelling), one at a time, recorded in the catalog so
//! that a job interrupted by a crash or a shutdown resumes at the next start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ndpipe_catalog::{Catalog, JobRecord};
use ndpipe_util::sync::lock;
use ndpipe_util::time::now_ms;
use serde::Serialize;
use tracing::{info, warn};

use crate::inference::model::SharedModel;
use crate::inference::{RelabelOptions, RelabelReport, Relabeler};
use crate::storage::{FeatureStore, PhotoStore};

const RELABEL: &str = "relabel";

/// Why a job could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum JobError {
    /// Another job is running.
    #[error("job {0} is still running")]
    Busy(String),
    /// No model is loaded on this node.
    #[error("no model is loaded (start the server with a model to label photos)")]
    NoModel,
    /// The requested model version is not the one loaded here.
    #[error("unknown model version {requested:?}; this node runs {loaded:?}")]
    UnknownModel {
        /// Asked for.
        requested: String,
        /// Loaded.
        loaded: String,
    },
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] ndpipe_catalog::CatalogError),
    /// The job thread could not start.
    #[error("cannot start the job thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// A job as shown to clients.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobView {
    /// Id.
    pub(crate) id: String,
    /// Kind ("relabel").
    pub(crate) kind: String,
    /// "running", "done", "interrupted" or "failed: ...".
    pub(crate) status: String,
    /// Progress and results.
    pub(crate) report: RelabelReport,
    /// Created, ms since the Unix epoch.
    pub(crate) created_ms: i64,
    /// Last updated, ms since the Unix epoch.
    pub(crate) updated_ms: i64,
}

struct Current {
    id: String,
    report: Arc<Mutex<RelabelReport>>,
    cancel: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

/// Runs and tracks jobs.
pub(crate) struct Jobs {
    store: Arc<PhotoStore>,
    features: Arc<FeatureStore>,
    catalog: Arc<dyn Catalog>,
    model: Option<SharedModel>,
    options: RelabelOptions,
    current: Mutex<Option<Current>>,
}

impl Jobs {
    /// A job runner over the store, its features, the catalog and (optional) model.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        features: Arc<FeatureStore>,
        catalog: Arc<dyn Catalog>,
        model: Option<SharedModel>,
        options: RelabelOptions,
    ) -> Self {
        Jobs {
            store,
            features,
            catalog,
            model,
            options,
            current: Mutex::new(None),
        }
    }

    /// Starts re-labelling every photo with the loaded model, every task (`version`, if given,
    /// must name a version it serves).
    pub(crate) fn start_relabel(
        self: &Arc<Self>,
        version: Option<&str>,
    ) -> Result<String, JobError> {
        let model = self.model.as_ref().ok_or(JobError::NoModel)?.get();
        if let Some(v) = version
            && model.serving_version(v).is_none()
        {
            return Err(JobError::UnknownModel {
                requested: v.into(),
                loaded: model.serving().to_string(),
            });
        }
        let now = now_ms();
        let record = JobRecord {
            id: format!("relabel-{now}"),
            kind: RELABEL.into(),
            status: "running".into(),
            state: serde_json::to_value(RelabelReport::default()).expect("report serialises"),
            created_ms: now,
            updated_ms: now,
        };
        self.spawn(record, RelabelReport::default())
    }

    /// Resumes the newest re-labelling left running or interrupted by the previous process.
    pub(crate) fn resume_interrupted(self: &Arc<Self>) -> Result<Option<String>, JobError> {
        if self.model.is_none() {
            return Ok(None);
        }
        let pending =
            self.catalog.jobs()?.into_iter().rfind(|j| {
                j.kind == RELABEL && (j.status == "running" || j.status == "interrupted")
            });
        let Some(record) = pending else {
            return Ok(None);
        };
        let mut report: RelabelReport =
            serde_json::from_value(record.state.clone()).unwrap_or_default();
        let loaded = self
            .model
            .as_ref()
            .map(|m| m.get().general_version().to_string());
        if !report.model_version.is_empty() && loaded.as_ref() != Some(&report.model_version) {
            // Another version was deployed meanwhile: finishing with it would leave the photos
            // labelled before the checkpoint under the old version, so the job starts over.
            info!(job = %record.id, was = %report.model_version, now = ?loaded, "the model changed: the interrupted re-labelling starts over");
            report = RelabelReport::default();
        } else {
            info!(job = %record.id, done = report.done, last_id = ?report.last_id, "resuming an interrupted re-labelling");
        }
        self.spawn(record, report).map(Some)
    }

    fn spawn(
        self: &Arc<Self>,
        mut record: JobRecord,
        report: RelabelReport,
    ) -> Result<String, JobError> {
        let mut current = lock(&self.current);
        if let Some(c) = current.as_ref()
            && !c.handle.is_finished()
        {
            return Err(JobError::Busy(c.id.clone()));
        }
        record.status = "running".into();
        record.updated_ms = now_ms();
        self.catalog.put_job(&record)?;
        let report = Arc::new(Mutex::new(report));
        let cancel = Arc::new(AtomicBool::new(false));
        let id = record.id.clone();
        let this = self.clone();
        let (r, c) = (report.clone(), cancel.clone());
        let handle = std::thread::Builder::new()
            .name("ndpipe-relabel".into())
            .spawn(move || this.run(record, &r, &c))
            .map_err(JobError::Spawn)?;
        *current = Some(Current {
            id: id.clone(),
            report,
            cancel,
            handle,
        });
        Ok(id)
    }

    fn run(&self, mut record: JobRecord, report: &Mutex<RelabelReport>, cancel: &AtomicBool) {
        let Some(model) = self.model.as_ref().map(SharedModel::get) else {
            return;
        };
        let catalog = self.catalog.clone();
        let save = |record: &mut JobRecord, r: &RelabelReport| {
            record.state = serde_json::to_value(r).expect("report serialises");
            record.updated_ms = now_ms();
            if let Err(e) = catalog.put_job(record) {
                warn!(job = %record.id, error = %e, "cannot record job progress");
            }
        };
        let relabeler = Relabeler {
            store: &self.store,
            catalog: &*self.catalog,
            features: &self.features,
            model: &model,
            options: &self.options,
        };
        let result = relabeler.run(report, cancel, |r| save(&mut record.clone(), r));
        let final_report = lock(report).clone();
        record.status = match (&result, cancel.load(Ordering::Relaxed)) {
            (Err(e), _) => format!("failed: {e}"),
            (Ok(()), true) => "interrupted".into(),
            (Ok(()), false) => "done".into(),
        };
        save(&mut record, &final_report);
        match result {
            Ok(()) => info!(job = %record.id, status = %record.status, done = final_report.done,
                images_per_second = final_report.images_per_second, changed = final_report.changed_fraction,
                "re-labelling finished"),
            Err(e) => warn!(job = %record.id, error = %e, "re-labelling failed"),
        }
    }

    /// One job, with live progress when it is the running one.
    pub(crate) fn get(&self, id: &str) -> Result<Option<JobView>, JobError> {
        Ok(self.list()?.into_iter().find(|j| j.id == id))
    }

    /// All jobs, oldest first.
    pub(crate) fn list(&self) -> Result<Vec<JobView>, JobError> {
        let current = lock(&self.current);
        let live = current
            .as_ref()
            .filter(|c| !c.handle.is_finished())
            .map(|c| (c.id.clone(), lock(&c.report).clone()));
        Ok(self
            .catalog
            .jobs()?
            .into_iter()
            .map(|j| {
                let report = match &live {
                    Some((id, r)) if *id == j.id => r.clone(),
                    _ => serde_json::from_value(j.state.clone()).unwrap_or_default(),
                };
                JobView {
                    id: j.id,
                    kind: j.kind,
                    status: j.status,
                    report,
                    created_ms: j.created_ms,
                    updated_ms: j.updated_ms,
                }
            })
            .collect())
    }

    /// Stops the running job at its next batch and waits for it; it resumes at the next start.
    pub(crate) fn shutdown(&self) {
        if let Some(c) = lock(&self.current).take() {
            c.cancel.store(true, Ordering::Relaxed);
            if c.handle.join().is_err() {
                warn!("job thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::ActiveModel;

    fn interrupted(model_version: &str) -> JobRecord {
        let report = RelabelReport {
            model_version: model_version.into(),
            done: 5,
            last_id: Some(5),
            ..RelabelReport::default()
        };
        JobRecord {
            id: "relabel-1".into(),
            kind: RELABEL.into(),
            status: "interrupted".into(),
            state: serde_json::to_value(report).unwrap(),
            created_ms: 1,
            updated_ms: 1,
        }
    }

    fn resumed(s: &crate::testing::Setup, model: &SharedModel) -> RelabelReport {
        let jobs = Arc::new(Jobs::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            Some(model.clone()),
            RelabelOptions::default(),
        ));
        assert_eq!(
            jobs.resume_interrupted().unwrap().as_deref(),
            Some("relabel-1")
        );
        jobs.shutdown();
        jobs.get("relabel-1").unwrap().unwrap().report
    }

    #[test]
    fn a_job_interrupted_under_another_model_starts_over_with_the_loaded_one() {
        let s = crate::testing::setup();
        let mut pretrained = ActiveModel::pretrained(s.fake.clone());
        pretrained.tasks[0].version = "v2".into();
        let model = SharedModel::new(pretrained);
        s.catalog.put_job(&interrupted("v1")).unwrap();
        let report = resumed(&s, &model);
        assert_eq!(report.model_version, "v2");
        assert_eq!(
            (report.done, report.last_id),
            (0, None),
            "started over: {report:?}"
        );

        s.catalog.put_job(&interrupted("v2")).unwrap();
        let report = resumed(&s, &model);
        assert_eq!(
            report.done, 5,
            "the same model goes on from the checkpoint: {report:?}"
        );
    }
}
