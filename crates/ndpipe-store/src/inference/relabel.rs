//! Re-labelling the whole store on the storage node (NDPipe's offline inference), two ways.
//!
//! - **Full** ([`Relabeler::run`]): four stages run at once, joined by bounded queues so that the
//!   model never waits on I/O: read compressed tensors from the volumes -> decompress -> batch
//!   and run the backbone -> write every task's labels and the features. The job checkpoints the
//!   last photo id it finished after every batch, so an interrupted job resumes where it
//!   stopped. A photo whose stored tensor is corrupt is reported and skipped; the job goes on.
//! - **Head-only** ([`Relabeler::run_head`]): after a deploy of one task's head, that head runs
//!   over the stored features; the backbone runs only for photos without features.
//!
//! Both measure label churn ([`Churn`]) of one task against the photo's previous top-1 label
//! ([`previous_top1`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_catalog::{PhotoCatalog, Prediction, TaskName};
use ndpipe_model::{ImageTensor, ModelError};
use ndpipe_util::churn::Churn;
use ndpipe_util::sync::lock;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::InferenceError;
use super::backbone::{FeatureSource, decode_tensor};
use super::labeler::write_outputs;
use super::model::{ActiveModel, TaskModel, head_predictions};
use super::pending::Pending;
use crate::storage::{FeatureStore, PhotoStore};

/// Photos per feature read and catalog write in a head-only re-labelling.
const HEAD_BATCH: usize = 256;

/// Settings of a re-labelling.
#[derive(Debug, Clone)]
pub struct RelabelOptions {
    /// Photos per model run.
    pub batch: usize,
    /// Labels kept per photo.
    pub top_k: usize,
    /// Depth of each queue between stages, in photos (at least a batch; with `pending`, of the
    /// first stage's only, the next one holding one batch).
    pub queue: usize,
    /// The task whose label churn a full re-labelling measures.
    pub churn_task: TaskName,
    /// Measure label churn against this version's top-1 (default: the photo's previous labels
    /// under the same version, else under any other version of the task).
    pub compare_with: Option<String>,
    /// Photos to read from a shared queue, so that another thread can give some away (a
    /// rollout's load balancing); the pass skips the photos given away.
    pub pending: Option<Arc<Pending>>,
}

impl Default for RelabelOptions {
    fn default() -> Self {
        RelabelOptions {
            batch: 32,
            top_k: 5,
            queue: 256,
            churn_task: TaskName::general(),
            compare_with: None,
            pending: None,
        }
    }
}

/// Progress and result of a re-labelling job; also its resumable state in the catalog.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RelabelReport {
    /// The model version whose label churn is measured (every task's labels are written).
    pub model_version: String,
    /// Photos to label in this run (after the checkpoint).
    pub total: u64,
    /// Photos labelled so far (over all runs of the job).
    pub done: u64,
    /// The last photo id finished: the checkpoint.
    pub last_id: Option<u64>,
    /// Photos whose top-1 label was compared with an earlier prediction.
    pub compared: u64,
    /// Of those, photos whose top-1 label changed.
    pub changed: u64,
    /// `changed / compared`.
    pub changed_fraction: f64,
    /// Photos skipped, with the reason (corrupt tensor, ...).
    pub skipped: Vec<(u64, String)>,
    /// Wall-clock seconds of this run.
    pub wall_seconds: f64,
    /// Seconds spent inside the model.
    pub model_seconds: f64,
    /// Photos per wall-clock second, in this run.
    pub images_per_second: f64,
    /// Photos per second of model time (what NDPipe's artifact reported).
    pub model_images_per_second: f64,
}

impl RelabelReport {
    fn add_churn(&mut self, churn: Churn) {
        let mut total = Churn {
            compared: self.compared,
            changed: self.changed,
        };
        total += churn;
        self.compared = total.compared;
        self.changed = total.changed;
        self.changed_fraction = total.fraction();
    }
}

/// What a head-only re-labelling did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeadRelabelReport {
    /// Photos labelled.
    pub(crate) photos: u64,
    /// Top-1 labels compared with earlier ones, and how many changed.
    pub(crate) churn: Churn,
    /// Photos whose features the backbone had to compute.
    pub(crate) computed: u64,
    /// Wall-clock seconds.
    pub(crate) seconds: f64,
}

/// What a re-labelling reads from and writes to.
///
/// A building block: [`crate::PipeStore`] runs it for re-labelling jobs and deploys; a benchmark
/// can run it over a [`PhotoStore`] of its own.
pub struct Relabeler<'a> {
    /// Where the tensors are.
    pub store: &'a PhotoStore,
    /// Where the labels go.
    pub catalog: &'a dyn PhotoCatalog,
    /// Where the features go (and, head-only, come from).
    pub features: &'a FeatureStore,
    /// The model.
    pub model: &'a ActiveModel,
    /// Batch size, labels per photo, queue depths and the churn reference.
    pub options: &'a RelabelOptions,
}

