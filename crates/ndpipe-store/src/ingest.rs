//! Ingest: validate an upload, preprocess it once, store it durably, then catalog it; delete;
//! and, at start, reconcile the catalog with the store.
//!
//! The ingestor owns the live-photo gauge (`ndpipe_store_photos`): it sets it at reconcile and
//! moves it with every photo it adds or deletes.

use std::sync::Arc;

use ndpipe_catalog::{CatalogError, GroundTruth, PhotoCatalog, PhotoMeta, PhotoRecord};
use ndpipe_model::{
    Codec, ImageTensor, PreprocessConfig, PreprocessError, Preprocessor, TensorBlob, TensorError,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::task::JoinError;
use tracing::{info, warn};

use crate::inference::labeler::Labeler;
use crate::metrics::StoreMetrics;
use crate::storage::{FeatureStore, NewPhoto, PhotoStore, StoreError};

/// Longest accepted ground-truth label, in bytes.
const MAX_LABEL_BYTES: usize = 200;

/// Settings of the ingest path.
#[derive(Debug, Clone)]
pub(crate) struct IngestConfig {
    /// The decode/resize/crop transform and its limits.
    pub(crate) preprocess: PreprocessConfig,
    /// How stored tensors are compressed.
    pub(crate) tensor_codec: Codec,
    /// Photos decoded at the same time (CPU-bound work).
    pub(crate) max_parallel_decodes: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            preprocess: PreprocessConfig::default(),
            tensor_codec: Codec::Zstd { level: 3 },
            max_parallel_decodes: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// Why an ingest, delete or reconcile failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum IngestError {
    /// The photo itself is unacceptable (client error).
    #[error(transparent)]
    Rejected(#[from] PreprocessError),
    /// The ground-truth label or split is unacceptable (client error).
    #[error("invalid ground truth: {0}")]
    InvalidLabel(String),
    /// The storage engine failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A tensor could not be encoded.
    #[error("tensor encoding: {0}")]
    Encode(#[source] TensorError),
    /// A worker task died.
    #[error("internal error: {0}")]
    Task(#[from] JoinError),
}

/// What [`Ingestor::reconcile`] repaired.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct ReconcileReport {
    /// Photos in the store that the catalog lacked (a crash between the two writes).
    pub(crate) catalog_rows_added: u64,
    /// Catalog rows without a photo in the store (a crash during a delete).
    pub(crate) catalog_rows_removed: u64,
    /// Tensors recomputed for photos that had none.
    pub(crate) tensors_rebuilt: u64,
    /// Photos whose tensor could not be rebuilt: (id, reason).
    pub(crate) tensor_failures: Vec<(u64, String)>,
    /// Photos without labels from the active model, queued for labelling.
    pub(crate) queued_for_labels: u64,
}

/// The ingest pipeline: what the HTTP API calls to add and delete photos.
pub(crate) struct Ingestor {
    labeler: Option<Labeler>,
    store: Arc<PhotoStore>,
    features: Arc<FeatureStore>,
    catalog: Arc<dyn PhotoCatalog>,
    metrics: Arc<StoreMetrics>,
    preprocessor: Preprocessor,
    codec: Codec,
    decode_slots: Semaphore,
}

impl Ingestor {
    /// Builds the pipeline over an open store, its feature store and the catalog.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        features: Arc<FeatureStore>,
        catalog: Arc<dyn PhotoCatalog>,
        metrics: Arc<StoreMetrics>,
        config: IngestConfig,
    ) -> Self {
        Ingestor {
            labeler: None,
            store,
            features,
            catalog,
            metrics,
            preprocessor: Preprocessor::new(config.preprocess),
            codec: config.tensor_codec,
            decode_slots: Semaphore::new(config.max_parallel_decodes.max(1)),
        }
    }

    /// Labels every photo after its durable write with `labeler`'s model.
    pub(crate) fn with_labeler(mut self, labeler: Labeler) -> Self {
        self.labeler = Some(labeler);
        self
    }

    /// Stops online labelling (see [`Labeler::stop`]); uploads are then stored unlabelled.
    pub(crate) fn stop_labeler(&self) {
        if let Some(labeler) = &self.labeler {
            labeler.stop();
        }
    }

    /// Validates, preprocesses, stores and catalogs one photo. Nothing is written unless the
    /// photo decodes; the store write is durable before this returns.
    pub(crate) async fn ingest(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, IngestError> {
        if let Some(t) = &truth {
            validate_label(&t.label)?;
        }
        let (prepared, tensor) = {
            let _slot = self
                .decode_slots
                .acquire()
                .await
                .expect("the decode semaphore is never closed; this is a bug");
            let pre = self.preprocessor.clone();
            let codec = self.codec;
            tokio::task::spawn_blocking(move || prepare(&pre, codec, bytes, truth)).await??
        };
        let meta = prepared.meta.clone();
        let id = self.store.put(prepared).await?;
        self.metrics.photos.inc();
        let record = PhotoRecord { id, meta };
        let catalog = self.catalog.clone();
        let row = record.clone();
        tokio::task::spawn_blocking(move || catalog.upsert_photo(&row)).await??;
        if let Some(labeler) = &self.labeler {
            labeler.submit(id, tensor);
        }
        Ok(record)
    }

    /// Deletes a photo from the store, then its features and its catalog row. Returns whether it
    /// existed in either.
    pub(crate) async fn delete(&self, id: u64) -> Result<bool, IngestError> {
        let existed = self.store.delete(id).await?;
        if existed {
            self.metrics.photos.dec();
        }
        let catalog = self.catalog.clone();
        let features = self.features.clone();
        let in_catalog = tokio::task::spawn_blocking(move || {
            features.remove_photo(id)?;
            Ok::<_, IngestError>(catalog.delete_photo(id)?)
        })
        .await??;
        Ok(existed || in_catalog)
    }

    /// Brings the catalog in line with the store (which is the source of truth for which photos
    /// exist), recomputes missing tensors, queues photos the active model has not labelled and
    /// sets the live-photo gauge. Run at start-up, after crash recovery.
    pub(crate) async fn reconcile(&self) -> Result<ReconcileReport, IngestError> {
        let mut report = ReconcileReport::default();
        let store = self.store.clone();
        let catalog = self.catalog.clone();
        let (added, removed) =
            tokio::task::spawn_blocking(move || sync_catalog(&store, &*catalog)).await??;
        report.catalog_rows_added = added;
        report.catalog_rows_removed = removed;
        for id in self.store.missing_tensors()? {
            match self.rebuild_tensor(id).await {
                Ok(()) => report.tensors_rebuilt += 1,
                Err(e) => {
                    warn!(photo = id, error = %e, "cannot rebuild tensor");
                    report.tensor_failures.push((id, e.to_string()));
                }
            }
        }
        if let Some(labeler) = &self.labeler {
            let catalog = self.catalog.clone();
            let version = labeler.model().get().version;
            let unlabelled =
                tokio::task::spawn_blocking(move || catalog.unlabelled(&version)).await??;
            report.queued_for_labels = unlabelled.len() as u64;
            labeler.enqueue_stored(unlabelled);
        }
        let photos = self.store.len()?;
        self.metrics
            .photos
            .set(i64::try_from(photos).unwrap_or(i64::MAX));
        if added + removed + report.tensors_rebuilt + report.queued_for_labels > 0 {
            info!(?report, "catalog and tensors reconciled with the store");
        }
        Ok(report)
    }

    async fn rebuild_tensor(&self, id: u64) -> Result<(), IngestError> {
        let store = self.store.clone();
        let pre = self.preprocessor.clone();
        let codec = self.codec;
        let blob = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, IngestError> {
            let Some((_, original)) = store.original(id)? else {
                return Ok(None);
            };
            let out = pre.run(&original)?;
            Ok(Some(encode_tensor(&out.tensor, codec)?))
        })
        .await??;
        if let Some(blob) = blob {
            self.store.set_tensor(id, blob).await?;
        }
        Ok(())
    }
}

/// Checks a ground-truth label: non-empty, bounded, printable.
pub(crate) fn validate_label(label: &str) -> Result<(), IngestError> {
    if label.trim().is_empty() {
        return Err(IngestError::InvalidLabel("label is empty".into()));
    }
    if label.len() > MAX_LABEL_BYTES {
        return Err(IngestError::InvalidLabel(format!(
            "label is {} bytes, the limit is {MAX_LABEL_BYTES}",
            label.len()
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(IngestError::InvalidLabel(
            "label contains control characters".into(),
        ));
    }
    Ok(())
}

fn prepare(
    pre: &Preprocessor,
    codec: Codec,
    bytes: bytes::Bytes,
    truth: Option<GroundTruth>,
) -> Result<(NewPhoto, ImageTensor), IngestError> {
    let out = pre.run(&bytes)?;
    let tensor = encode_tensor(&out.tensor, codec)?;
    let meta = PhotoMeta {
        sha256: hex::encode(Sha256::digest(&bytes)),
        bytes: bytes.len() as u64,
        width: out.original_width,
        height: out.original_height,
        content_type: out.format.content_type().into(),
        created_ms: ndpipe_util::time::now_ms(),
        ground_truth: truth,
    };
    Ok((
        NewPhoto {
            meta,
            original: bytes.to_vec(),
            tensor,
        },
        out.tensor,
    ))
}

fn encode_tensor(tensor: &ImageTensor, codec: Codec) -> Result<Vec<u8>, IngestError> {
    TensorBlob::encode(tensor, codec).map_err(IngestError::Encode)
}

fn sync_catalog(store: &PhotoStore, catalog: &dyn PhotoCatalog) -> Result<(u64, u64), IngestError> {
    let entries = store.entries()?;
    let live: std::collections::HashSet<u64> = entries.iter().map(|(id, _)| *id).collect();
    let mut added = 0;
    for (id, entry) in &entries {
        if catalog.photo(*id)?.is_none() {
            catalog.upsert_photo(&PhotoRecord {
                id: *id,
                meta: entry.meta.clone(),
            })?;
            added += 1;
        }
    }
    let mut removed = 0;
    let mut after = None;
    loop {
        let page = catalog.list_photos(after, 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for row in page.iter().filter(|r| !live.contains(&r.id)) {
            catalog.delete_photo(row.id)?;
            removed += 1;
        }
    }
    Ok((added, removed))
}
