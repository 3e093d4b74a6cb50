//! Online inference at ingest: photos are labelled right after their durable write.
//!
//! Uploads hand their tensor to a dedicated model thread (inference never runs on the async
//! runtime). The thread gathers up to `max_batch` photos, waiting at most `max_wait` after the
//! first one, so concurrent uploads share a batch; it then writes the top-k labels to the catalog
//! and the feature vectors to the feature store. The HTTP 201 does not wait for this: the
//! 201-to-label latency is exported as `ndpipe_store_label_latency_seconds`. A photo whose labels
//! are lost (queue full, crash) is picked up by the next re-labelling.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ndpipe_catalog::{Catalog, Prediction};
use ndpipe_model::{ImageTensor, InferenceBackend, ModelInfo, Outputs, TensorBlob, top_k};
use ndpipe_proto::HeadWeights;
use tracing::warn;

use crate::PhotoStore;
use crate::features::FeatureStore;
use crate::metrics::StoreMetrics;

/// The model that labels the store, and the catalog version its labels are filed under.
#[derive(Clone)]
pub struct ActiveModel {
    /// The inference backend (the backbone, with its own pretrained classifier).
    pub backend: Arc<dyn InferenceBackend>,
    /// The catalog's model version id.
    pub version: String,
    /// A fine-tuned classifier head over the backbone's features; `None` uses the backbone's
    /// own logits and classes.
    pub head: Option<Arc<HeadWeights>>,
}

/// The active model, swappable at run time (a deploy commits a new head).
#[derive(Clone)]
pub struct SharedModel(Arc<RwLock<ActiveModel>>);

impl SharedModel {
    /// Wraps the initial model.
    pub fn new(model: ActiveModel) -> Self {
        SharedModel(Arc::new(RwLock::new(model)))
    }

    /// The model now (cheap: it clones `Arc`s).
    pub fn get(&self) -> ActiveModel {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the model.
    pub fn set(&self, model: ActiveModel) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = model;
    }
}

impl ActiveModel {
    /// The model version id used for a pretrained model: its name and the backbone hash prefix.
    pub fn pretrained_version(info: &ModelInfo) -> String {
        let short = &info.backbone_version[..info.backbone_version.len().min(12)];
        format!("{}-{short}", info.name)
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        self.backend.info()
    }

    /// The top-`k` labels of row `i` of a backbone run.
    pub fn predictions(&self, outputs: &Outputs, i: usize, k: usize) -> Vec<Prediction> {
        match &self.head {
            Some(head) => head_predictions(head, outputs.features(i), k),
            None => predictions(self.info(), outputs, i, k),
        }
    }
}

/// The top-`k` labels a head gives a feature vector.
pub fn head_predictions(head: &HeadWeights, features: &[f32], k: usize) -> Vec<Prediction> {
    top_k(&head.logits(features), k)
        .into_iter()
        .map(|(class, score)| Prediction {
            label: head
                .classes
                .get(class)
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            score,
        })
        .collect()
}

/// Settings of online labelling.
#[derive(Debug, Clone)]
pub struct LabelerConfig {
    /// Largest batch per model run.
    pub max_batch: usize,
    /// Longest wait for a batch to fill after its first photo.
    pub max_wait: Duration,
    /// Labels kept per photo.
    pub top_k: usize,
    /// Photos waiting for the model before new ones are left to re-labelling.
    pub queue: usize,
}

impl Default for LabelerConfig {
    fn default() -> Self {
        LabelerConfig {
            max_batch: 16,
            max_wait: Duration::from_millis(5),
            top_k: 5,
            queue: 1024,
        }
    }
}

struct Request {
    id: u64,
    tensor: ImageTensor,
    enqueued: Instant,
}

/// The online labelling worker.
pub struct Labeler {
    tx: Option<SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
    model: SharedModel,
    backlog: Backlog,
}

/// Photos that arrived while the queue was full, labelled from their stored tensors when the
/// model thread is idle.
type Backlog = Arc<Mutex<VecDeque<(u64, Instant)>>>;