impl Relabeler<'_> {
    /// Runs a full re-labelling (backbone and classifier) of every live photo after
    /// `report.last_id`, updating `report` as it goes and calling `checkpoint` after every batch.
    /// Stops early, cleanly, when `cancel` is set. Blocks: call it off the async runtime.
    pub fn run(
        &self,
        report: &Mutex<RelabelReport>,
        cancel: &AtomicBool,
        checkpoint: impl FnMut(&RelabelReport),
    ) -> Result<(), InferenceError> {
        run(self, report, cancel, checkpoint)
    }

    /// Re-labels every live photo with `task`'s head over its stored features (the backbone
    /// runs only for photos without), filing the labels under the task's version; `progress`
    /// hears (photos done, photos in all) after every batch. Fails for a task without a head.
    pub(crate) fn run_head(
        &self,
        task: &TaskModel,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<HeadRelabelReport, InferenceError> {
        let started = Instant::now();
        let version = &task.version;
        let Some(head) = &task.head else {
            return Err(InferenceError::NotStaged {
                version: version.clone(),
            });
        };
        let compare_with = self.options.compare_with.as_deref();
        let source = FeatureSource {
            store: self.store,
            features: self.features,
            backend: &*self.model.backend,
        };
        let ids: Vec<u64> = self
            .store
            .entries()?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut churn = Churn::default();
        let mut computed = 0u64;
        let (mut done, total) = (0u64, ids.len() as u64);
        for batch in ids.chunks(HEAD_BATCH) {
            let (values, extracted) = source.features(batch, true)?;
            computed += extracted as u64;
            let dim = self.model.info().feature_dim;
            let mut rows: Vec<(u64, Vec<Prediction>)> = Vec::with_capacity(batch.len());
            for (id, f) in batch.iter().zip(values.chunks_exact(dim)) {
                let labels = head_predictions(head, f, self.options.top_k, task.floor);
                let old = previous_top1(self.catalog, *id, version, compare_with)?;
                churn.record(old.as_deref(), labels.first().map(|p| p.label.as_str()));
                rows.push((*id, labels));
            }
            self.catalog.put_predictions_many(version, &rows)?;
            done += batch.len() as u64;
            progress(done, total);
        }
        Ok(HeadRelabelReport {
            photos: ids.len() as u64,
            churn,
            computed,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// One model run's output, as the writer stage gets it: the photos, the outputs (`None` for an
/// empty run) and the photos skipped since the previous batch.
type Batch = (
    Vec<u64>,
    Result<Option<ndpipe_model::Outputs>, ModelError>,
    Vec<(u64, String)>,
);

fn run(
    ctx: &Relabeler<'_>,
    report: &Mutex<RelabelReport>,
    cancel: &AtomicBool,
    mut checkpoint: impl FnMut(&RelabelReport),
) -> Result<(), InferenceError> {
    let Relabeler {
        store,
        catalog,
        features,
        model,
        options,
    } = ctx;
    let started = Instant::now();
    let after = lock(report).last_id;
    let ids: Vec<u64> = store
        .entries()?
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| after.is_none_or(|a| *id > a))
        .collect();
    let pending = options.pending.clone().unwrap_or_default();
    pending.fill(ids);
    let churn_version = model.task(options.churn_task.as_str()).map_or_else(
        || model.general_version().to_string(),
        |t| t.version.clone(),
    );
    {
        let mut r = lock(report);
        r.model_version = churn_version.clone();
        r.total = pending.len() as u64;
    }
    let batch_size = options.batch.min(model.backend.max_batch()).max(1);
    // Read from a shared queue, the pass holds the model's batch and the next one only (what it
    // holds cannot be given away); else each stage reads a batch ahead at least.
    let (raw_depth, tensor_depth) = match options.pending {
        Some(_) => (options.queue, batch_size),
        None => (options.queue.max(batch_size), options.queue.max(batch_size)),
    };
    let (raw_tx, raw_rx) = sync_channel::<(u64, Result<Vec<u8>, String>)>(raw_depth);
    let (tensor_tx, tensor_rx) = sync_channel::<(u64, Result<ImageTensor, String>)>(tensor_depth);
    let (out_tx, out_rx) = sync_channel::<Batch>(4);
    let model_time = Arc::new(Mutex::new(Duration::ZERO));
    let mut done_run = 0u64;
    std::thread::scope(|scope| -> Result<(), InferenceError> {
        scope.spawn(move || {
            while let Some(id) = pending.next() {
                if cancel.load(Ordering::Relaxed) {
                    break;
                }
                let item = match store.tensor(id) {
                    Ok(Some((_, blob))) => Ok(blob),
                    Ok(None) => continue,
                    Err(e) => Err(e.to_string()),
                };
                if raw_tx.send((id, item)).is_err() {
                    break;
                }
            }
        });
        scope.spawn(move || {
            for (id, item) in raw_rx {
                let tensor = item.and_then(|b| decode_tensor(id, &b).map_err(|e| e.to_string()));
                if tensor_tx.send((id, tensor)).is_err() {
                    break;
                }
            }
        });
        let backend = model.backend.clone();
        let model_time_w = model_time.clone();
        scope.spawn(move || {
            let mut ids = Vec::with_capacity(batch_size);
            let mut batch = Vec::with_capacity(batch_size);
            let mut skipped = Vec::new();
            let flush = |ids: &mut Vec<u64>,
                         batch: &mut Vec<ImageTensor>,
                         skipped: &mut Vec<(u64, String)>| {
                let t = Instant::now();
                let result = if batch.is_empty() {
                    Ok(None)
                } else {
                    backend.run(batch).map(Some)
                };
                *lock(&model_time_w) += t.elapsed();
                let msg = (std::mem::take(ids), result, std::mem::take(skipped));
                batch.clear();
                out_tx.send(msg).is_ok()
            };
            for (id, tensor) in tensor_rx {
                match tensor {
                    Ok(t) => {
                        ids.push(id);
                        batch.push(t);
                    }
                    Err(reason) => skipped.push((id, reason)),
                }
                if batch.len() == batch_size && !flush(&mut ids, &mut batch, &mut skipped) {
                    return;
                }
            }
            flush(&mut ids, &mut batch, &mut skipped);
        });
        for (ids, result, skipped) in out_rx {
            let mut r = lock(report);
            for (id, reason) in skipped {
                warn!(photo = id, reason = %reason, "re-labelling skips a photo");
                r.skipped.push((id, reason));
            }
            let Some(outputs) = result? else {
                continue;
            };
            let previous: Vec<Option<String>> = ids
                .iter()
                .map(|id| {
                    previous_top1(
                        *catalog,
                        *id,
                        &churn_version,
                        options.compare_with.as_deref(),
                    )
                })
                .collect::<Result<_, _>>()?;
            let rows = write_outputs(model, *catalog, features, &ids, &outputs, options.top_k)?;
            let mut churn = Churn::default();
            for ((_, labels), old) in rows.iter().zip(previous) {
                let new = labels
                    .iter()
                    .find(|(v, _)| *v == churn_version)
                    .and_then(|(_, l)| l.first());
                churn.record(old.as_deref(), new.map(|p| p.label.as_str()));
            }
            r.add_churn(churn);
            r.done += ids.len() as u64;
            done_run += ids.len() as u64;
            r.last_id = ids.last().copied().or(r.last_id);
            update_rates(&mut r, done_run, started.elapsed(), *lock(&model_time));
            checkpoint(&r);
        }
        Ok(())
    })?;
    let mut r = lock(report);
    update_rates(&mut r, done_run, started.elapsed(), *lock(&model_time));
    Ok(())
}

fn update_rates(r: &mut RelabelReport, done_run: u64, wall: Duration, model: Duration) {
    let done_now = done_run as f64;
    r.wall_seconds = wall.as_secs_f64();
    r.model_seconds = model.as_secs_f64();
    r.images_per_second = done_now / r.wall_seconds.max(1e-9);
    r.model_images_per_second = done_now / r.model_seconds.max(1e-9);
}

/// The top-1 label the catalog held before: under `compare_with` when given, else under the same
/// version if present, else under any other version.
pub(crate) fn previous_top1(
    catalog: &dyn PhotoCatalog,
    id: u64,
    version: &str,
    compare_with: Option<&str>,
) -> Result<Option<String>, InferenceError> {
    let all = catalog.predictions(id)?;
    let pick = |v: &(String, Vec<Prediction>)| v.1.first().map(|p| p.label.clone());
    if let Some(other) = compare_with {
        return Ok(all.iter().find(|v| v.0 == other).and_then(pick));
    }
    Ok(all
        .iter()
        .find(|v| v.0 == version)
        .and_then(pick)
        .or_else(|| all.iter().find_map(pick)))
}

#[cfg(test)]
mod tests {
    use ndpipe_model::{HeadWeights, InferenceBackend};

    use super::*;
    use crate::inference::model::backbone_predictions;
    use crate::ingest::{IngestConfig, Ingestor};
    use crate::metrics::StoreMetrics;
    use crate::testing::{Setup, png, setup};

    async fn ingest(s: &Setup, n: u8) -> Vec<u64> {
        let ingestor = Ingestor::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            Arc::new(StoreMetrics::default()),
            IngestConfig::default(),
        );
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(ingestor.ingest(png(i * 10), None).await.unwrap().id);
        }
        ids
    }

    /// The fake backbone as the general task's version `version`.
    fn model(s: &Setup, version: &str) -> ActiveModel {
        let mut model = ActiveModel::pretrained(s.fake.clone());
        model.tasks[0].version = version.into();
        model
    }

    /// A default-task head over the fake backbone, as version `version`.
    fn task(version: &str, head: HeadWeights) -> TaskModel {
        TaskModel {
            task: TaskName::default_task(),
            version: version.into(),
            head: Some(Arc::new(head)),
            floor: None,
        }
    }

    fn relabeler<'a>(
        s: &'a Setup,
        model: &'a ActiveModel,
        options: &'a RelabelOptions,
    ) -> Relabeler<'a> {
        Relabeler {
            store: &s.store,
            catalog: &*s.catalog,
            features: &s.features,
            model,
            options,
        }
    }

    #[tokio::test]
    async fn relabel_matches_online_labels_and_counts_churn() {
        let s = setup();
        let ids = ingest(&s, 20).await;
        let run = |version: &str| {
            let model = model(&s, version);
            let options = RelabelOptions {
                batch: 8,
                ..RelabelOptions::default()
            };
            let report = Mutex::new(RelabelReport::default());
            relabeler(&s, &model, &options)
                .run(&report, &AtomicBool::new(false), |_| {})
                .unwrap();
            report.into_inner().unwrap()
        };
        let first = run("v1");
        assert_eq!((first.done, first.compared), (20, 0));
        let again = run("v1");
        assert_eq!((again.done, again.compared, again.changed), (20, 20, 0));
        assert_eq!(again.changed_fraction, 0.0);
        let photo = s.store.tensor(ids[3]).unwrap().unwrap().1;
        let tensor: ImageTensor = ndpipe_model::TensorBlob::decode(&photo).unwrap();
        let direct = s.fake.run(&[tensor]).unwrap();
        let expected = backbone_predictions(s.fake.info(), &direct, 0, 5, None);
        assert_eq!(
            s.catalog.predictions(ids[3]).unwrap()[0].1,
            expected,
            "batched = single"
        );
        s.fake.set_failing(true);
        let failing = model(&s, "v2");
        let report = Mutex::new(RelabelReport::default());
        let options = RelabelOptions::default();
        let err = relabeler(&s, &failing, &options).run(&report, &AtomicBool::new(false), |_| {});
        assert!(err.is_err(), "a failing model fails the job");
    }

    #[tokio::test]
    async fn head_only_relabel_reads_stored_features_and_counts_churn() {
        let s = setup();
        let ids = ingest(&s, 12).await;
        let options = RelabelOptions {
            top_k: 2,
            ..RelabelOptions::default()
        };
        let pretrained = model(&s, "pretrained");
        relabeler(&s, &pretrained, &options)
            .run(
                &Mutex::new(RelabelReport::default()),
                &AtomicBool::new(false),
                |_| {},
            )
            .unwrap();
        // Every photo's top-1 becomes "up" or "down" by the sign of its first feature.
        let mut weights = vec![0.0; 2 * 16];
        weights[0] = 1.0;
        weights[16] = -1.0;
        let head = HeadWeights::new(
            vec!["up".into(), "down".into()],
            16,
            weights,
            vec![0.0, 0.0],
        )
        .unwrap();
        let tuned_task = task("ft-1", head.clone());
        let tuned = pretrained.clone().with_task(tuned_task.clone());
        let options = RelabelOptions {
            compare_with: Some("pretrained".into()),
            ..options
        };
        let fake_calls = s.fake.batches();
        let r = relabeler(&s, &tuned, &options)
            .run_head(&tuned_task, |_, _| {})
            .unwrap();
        assert_eq!(r.photos, 12);
        assert_eq!(r.computed, 0, "every photo had stored features");
        assert_eq!(s.fake.batches(), fake_calls, "the backbone did not run");
        assert_eq!(r.churn.compared, 12);
        assert_eq!(r.churn.changed, 12, "no fake class is called up or down");
        for id in &ids {
            let labels = s.catalog.predictions(*id).unwrap();
            let tuned = labels.iter().find(|(v, _)| v == "ft-1").unwrap();
            assert_eq!(tuned.1.len(), 2, "the configured top-k");
        }
        // A photo without stored features gets them from the backbone.
        s.features.remove_photo(ids[0]).unwrap();
        let r = relabeler(&s, &tuned, &options)
            .run_head(&tuned_task, |_, _| {})
            .unwrap();
        assert_eq!(r.computed, 1);
    }
}
