//! Ingest: validate an upload, preprocess it once, store it durably, then catalog it; delete;
//! and, at start, reconcile the catalog with the store.
//!
//! The store is the truth about which photos exist, and the catalog follows it. An upload whose
//! catalog row cannot be written is taken out of the store again. A delete takes the photo out
//! of the store first, then its catalog row and features; while those fail (a full disk) the id
//! stays in a list of unfinished deletes that every later delete and upload retries, and that
//! the API hides, so the store and the catalog never disagree. Reconcile at start fixes what a
//! crash leaves. The ingestor owns the live-photo gauge (`ndpipe_store_photos`): it sets it at
//! reconcile and moves it with every photo it adds or deletes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use ndpipe_catalog::{Catalog, CatalogError, GroundTruth, PhotoCatalog, PhotoMeta, PhotoRecord};
use ndpipe_model::{
    Codec, ImageTensor, PreprocessConfig, PreprocessError, Preprocessor, TensorBlob, TensorError,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::task::JoinError;
use tracing::{info, warn};

use ndpipe_util::sync::lock;

use crate::duplicates::ExactDuplicates;
use crate::duplicates::exact::{ExactCheck, Uploaded};
use crate::duplicates::hasher::HashQueue;
use crate::inference::labeler::{Labeler, Labelled, file_labels};
use crate::metrics::StoreMetrics;
use crate::storage::{FeatureStore, NewPhoto, PhotoStore, StoreError};

/// The default decode memory budget: 1 GiB.
pub(crate) const DEFAULT_DECODE_BUDGET: u64 = 1 << 30;

/// `bytes` in whole MiB, at least 1 (a semaphore's permits).
fn mib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1 << 20).max(1)).unwrap_or(u32::MAX >> 3)
}

/// Longest accepted ground-truth label, in bytes.
const MAX_LABEL_BYTES: usize = 200;

/// A photo as the store keeps it, for copying to other nodes.
#[derive(Debug, Clone)]
pub(crate) struct StoredPhoto {
    /// Its metadata.
    pub(crate) meta: PhotoMeta,
    /// The original bytes.
    pub(crate) original: Vec<u8>,
    /// The encoded tensor.
    pub(crate) tensor: Vec<u8>,
    /// Its features as stored, with the backbone version they were computed with (`None`:
    /// none yet, e.g. no model loaded).
    pub(crate) features: Option<(String, Vec<u8>)>,
}

/// Where an upload's labels stand once its copies may be sent.
enum Labelling {
    /// Labelled first: the labels to file after the catalog row.
    Done(Labelled),
    /// Labelled after the catalog row, from this tensor or (`None`) from the stored one.
    Later(Option<ImageTensor>),
}

/// Settings of the ingest path.
#[derive(Debug, Clone)]
pub(crate) struct IngestConfig {
    /// The decode/resize/crop transform and its limits.
    pub(crate) preprocess: PreprocessConfig,
    /// How stored tensors are compressed.
    pub(crate) tensor_codec: Codec,
    /// Photos decoded at the same time (CPU-bound work).
    pub(crate) max_parallel_decodes: usize,
    /// Bytes that decodes in flight may take together (see [`Preprocessor::decode_cost`]); a
    /// photo larger than the whole budget decodes alone.
    pub(crate) decode_budget_bytes: u64,
    /// What an upload of bytes the catalog already has does.
    pub(crate) exact_duplicates: ExactDuplicates,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            preprocess: PreprocessConfig::default(),
            tensor_codec: Codec::Zstd { level: 3 },
            max_parallel_decodes: std::thread::available_parallelism().map_or(2, |n| n.get()),
            decode_budget_bytes: DEFAULT_DECODE_BUDGET,
            exact_duplicates: ExactDuplicates::default(),
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
    /// A copy of the photo could not be made durable on another node.
    #[error("copying the photo failed: {0}")]
    Copy(String),
}

/// What [`Ingestor::reconcile`] repaired.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct ReconcileReport {
    /// Photos in the store that the catalog lacked (a crash between the two writes).
    pub(crate) catalog_rows_added: u64,
    /// Catalog rows without a photo in the store (a crash during a delete), removed; those
    /// that cannot be removed yet are hidden and retried like an unfinished delete.
    pub(crate) catalog_rows_removed: u64,
    /// Tensors recomputed for photos that had none.
    pub(crate) tensors_rebuilt: u64,
    /// Photos whose tensor could not be rebuilt: (id, reason).
    pub(crate) tensor_failures: Vec<(u64, String)>,
    /// Photos without labels from the active model, queued for labelling.
    pub(crate) queued_for_labels: u64,
    /// Why the catalog was not reconciled, when the disk was too full to write it (the next
    /// start tries again).
    pub(crate) catalog_not_reconciled: Option<String>,
}

