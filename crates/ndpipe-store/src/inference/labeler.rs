//! Online inference at ingest: photos are labelled right after their durable write.
//!
//! Uploads hand their tensor to a dedicated model thread (inference never runs on the async
//! runtime). The thread gathers up to `max_batch` photos, waiting at most `max_wait` after the
//! first one, so concurrent uploads share a batch; it runs the backbone once over the batch,
//! then every task's classifier over the same outputs, and writes each task's top-k labels to
//! the catalog (under the task's version) and the feature vectors to the feature store. The HTTP 201 does not wait for this: the
//! 201-to-label latency is exported as `ndpipe_store_label_latency_seconds`. Photos that find the
//! queue full wait in a bounded [`Backlog`] of ids (past its bound, in the catalog as unlabelled);
//! a photo whose labels a crash lost is queued again at the next start. The primary of a
//! replicated photo labels it before the 201 instead ([`Labeler::label_first`]), so that its
//! copies carry its features; it files the labels itself once the photo is catalogued.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ndpipe_catalog::{PhotoCatalog, Prediction};
use ndpipe_model::{ImageTensor, OTHER, Outputs};
use ndpipe_util::sync::lock;
use tokio::sync::oneshot;
use tracing::warn;

use super::InferenceError;
use super::backbone::stored_tensor;
use super::backlog::Backlog;
use super::model::{ActiveModel, SharedModel};
use crate::metrics::StoreMetrics;
use crate::storage::features::encode;
use crate::storage::{FeatureStore, PhotoStore};

/// Settings of online labelling.
#[derive(Debug, Clone)]
pub(crate) struct LabelerConfig {
    /// Largest batch per model run.
    pub(crate) max_batch: usize,
    /// Longest wait for a batch to fill after its first photo.
    pub(crate) max_wait: Duration,
    /// Labels kept per photo.
    pub(crate) top_k: usize,
    /// Photos waiting for the model with their tensors; more go to the backlog.
    pub(crate) queue: usize,
    /// Photo ids the backlog holds; more are found again in the catalog.
    pub(crate) backlog: usize,
}

impl Default for LabelerConfig {
    fn default() -> Self {
        LabelerConfig {
            max_batch: 16,
            max_wait: Duration::from_millis(5),
            top_k: 5,
            queue: 256,
            backlog: 100_000,
        }
    }
}

struct Request {
    id: u64,
    tensor: ImageTensor,
    enqueued: Instant,
    /// Where a photo labelled first gets its results (its labels are then not filed here).
    reply: Option<oneshot::Sender<Labelled>>,
}

/// Every task's top-k labels of one photo, as (model version, labels).
pub(crate) type TaskLabels = Vec<(String, Vec<Prediction>)>;

/// A photo labelled before it is catalogued ([`Labeler::label_first`]): its features, stored
/// here already, and its labels, which the caller files once the photo's catalog row exists.
#[derive(Debug)]
pub(crate) struct Labelled {
    /// The backbone version the features were computed with.
    pub(crate) backbone: String,
    /// The features as the feature store keeps them.
    pub(crate) features: Vec<u8>,
    /// Every task's top-k labels.
    pub(crate) labels: TaskLabels,
}

/// The online labelling worker.
pub(crate) struct Labeler {
    tx: Mutex<Option<SyncSender<Request>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    model: SharedModel,
    backlog: Arc<Backlog>,
    metrics: Arc<StoreMetrics>,
}