impl Labeler {
    /// Starts the model thread.
    pub fn start(
        model: SharedModel,
        store: Arc<PhotoStore>,
        catalog: Arc<dyn Catalog>,
        metrics: Arc<StoreMetrics>,
        config: LabelerConfig,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let backlog = Backlog::default();
        let worker = Worker {
            model: model.clone(),
            features: store.features_arc().clone(),
            store,
            catalog,
            metrics,
            config,
            backlog: backlog.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ndpipe-labeler".into())
            .spawn(move || worker.run(rx))?;
        Ok(Labeler {
            tx: Some(tx),
            thread: Some(thread),
            model,
            backlog,
        })
    }

    /// The model in use.
    pub fn model(&self) -> &SharedModel {
        &self.model
    }

    /// Queues stored photos for labelling from their stored tensors (e.g. photos stored while
    /// no model was loaded, or whose labels a crash lost).
    pub fn enqueue_stored(&self, ids: impl IntoIterator<Item = u64>) {
        let now = Instant::now();
        lock(&self.backlog).extend(ids.into_iter().map(|id| (id, now)));
    }

    /// Queues a stored photo for labelling. When the queue is full, the photo's id goes to a
    /// backlog that the model thread works off (reading the stored tensor) when it is idle.
    pub fn submit(&self, id: u64, tensor: ImageTensor) {
        let Some(tx) = &self.tx else { return };
        let enqueued = Instant::now();
        if let Err(TrySendError::Full(_)) = tx.try_send(Request {
            id,
            tensor,
            enqueued,
        }) {
            lock(&self.backlog).push_back((id, enqueued));
        }
    }
}

impl Drop for Labeler {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!("labeler thread panicked");
        }
    }
}

struct Worker {
    model: SharedModel,
    store: Arc<PhotoStore>,
    catalog: Arc<dyn Catalog>,
    features: Arc<FeatureStore>,
    metrics: Arc<StoreMetrics>,
    config: LabelerConfig,
    backlog: Backlog,
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
            if let Err(e) = self.label(&batch) {
                warn!(error = %e, photos = batch.len(), "online labelling failed; the photos stay unlabelled");
                self.metrics.error("label_failed");
            }
        }
    }

    /// Labels up to one batch of backlogged photos from their stored tensors.
    fn work_off_backlog(&self, max_batch: usize) {
        let taken: Vec<(u64, Instant)> = {
            let mut backlog = lock(&self.backlog);
            let n = backlog.len().min(max_batch);
            backlog.drain(..n).collect()
        };
        let mut batch = Vec::with_capacity(taken.len());
        for (id, enqueued) in taken {
            let tensor = match self.store.tensor(id) {
                Ok(Some((_, blob))) => TensorBlob::decode(&blob).map_err(|e| e.to_string()),
                Ok(None) => continue,
                Err(e) => Err(e.to_string()),
            };
            match tensor {
                Ok(tensor) => batch.push(Request {
                    id,
                    tensor,
                    enqueued,
                }),
                Err(e) => warn!(photo = id, error = %e, "cannot read a backlogged photo's tensor"),
            }
        }
        if !batch.is_empty()
            && let Err(e) = self.label(&batch)
        {
            warn!(error = %e, photos = batch.len(), "labelling backlogged photos failed");
            self.metrics.error("label_failed");
        }
    }

    fn label(&self, batch: &[Request]) -> Result<(), String> {
        let model = self.model.get();
        let tensors: Vec<ImageTensor> = batch.iter().map(|r| r.tensor.clone()).collect();
        let outputs = model.backend.run(&tensors).map_err(|e| e.to_string())?;
        let ids: Vec<u64> = batch.iter().map(|r| r.id).collect();
        write_outputs(
            &model,
            &*self.catalog,
            &self.features,
            &ids,
            &outputs,
            self.config.top_k,
        )
        .map_err(|e| e.to_string())?;
        for r in batch {
            self.metrics
                .label_seconds
                .observe(r.enqueued.elapsed().as_secs_f64());
        }
        self.metrics.labelled.inc_by(batch.len() as u64);
        Ok(())
    }
}

/// The top-`k` labels of row `i`.
pub fn predictions(info: &ModelInfo, outputs: &Outputs, i: usize, k: usize) -> Vec<Prediction> {
    top_k(outputs.logits(i), k)
        .into_iter()
        .map(|(class, score)| Prediction {
            label: info.class_name(class).unwrap_or("unknown").to_string(),
            score,
        })
        .collect()
}

/// Files the features and labels of a batch: features under the backbone, then labels under the
/// model version, so a photo with labels always has its features. Labels of photos deleted
/// meanwhile are skipped.
pub fn write_outputs(
    model: &ActiveModel,
    catalog: &dyn Catalog,
    features: &FeatureStore,
    ids: &[u64],
    outputs: &Outputs,
    k: usize,
) -> Result<Vec<(u64, Vec<Prediction>)>, crate::IngestError> {
    let info = model.info();
    let rows: Vec<(u64, Vec<Prediction>)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, model.predictions(outputs, i, k)))
        .collect();
    let feature_rows: Vec<(u64, &[f32])> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, outputs.features(i)))
        .collect();
    features.put_many(&info.backbone_version, &feature_rows)?;
    catalog.put_predictions_many(&model.version, &rows)?;
    Ok(rows)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
