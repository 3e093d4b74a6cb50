//! Offline re-labelling of the whole store, on the storage node (NDPipe's offline inference).
//!
//! Four stages run at once, joined by bounded queues so that the model never waits on I/O:
//! read compressed tensors from the volumes -> decompress -> batch and run the model -> write
//! labels and features. The job checkpoints the last photo id it finished after every batch, so
//! an interrupted job resumes where it stopped. A photo whose stored tensor is corrupt is reported
//! and skipped; the job goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_catalog::{Catalog, Prediction};
use ndpipe_model::{ImageTensor, TensorBlob};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::PhotoStore;
use crate::features::FeatureStore;
use crate::labeler::{ActiveModel, write_outputs};

/// Settings of a re-labelling job.
#[derive(Debug, Clone)]
pub struct RelabelOptions {
    /// Photos per model run.
    pub batch: usize,
    /// Labels kept per photo.
    pub top_k: usize,
    /// Depth of each queue between stages, in photos.
    pub queue: usize,
    /// Measure label churn against this version's top-1 (default: the photo's previous labels
    /// under the same version, else under any other).
    pub compare_with: Option<String>,
}

impl Default for RelabelOptions {
    fn default() -> Self {
        RelabelOptions {
            batch: 32,
            top_k: 5,
            queue: 256,
            compare_with: None,
        }
    }
}

/// Progress and result of a re-labelling job; also its resumable state in the catalog.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RelabelReport {
    /// The model version whose labels are written.
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

/// What a re-labelling reads from and writes to.
pub struct Relabeler<'a> {
    /// Where the tensors are.
    pub store: &'a Arc<PhotoStore>,
    /// Where the labels go.
    pub catalog: &'a Arc<dyn Catalog>,
    /// Where the features go.
    pub features: &'a Arc<FeatureStore>,
    /// The model.
    pub model: &'a ActiveModel,
    /// Batch size and queue depths.
    pub options: &'a RelabelOptions,
}

impl Relabeler<'_> {
    /// Runs a re-labelling of every live photo after `report.last_id`, updating `report` as it
    /// goes and calling `checkpoint` after every batch. Stops early, cleanly, when `cancel` is set.
    pub fn run(
        &self,
        report: &Mutex<RelabelReport>,
        cancel: &AtomicBool,
        checkpoint: impl FnMut(&RelabelReport),
    ) -> Result<(), crate::IngestError> {
        run(self, report, cancel, checkpoint)
    }
}

fn run(
    ctx: &Relabeler<'_>,
    report: &Mutex<RelabelReport>,
    cancel: &AtomicBool,
    mut checkpoint: impl FnMut(&RelabelReport),
) -> Result<(), crate::IngestError> {
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
    {
        let mut r = lock(report);
        r.model_version = model.version.clone();
        r.total = ids.len() as u64;
    }
    let batch_size = options.batch.min(model.backend.max_batch()).max(1);
    let queue = options.queue.max(batch_size);
    let (raw_tx, raw_rx) = sync_channel::<(u64, Result<Vec<u8>, String>)>(queue);
    let (tensor_tx, tensor_rx) = sync_channel::<(u64, Result<ImageTensor, String>)>(queue);
    let (out_tx, out_rx) = sync_channel(4);
    let model_time = Arc::new(Mutex::new(Duration::ZERO));
    let mut done_run = 0u64;
    std::thread::scope(|scope| -> Result<(), crate::IngestError> {
        let reader_store = Arc::clone(store);
        scope.spawn(move || {
            for id in ids {
                if cancel.load(Ordering::Relaxed) {
                    break;
                }
                let item = match reader_store.tensor(id) {
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
                let tensor = item.and_then(|b| TensorBlob::decode(&b).map_err(|e| e.to_string()));
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
                    backend.run(batch).map(Some).map_err(|e| e.to_string())
                };
                *model_time_w.lock().unwrap_or_else(|p| p.into_inner()) += t.elapsed();
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
            let Some(outputs) = result.map_err(crate::IngestError::Internal)? else {
                continue;
            };
            let previous: Vec<Option<String>> = ids
                .iter()
                .map(|id| {
                    previous_top1(
                        &***catalog,
                        *id,
                        &model.version,
                        options.compare_with.as_deref(),
                    )
                })
                .collect::<Result<_, _>>()?;
            let rows = write_outputs(model, &***catalog, features, &ids, &outputs, options.top_k)?;
            for ((_, new), old) in rows.iter().zip(previous) {
                if let (Some(old), Some(new)) = (old, new.first()) {
                    r.compared += 1;
                    r.changed += u64::from(old != new.label);
                }
            }
            r.done += ids.len() as u64;
            done_run += ids.len() as u64;
            r.last_id = ids.last().copied().or(r.last_id);
            update_rates(
                &mut r,
                done_run,
                started.elapsed(),
                *model_time.lock().unwrap_or_else(|p| p.into_inner()),
            );
            checkpoint(&r);
        }
        Ok(())
    })?;
    let mut r = lock(report);
    update_rates(
        &mut r,
        done_run,
        started.elapsed(),
        *model_time.lock().unwrap_or_else(|p| p.into_inner()),
    );
    Ok(())
}

fn update_rates(r: &mut RelabelReport, done_run: u64, wall: Duration, model: Duration) {
    let done_now = done_run as f64;
    r.wall_seconds = wall.as_secs_f64();
    r.model_seconds = model.as_secs_f64();
    r.images_per_second = done_now / r.wall_seconds.max(1e-9);
    r.model_images_per_second = done_now / r.model_seconds.max(1e-9);
    r.changed_fraction = if r.compared == 0 {
        0.0
    } else {
        r.changed as f64 / r.compared as f64
    };
}

/// The top-1 label the catalog held before: under `compare_with` when given, else under the same
/// version if present, else under any other version.
pub fn previous_top1(
    catalog: &dyn Catalog,
    id: u64,
    version: &str,
    compare_with: Option<&str>,
) -> Result<Option<String>, crate::IngestError> {
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
