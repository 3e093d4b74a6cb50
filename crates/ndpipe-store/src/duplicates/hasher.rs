//! The hashing worker: gives every photo of this node a perceptual hash, off the upload's path.
//!
//! It reads the stored tensors (the preprocessed 224x224 image, decoded from its compressed
//! blob) of this node's photos that have no hash by the configured algorithm, a batch at a
//! time, and writes the hashes to the catalog. It runs at start (the backfill of photos stored
//! before hashing existed, or hashed by another algorithm), whenever ingest says a photo was
//! catalogued, and every [`RESCAN`] for what came in another way (reconcile, a take-over).

use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::{CatalogError, DuplicateCatalog, PhotoId};
use ndpipe_model::TensorBlob;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use super::phash::NearHash;
use crate::storage::PhotoStore;

/// Photos hashed per catalog read and write.
const BATCH: usize = 256;
/// How often the worker looks for photos without a hash when nothing woke it.
const RESCAN: Duration = Duration::from_secs(60);

/// Why a hashing pass stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HashError {
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The hashing task died.
    #[error("the hashing task died: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What one pass over the photos without a hash did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Hashes written.
    pub(crate) hashed: usize,
    /// Photos whose tensor is missing or unreadable here (logged; tried again next pass).
    pub(crate) skipped: usize,
}

/// The worker of one node.
pub(crate) struct HashWorker {
    store: Arc<PhotoStore>,
    catalog: Arc<dyn DuplicateCatalog>,
    algorithm: NearHash,
    wake: Arc<Notify>,
}

impl HashWorker {
    /// A worker hashing `store`'s photos by `algorithm` into `catalog`, woken by `wake`.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        catalog: Arc<dyn DuplicateCatalog>,
        algorithm: NearHash,
        wake: Arc<Notify>,
    ) -> Self {
        HashWorker {
            store,
            catalog,
            algorithm,
            wake,
        }
    }

    /// Hashes until `stop` turns true: a pass at once, then one whenever woken or every
    /// [`RESCAN`].
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            match self.pass().await {
                Ok(pass) if pass.hashed + pass.skipped > 0 => {
                    info!(hashed = pass.hashed, skipped = pass.skipped, algorithm = self.algorithm.name(), "perceptual hashes written");
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "hashing photos failed; trying again"),
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(RESCAN) => {}
            }
        }
    }

    /// Hashes every photo of this node that has no hash by the algorithm.
    pub(crate) async fn pass(&self) -> Result<Pass, HashError> {
        let mut total = Pass::default();
        let mut after = None;
        loop {
            let (store, catalog, algorithm) =
                (self.store.clone(), self.catalog.clone(), self.algorithm);
            let batch = tokio::task::spawn_blocking(move || {
                hash_batch(&store, &*catalog, algorithm, after)
            })
            .await??;
            let Some((last, pass)) = batch else {
                return Ok(total);
            };
            after = Some(last);
            total.hashed += pass.hashed;
            total.skipped += pass.skipped;
        }
    }
}

/// Hashes the next batch after `after`; the last id it read and what it did, or `None` when no
/// photo is left.
fn hash_batch(
    store: &PhotoStore,
    catalog: &dyn DuplicateCatalog,
    algorithm: NearHash,
    after: Option<PhotoId>,
) -> Result<Option<(PhotoId, Pass)>, CatalogError> {
    let ids = catalog.photos_without_near_hash(algorithm.name(), after, BATCH)?;
    let Some(&last) = ids.last() else {
        return Ok(None);
    };
    let hasher = algorithm.hasher();
    let mut rows = Vec::with_capacity(ids.len());
    let mut skipped = 0;
    for id in ids {
        let hash = match store.tensor(id) {
            Ok(Some((_, blob))) => TensorBlob::decode(&blob)
                .map_err(|e| e.to_string())
                .and_then(|t| hasher.hash_tensor(&t).ok_or_else(|| "not an RGB tensor".into())),
            Ok(None) => Err("no tensor on this node".into()),
            Err(e) => Err(e.to_string()),
        };
        match hash {
            Ok(hash) => rows.push((id, hash)),
            Err(reason) => {
                warn!(photo = id, %reason, "cannot hash a photo");
                skipped += 1;
            }
        }
    }
    let hashed = catalog.put_near_hashes(algorithm.name(), &rows)?;
    Ok(Some((last, Pass { hashed, skipped })))
}
