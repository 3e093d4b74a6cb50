//! Ingest: validate an upload, preprocess it once, store it durably, then catalog it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ndpipe_catalog::{Catalog, CatalogError, GroundTruth, PhotoRecord};
use ndpipe_model::{Codec, PreprocessConfig, PreprocessError, Preprocessor, TensorBlob};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::StoreError;
use crate::index::PhotoMeta;
use crate::labeler::Labeler;
use crate::store::{NewPhoto, PhotoStore};

/// Longest accepted ground-truth label, in bytes.
pub const MAX_LABEL_BYTES: usize = 200;

/// Settings of the ingest path.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The decode/resize/crop transform and its limits.
    pub preprocess: PreprocessConfig,
    /// How stored tensors are compressed.
    pub tensor_codec: Codec,
    /// Photos decoded at the same time (CPU-bound work).
    pub max_parallel_decodes: usize,
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

/// Why an ingest or delete failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
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
    /// A worker task died.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What [`Ingestor::reconcile`] repaired.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReconcileReport {
    /// Photos in the store that the catalog lacked (a crash between the two writes).
    pub catalog_rows_added: u64,
    /// Catalog rows without a photo in the store (a crash during a delete).
    pub catalog_rows_removed: u64,
    /// Tensors recomputed for photos that had none.
    pub tensors_rebuilt: u64,
    /// Photos whose tensor could not be rebuilt: (id, reason).
    pub tensor_failures: Vec<(u64, String)>,
    /// Photos without labels from the active model, queued for labelling.
    pub queued_for_labels: u64,
}

/// The ingest pipeline shared by the HTTP handlers.
pub struct Ingestor {
    labeler: Option<Labeler>,
    store: Arc<PhotoStore>,
    catalog: Arc<dyn Catalog>,
    preprocessor: Preprocessor,
    codec: Codec,
    decode_slots: Semaphore,
}

impl Ingestor {
    /// Builds the pipeline over an open store and catalog.
    pub fn new(store: Arc<PhotoStore>, catalog: Arc<dyn Catalog>, config: IngestConfig) -> Self {
        Ingestor {
            labeler: None,
            store,
            catalog,
            preprocessor: Preprocessor::new(config.preprocess),
            codec: config.tensor_codec,
            decode_slots: Semaphore::new(config.max_parallel_decodes.max(1)),
        }
    }

    /// Labels every photo after its durable write with `labeler`'s model.
    pub fn with_labeler(mut self, labeler: Labeler) -> Self {
        self.labeler = Some(labeler);
        self
    }

    /// The online labeller, when a model is loaded.
    pub fn labeler(&self) -> Option<&Labeler> {
        self.labeler.as_ref()
    }

    /// The store.
    pub fn store(&self) -> &Arc<PhotoStore> {
        &self.store
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// Validates, preprocesses, stores and catalogs one photo. Nothing is written unless the
    /// photo decodes; the store write is durable before this returns.
    pub async fn ingest(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, IngestError> {
        if let Some(t) = &truth {
            validate_label(&t.label)?;
        }
        let prepared = {
            let _slot = self
                .decode_slots
                .acquire()
                .await
                .map_err(|e| IngestError::Internal(e.to_string()))?;
            let pre = self.preprocessor.clone();
            let codec = self.codec;
            tokio::task::spawn_blocking(move || prepare(&pre, codec, bytes, truth))
                .await
                .map_err(|e| IngestError::Internal(format!("preprocessing task failed: {e}")))??
        };
        let (prepared, tensor) = prepared;
        let meta = prepared.meta.clone();
        let id = self.store.put(prepared).await?;
        let record = record_of(id, &meta);
        let catalog = self.catalog.clone();
        let row = record.clone();
        tokio::task::spawn_blocking(move || catalog.upsert_photo(&row))
            .await
            .map_err(|e| IngestError::Internal(e.to_string()))??;
        if let Some(labeler) = &self.labeler {
            labeler.submit(id, tensor);
        }
        Ok(record)
    }

    /// Deletes a photo from the store, then from the catalog. Returns whether it existed.
    pub async fn delete(&self, id: u64) -> Result<bool, IngestError> {
        let existed = self.store.delete(id).await?;
        let catalog = self.catalog.clone();
        let store = self.store.clone();
        let in_catalog = tokio::task::spawn_blocking(move || {
            store.features().remove_photo(id)?;
            Ok::<_, IngestError>(catalog.delete_photo(id)?)
        })
        .await
        .map_err(|e| IngestError::Internal(e.to_string()))??;
        Ok(existed || in_catalog)
    }

    /// Brings the catalog in line with the store (which is the source of truth for which photos
    /// exist), recomputes missing tensors and queues photos the active model has not labelled.
    /// Run at start-up, after crash recovery.
    pub async fn reconcile(&self) -> Result<ReconcileReport, IngestError> {
        let mut report = ReconcileReport::default();
        let store = self.store.clone();
        let catalog = self.catalog.clone();
        let (added, removed) = tokio::task::spawn_blocking(move || sync_catalog(&store, &*catalog))
            .await
            .map_err(|e| IngestError::Internal(e.to_string()))??;
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
            let unlabelled = tokio::task::spawn_blocking(move || catalog.unlabelled(&version))
                .await
                .map_err(|e| IngestError::Internal(e.to_string()))??;
            report.queued_for_labels = unlabelled.len() as u64;
            labeler.enqueue_stored(unlabelled);
        }
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
        .await
        .map_err(|e| IngestError::Internal(e.to_string()))??;
        if let Some(blob) = blob {
            self.store.set_tensor(id, blob).await?;
        }
        Ok(())
    }
}

/// Checks a ground-truth label: non-empty, bounded, printable.
pub fn validate_label(label: &str) -> Result<(), IngestError> {
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
) -> Result<(NewPhoto, ndpipe_model::ImageTensor), IngestError> {
    let out = pre.run(&bytes)?;
    let tensor = encode_tensor(&out.tensor, codec)?;
    let meta = PhotoMeta {
        sha256: hex::encode(Sha256::digest(&bytes)),
        bytes: bytes.len() as u64,
        width: out.original_width,
        height: out.original_height,
        content_type: out.format.content_type().into(),
        created_ms: now_ms(),
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

fn encode_tensor(tensor: &ndpipe_model::ImageTensor, codec: Codec) -> Result<Vec<u8>, IngestError> {
    TensorBlob::encode(tensor, codec)
        .map_err(|e| IngestError::Internal(format!("tensor encoding: {e}")))
}

/// The catalog row for a stored photo.
pub fn record_of(id: u64, meta: &PhotoMeta) -> PhotoRecord {
    PhotoRecord {
        id,
        sha256: meta.sha256.clone(),
        bytes: meta.bytes,
        width: meta.width,
        height: meta.height,
        content_type: meta.content_type.clone(),
        created_ms: meta.created_ms,
        ground_truth: meta.ground_truth.clone(),
    }
}

fn sync_catalog(store: &PhotoStore, catalog: &dyn Catalog) -> Result<(u64, u64), IngestError> {
    let entries = store.entries()?;
    let live: std::collections::HashSet<u64> = entries.iter().map(|(id, _)| *id).collect();
    let mut added = 0;
    for (id, entry) in &entries {
        if catalog.photo(*id)?.is_none() {
            catalog.upsert_photo(&record_of(*id, &entry.meta))?;
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