impl Labeler {
    /// Starts the model thread.
    pub(crate) fn start(
        model: SharedModel,
        store: Arc<PhotoStore>,
        features: Arc<FeatureStore>,
        catalog: Arc<dyn PhotoCatalog>,
        metrics: Arc<StoreMetrics>,
        config: LabelerConfig,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let backlog = Arc::new(Backlog::new(config.backlog));
        let worker = Worker {
            model: model.clone(),
            features,
            store,
            catalog,
            metrics: metrics.clone(),
            config,
            backlog: backlog.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ndpipe-labeler".into())
            .spawn(move || worker.run(rx))?;
        Ok(Labeler {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            model,
            backlog,
            metrics,
        })
    }

    /// The model in use.
    pub(crate) fn model(&self) -> &SharedModel {
        &self.model
    }

    /// Queues stored photos for labelling from their stored tensors (e.g. photos stored while
    /// no model was loaded, or whose labels a crash lost).
    pub(crate) fn enqueue_stored(&self, ids: impl IntoIterator<Item = u64>) {
        self.backlog.extend(ids, Instant::now());
        set_gauge(&self.metrics, &self.backlog);
    }

    /// Queues a stored photo for labelling. When the queue is full, the photo's id goes to the
    /// backlog that the model thread works off (reading the stored tensor) when it is idle.
    pub(crate) fn submit(&self, id: u64, tensor: ImageTensor) {
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else { return };
        let enqueued = Instant::now();
        if let Err(TrySendError::Full(_)) = tx.try_send(Request {
            id,
            tensor,
            enqueued,
            reply: None,
        }) {
            self.backlog.extend([id], enqueued);
            set_gauge(&self.metrics, &self.backlog);
        }
    }

    /// Labels a stored photo in the next batch and hands back its features and labels instead
    /// of filing the labels (the photo is not catalogued yet). Gives the tensor back when the
    /// queue is full or labelling stopped; the receiver fails when the batch does.
    pub(crate) fn label_first(
        &self,
        id: u64,
        tensor: ImageTensor,
    ) -> Result<oneshot::Receiver<Labelled>, ImageTensor> {
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else {
            return Err(tensor);
        };
        let (reply, rx) = oneshot::channel();
        let request = Request {
            id,
            tensor,
            enqueued: Instant::now(),
            reply: Some(reply),
        };
        match tx.try_send(request) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(r) | TrySendError::Disconnected(r)) => Err(r.tensor),
        }
    }
}

impl Labeler {
    /// Stops the model thread after the batch it is running and waits for it; photos still
    /// queued stay unlabelled until the next start queues them again. Blocks: call it off the
    /// async runtime.
    pub(crate) fn stop(&self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take()
            && t.join().is_err()
        {
            warn!("labeler thread panicked");
        }
    }
}