/// The ingest pipeline: what the HTTP API calls to add and delete photos.
pub(crate) struct Ingestor {
    labeler: Option<Labeler>,
    store: Arc<PhotoStore>,
    features: Arc<FeatureStore>,
    catalog: Arc<dyn Catalog>,
    metrics: Arc<StoreMetrics>,
    preprocessor: Preprocessor,
    codec: Codec,
    decode_slots: Semaphore,
    /// The decode memory budget, in MiB permits.
    decode_budget: Semaphore,
    decode_budget_mib: u32,
    /// Photos gone from the store whose catalog row or features are not removed yet.
    unfinished_deletes: Mutex<BTreeSet<u64>>,
    /// The exact-duplicate check of [`Ingestor::upload`], with the configured mode.
    exact: ExactCheck,
    /// Every photo catalogued here, for the perceptual-hash worker.
    hash_queue: Arc<HashQueue>,
}

impl Ingestor {
    /// Builds the pipeline over an open store, its feature store and the catalog.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        features: Arc<FeatureStore>,
        catalog: Arc<dyn Catalog>,
        metrics: Arc<StoreMetrics>,
        config: IngestConfig,
    ) -> Self {
        Ingestor {
            labeler: None,
            exact: ExactCheck::new(config.exact_duplicates, catalog.clone()),
            hash_queue: Arc::default(),
            store,
            features,
            catalog,
            metrics,
            preprocessor: Preprocessor::new(config.preprocess),
            codec: config.tensor_codec,
            decode_slots: Semaphore::new(config.max_parallel_decodes.max(1)),
            decode_budget: Semaphore::new(mib(config.decode_budget_bytes) as usize),
            decode_budget_mib: mib(config.decode_budget_bytes),
            unfinished_deletes: Mutex::default(),
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

    /// An upload: [`Ingestor::ingest`] behind the exact-duplicate check (bytes the catalog
    /// already has are answered as `mode` says).
    pub(crate) async fn upload(
        &self,
        mode: ExactDuplicates,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<Uploaded, IngestError> {
        self.exact
            .upload(mode, bytes, truth, |b, t| self.ingest(b, t))
            .await
    }

    /// The exact-duplicate check of this node's uploads.
    pub(crate) fn exact(&self) -> &ExactCheck {
        &self.exact
    }

    /// The photos catalogued here that wait for their perceptual hash.
    pub(crate) fn hash_queue(&self) -> Arc<HashQueue> {
        self.hash_queue.clone()
    }

    /// Validates, preprocesses, stores and catalogs one photo. Nothing is written unless the
    /// photo decodes and the free-space reserve allows it; the store write is durable before
    /// this returns. It is labelled after the catalog row.
    pub(crate) async fn ingest(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, IngestError> {
        self.ingest_with(bytes, truth, false, |_, _| async { Ok(()) })
            .await
    }

    /// [`Ingestor::ingest`], running `copy` with the new id and the stored photo between the
    /// durable write and the catalog row (replication sends the photo's copies there). The
    /// photo is labelled before `copy`, so that the stored photo carries its features (when a
    /// model is loaded and the labelling queue has room). When `copy` fails, the photo is taken
    /// out of the store again and its error is returned.
    pub(crate) async fn ingest_then<F, Fut>(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
        copy: F,
    ) -> Result<PhotoRecord, IngestError>
    where
        F: FnOnce(u64, StoredPhoto) -> Fut,
        Fut: std::future::Future<Output = Result<(), IngestError>>,
    {
        self.ingest_with(bytes, truth, true, copy).await
    }

    async fn ingest_with<F, Fut>(
        &self,
        bytes: bytes::Bytes,
        truth: Option<GroundTruth>,
        label_first: bool,
        copy: F,
    ) -> Result<PhotoRecord, IngestError>
    where
        F: FnOnce(u64, StoredPhoto) -> Fut,
        Fut: std::future::Future<Output = Result<(), IngestError>>,
    {
        if let Some(t) = &truth {
            validate_label(&t.label)?;
        }
        self.store.check_space(bytes.len() as u64)?;
        self.finish_deletes().await;
        let cost = self.preprocessor.decode_cost(&bytes)?;
        let (prepared, tensor) = {
            let _memory = self
                .decode_budget
                .acquire_many(mib(cost).min(self.decode_budget_mib))
                .await
                .expect("the decode budget is never closed; this is a bug");
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
        let mut stored = StoredPhoto {
            meta: meta.clone(),
            original: prepared.original.clone(),
            tensor: prepared.tensor.clone(),
            features: None,
        };
        let id = self.store.put(prepared).await?;
        let labelling = match &self.labeler {
            Some(labeler) if label_first => match labeler.label_first(id, tensor) {
                Ok(rx) => match rx.await {
                    Ok(done) => Labelling::Done(done),
                    Err(_) => Labelling::Later(None),
                },
                Err(tensor) => Labelling::Later(Some(tensor)),
            },
            _ => Labelling::Later(Some(tensor)),
        };
        if let Labelling::Done(done) = &labelling {
            stored.features = Some((done.backbone.clone(), done.features.clone()));
        }
        if let Err(e) = copy(id, stored).await {
            self.take_back(id).await;
            return Err(e);
        }
        let record = PhotoRecord::new(id, meta);
        let catalog = self.catalog.clone();
        let row = record.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || catalog.upsert_photo(&row)).await? {
            // Undo the store write, so that store and catalog agree; if even that fails, the
            // next start catalogs the photo.
            self.take_back(id).await;
            return Err(self.catalog_failure(e.into()));
        }
        self.metrics.photos.inc();
        self.hash_queue.push(id);
        self.file_labels(id, labelling).await;
        Ok(record)
    }

    /// Files the labels of a photo labelled first, or queues it for labelling.
    async fn file_labels(&self, id: u64, labelling: Labelling) {
        let Some(labeler) = &self.labeler else { return };
        match labelling {
            Labelling::Done(done) => {
                let catalog = self.catalog.clone();
                let filed = tokio::task::spawn_blocking(move || {
                    file_labels(&*catalog, vec![(id, done.labels)])
                })
                .await;
                if !matches!(filed, Ok(Ok(_))) {
                    warn!(
                        photo = id,
                        "the labels of a new photo could not be filed; it is labelled again"
                    );
                    labeler.enqueue_stored([id]);
                }
            }
            Labelling::Later(Some(tensor)) => labeler.submit(id, tensor),
            Labelling::Later(None) => labeler.enqueue_stored([id]),
        }
    }

    /// Takes a photo that will not be catalogued out of the store again.
    async fn take_back(&self, id: u64) {
        if let Err(undo) = self.store.delete(id).await {
            warn!(photo = id, error = %undo, "cannot take back a photo that was not catalogued");
        }
        let features = self.features.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || features.remove_photo(id)).await {
            warn!(photo = id, error = %e, "cannot remove the features of a photo taken back");
        }
    }

    /// Deletes a photo from the store, then its catalog row and its features. Returns whether
    /// it existed in either. When the store refuses, nothing is deleted; once the store has
    /// deleted, the delete has happened, and a catalog row that cannot be removed yet is
    /// removed later (see the module docs).
    pub(crate) async fn delete(&self, id: u64) -> Result<bool, IngestError> {
        self.finish_deletes().await;
        let existed = match self.store.delete(id).await {
            Ok(existed) => existed,
            // The store rolls a failed delete back, unless its commit landed after all.
            Err(e) => match self.store.contains(id) {
                Ok(false) => false,
                _ => return Err(e.into()),
            },
        };
        if existed {
            self.metrics.photos.dec();
        }
        lock(&self.unfinished_deletes).insert(id);
        match self.finish_delete(id).await {
            Ok(in_catalog) => Ok(existed || in_catalog),
            // The photo is gone (the store is the truth); its row goes later.
            Err(e) if existed => {
                warn!(photo = id, error = %e, "the catalog row of a deleted photo stays until it can be removed");
                Ok(true)
            }
            Err(e) => Err(self.catalog_failure(e)),
        }
    }

    /// Removes this node's copy of photo `id` (store and features) and keeps its catalog row:
    /// the photo stays on its other holders (rebalancing moved it). Whether the store had it.
    pub(crate) async fn release(&self, id: u64) -> Result<bool, IngestError> {
        let existed = self.store.delete(id).await?;
        if existed {
            self.metrics.photos.dec();
        }
        let features = self.features.clone();
        tokio::task::spawn_blocking(move || features.remove_photo(id)).await??;
        Ok(existed)
    }

    /// Whether `id` is gone from the store while its catalog row may still be there: the API
    /// answers as if the row were gone.
    pub(crate) fn is_deleted(&self, id: u64) -> bool {
        lock(&self.unfinished_deletes).contains(&id)
    }

    /// How many deletes are unfinished.
    pub(crate) fn unfinished_deletes(&self) -> usize {
        lock(&self.unfinished_deletes).len()
    }

    /// Retries the unfinished deletes.
    async fn finish_deletes(&self) {
        let ids: Vec<u64> = lock(&self.unfinished_deletes).iter().copied().collect();
        for id in ids {
            if let Err(e) = self.finish_delete(id).await {
                warn!(photo = id, error = %e, "deleting a photo's catalog row failed again");
                return;
            }
        }
    }

    /// Removes the catalog row, then the features, of a photo gone from the store; returns
    /// whether the row existed. The id leaves the unfinished deletes once both are done.
    async fn finish_delete(&self, id: u64) -> Result<bool, IngestError> {
        let catalog = self.catalog.clone();
        let in_catalog = tokio::task::spawn_blocking(move || catalog.delete_photo(id)).await??;
        let features = self.features.clone();
        match tokio::task::spawn_blocking(move || features.remove_photo(id)).await {
            Ok(Ok(())) => {
                lock(&self.unfinished_deletes).remove(&id);
            }
            Ok(Err(e)) => {
                warn!(photo = id, error = %e, "removing a deleted photo's features failed; will retry")
            }
            Err(e) => {
                warn!(photo = id, error = %e, "removing a deleted photo's features failed; will retry")
            }
        }
        Ok(in_catalog)
    }

    /// A catalog failure as the client should see it: `InsufficientStorage` when the disk is
    /// below the reserve (the catalog could not grow), else the catalog's error.
    fn catalog_failure(&self, e: IngestError) -> IngestError {
        match e {
            IngestError::Catalog(e) if self.store.free_space().is_ok_and(|(_, low)| low) => {
                IngestError::Store(StoreError::InsufficientStorage {
                    reason: format!("the catalog could not be written: {e}"),
                })
            }
            other => other,
        }
    }

    /// Brings the catalog in line with the store (which is the source of truth for which photos
    /// exist), recomputes missing tensors, queues photos the active model has not labelled and
    /// sets the live-photo gauge. Run at start-up, after crash recovery.
    pub(crate) async fn reconcile(&self) -> Result<ReconcileReport, IngestError> {
        let mut report = ReconcileReport::default();
        let (store, catalog) = (self.store.clone(), self.catalog.clone());
        let stale = tokio::task::spawn_blocking(move || stale_rows(&store, &*catalog)).await??;
        lock(&self.unfinished_deletes).extend(&stale);
        self.finish_deletes().await;
        report.catalog_rows_removed =
            stale.iter().filter(|id| !self.is_deleted(**id)).count() as u64;
        let (store, catalog) = (self.store.clone(), self.catalog.clone());
        match tokio::task::spawn_blocking(move || add_missing_rows(&store, &*catalog)).await? {
            Ok(added) => report.catalog_rows_added = added,
            Err(e) if self.store.free_space().is_ok_and(|(_, low)| low) => {
                warn!(error = %e, "the disk is full: the catalog is not reconciled until a start with free space");
                report.catalog_not_reconciled = Some(e.to_string());
            }
            Err(e) => return Err(e),
        }
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
            let version = labeler.model().get().general_version().to_string();
            let unlabelled =
                tokio::task::spawn_blocking(move || catalog.unlabelled(&version)).await??;
            report.queued_for_labels = unlabelled.len() as u64;
            labeler.enqueue_stored(unlabelled);
        }
        let photos = self.store.len()?;
        self.metrics
            .photos
            .set(i64::try_from(photos).unwrap_or(i64::MAX));
        if report.catalog_rows_added
            + report.catalog_rows_removed
            + report.tensors_rebuilt
            + report.queued_for_labels
            > 0
        {
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

/// How many ids reconcile asks the catalog about at once.
const RECONCILE_PAGE: usize = 1000;

/// Adds a catalog row for every photo of the store that has none; returns how many. A photo
/// that another node's catalog row holds is a copy of that node's (replication), not a row to add.
/// The catalog is asked a page of ids at a time, so a start costs one query per page, not per photo.
fn add_missing_rows(store: &PhotoStore, catalog: &dyn PhotoCatalog) -> Result<u64, IngestError> {
    let mut added = 0;
    let entries = store.entries()?;
    for page in entries.chunks(RECONCILE_PAGE) {
        let ids: Vec<u64> = page.iter().map(|(id, _)| *id).collect();
        let existing = catalog.existing_photo_ids(&ids)?;
        for (id, entry) in page.iter().filter(|(id, _)| !existing.contains(id)) {
            match catalog.upsert_photo(&PhotoRecord::new(*id, entry.meta.clone())) {
                Ok(()) => added += 1,
                // Another node stored it since the page was read.
                Err(CatalogError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(added)
}

/// The ids of catalog rows without a photo in the store (a crash during a delete).
fn stale_rows(store: &PhotoStore, catalog: &dyn PhotoCatalog) -> Result<Vec<u64>, IngestError> {
    let live: std::collections::HashSet<u64> =
        store.entries()?.into_iter().map(|(id, _)| id).collect();
    let mut stale = Vec::new();
    let mut after = None;
    loop {
        let page = catalog.list_photos(after, RECONCILE_PAGE)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        stale.extend(page.iter().map(|r| r.id).filter(|id| !live.contains(id)));
    }
    Ok(stale)
}

#[cfg(test)]
mod tests;