impl Drop for Labeler {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Worker {
    model: SharedModel,
    store: Arc<PhotoStore>,
    catalog: Arc<dyn PhotoCatalog>,
    features: Arc<FeatureStore>,
    metrics: Arc<StoreMetrics>,
    config: LabelerConfig,
    backlog: Arc<Backlog>,
}

impl Worker {
    fn run(self, rx: Receiver<Request>) {
        let max_batch = self
            .config
            .max_batch
            .min(self.model.get().backend.max_batch())
            .max(1);
        loop {
            let first = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    self.work_off_backlog(max_batch);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let deadline = Instant::now() + self.config.max_wait;
            let mut batch = vec![first];
            while batch.len() < max_batch {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(r) => batch.push(r),
                    Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            let photos = batch.len();
            if let Err(e) = self.label(batch) {
                warn!(error = %e, photos, "online labelling failed; the photos stay unlabelled");
                self.metrics.error("label_failed");
            }
        }
    }

    /// Labels up to one batch of backlogged photos from their stored tensors, first refilling
    /// the backlog from the catalog if it left photos out.
    fn work_off_backlog(&self, max_batch: usize) {
        if self.backlog.needs_refill() {
            self.refill_backlog();
        }
        let taken = self.backlog.take(max_batch);
        set_gauge(&self.metrics, &self.backlog);
        let mut batch = Vec::with_capacity(taken.len());
        for (id, enqueued) in taken {
            match stored_tensor(&self.store, id) {
                Ok(tensor) => batch.push(Request {
                    id,
                    tensor,
                    enqueued,
                    reply: None,
                }),
                // Deleted meanwhile.
                Err(InferenceError::NoTensor { .. }) => {}
                Err(e) => warn!(photo = id, error = %e, "cannot read a backlogged photo's tensor"),
            }
        }
        let photos = batch.len();
        if photos > 0
            && let Err(e) = self.label(batch)
        {
            warn!(error = %e, photos, "labelling backlogged photos failed");
            self.metrics.error("label_failed");
        }
    }

    /// Queues the photos the catalog holds without labels of the general task's version (every
    /// task is labelled in the same pass).
    fn refill_backlog(&self) {
        let model = self.model.get();
        match self.catalog.unlabelled(model.general_version()) {
            Ok(ids) => self.backlog.extend(ids, Instant::now()),
            Err(e) => warn!(
                error = %e,
                "cannot list the unlabelled photos; they stay unlabelled until the next start or re-labelling"
            ),
        }
    }

    /// Runs the model over `batch`, stores every photo's features, files the labels of the
    /// photos queued after their catalog row and hands the others back their results.
    fn label(&self, batch: Vec<Request>) -> Result<(), InferenceError> {
        let model = self.model.get();
        let tensors: Vec<ImageTensor> = batch.iter().map(|r| r.tensor.clone()).collect();
        let outputs = model.backend.run(&tensors)?;
        let backbone = &model.info().backbone_version;
        let rows: Vec<(u64, &[f32])> = batch
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, outputs.features(i)))
            .collect();
        self.features.put_many(backbone, &rows)?;
        let k = self.config.top_k;
        let mut filed: Vec<(u64, TaskLabels)> = Vec::new();
        let labelled = batch.len() as u64;
        for (i, r) in batch.into_iter().enumerate() {
            let labels = model.label(&outputs, i, k);
            for (task, (_, predictions)) in model.tasks.iter().zip(&labels) {
                let other = predictions.first().is_some_and(|p| p.label == OTHER);
                self.metrics.task_label(task.task.as_str(), other);
            }
            self.metrics
                .label_seconds
                .observe(r.enqueued.elapsed().as_secs_f64());
            match r.reply {
                // A caller that gave up leaves the photo to re-labelling.
                Some(reply) => drop(reply.send(Labelled {
                    backbone: backbone.clone(),
                    features: encode(outputs.features(i))?,
                    labels,
                })),
                None => filed.push((r.id, labels)),
            }
        }
        file_labels(&*self.catalog, filed)?;
        self.metrics.labelled.inc_by(labelled);
        Ok(())
    }
}

/// Shows how many photo ids wait in the backlog.
fn set_gauge(metrics: &StoreMetrics, backlog: &Backlog) {
    metrics
        .label_backlog
        .set(i64::try_from(backlog.len()).unwrap_or(i64::MAX));
}

/// Files each photo's labels of every task, one catalog write per model version. Labels of
/// photos deleted meanwhile are skipped.
pub(crate) fn file_labels(
    catalog: &dyn PhotoCatalog,
    photos: Vec<(u64, TaskLabels)>,
) -> Result<(), InferenceError> {
    let mut by_version: BTreeMap<String, Vec<(u64, Vec<Prediction>)>> = BTreeMap::new();
    for (id, labels) in photos {
        for (version, predictions) in labels {
            by_version
                .entry(version)
                .or_default()
                .push((id, predictions));
        }
    }
    for (version, rows) in by_version {
        catalog.put_predictions_many(&version, &rows)?;
    }
    Ok(())
}

/// Files the features and labels of a batch: features under the backbone, then every task's
/// labels under its version, so a photo with labels always has its features. Returns each
/// photo's labels of the task serving `version`, for label churn.
pub(crate) fn write_outputs(
    model: &ActiveModel,
    catalog: &dyn PhotoCatalog,
    features: &FeatureStore,
    ids: &[u64],
    outputs: &Outputs,
    k: usize,
) -> Result<Vec<(u64, TaskLabels)>, InferenceError> {
    let info = model.info();
    let rows: Vec<(u64, TaskLabels)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, model.label(outputs, i, k)))
        .collect();
    let feature_rows: Vec<(u64, &[f32])> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, outputs.features(i)))
        .collect();
    features.put_many(&info.backbone_version, &feature_rows)?;
    file_labels(catalog, rows.clone())?;
    Ok(rows)
}

#[cfg(test)]
mod tests;
