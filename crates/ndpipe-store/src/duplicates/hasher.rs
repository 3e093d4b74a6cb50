//! The hashing worker: gives every photo of this node a perceptual hash, off the upload's path
//! and out of its way.
//!
//! Ingest puts the id of each photo it catalogues in the [`HashQueue`]; the worker hashes the
//! queued photos a batch at a time once the uploads pause (or enough wait, or long enough). A
//! scan of the catalog for this node's photos without a hash, a window at a time, runs at
//! start (photos stored before hashing existed, or hashed by another algorithm) and every
//! [`RESCAN`] (photos that came in another way, such as a take-over; ids the queue had no room
//! for; tensors that could not be read). The stored tensors (the preprocessed 224x224 image)
//! are read and the hashes written at normal priority; decoding and hashing run on the
//! [`IdleHasher`]'s thread, under the idle scheduling policy, so that uploads keep their rate
//! (`docs/benchmarks.md`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndpipe_catalog::{CatalogError, DuplicateCatalog, PhotoId};
use ndpipe_util::sync::lock;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::idle_cpu::{IdleHasher, ThreadGone};
use super::phash::NearHash;
use crate::storage::PhotoStore;

/// Photos hashed per batch, and looked at per window of a scan.
const BATCH: usize = 256;
/// Ids the queue holds at most; past them an id waits for the next scan.
const QUEUE: usize = 1 << 16;
/// How often the worker scans the catalog for photos without a hash.
const RESCAN: Duration = Duration::from_secs(600);
/// How long ingest must queue nothing before the worker hashes what is queued: during a
/// stream of uploads it waits, so that its store reads, catalog writes and hashing stay out of
/// the uploads' way and come in batches (`docs/benchmarks.md`).
const SETTLE: Duration = Duration::from_millis(200);
/// Queued ids past which the worker hashes without waiting for a pause.
const HIGH: usize = 4096;
/// The longest the worker waits for a pause in the uploads.
const MAX_WAIT: Duration = Duration::from_secs(10);

/// Why hashing a batch failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HashError {
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A blocking task died.
    #[error("a hashing task died")]
    Task(#[from] tokio::task::JoinError),
    /// The hashing thread ended.
    #[error(transparent)]
    Thread(#[from] ThreadGone),
}

/// The photos ingest catalogued that wait for their hash, in arrival order.
#[derive(Default)]
pub(crate) struct HashQueue {
    ids: Mutex<VecDeque<PhotoId>>,
    wake: Notify,
    /// Ids pushed so far (whether the uploads paused).
    pushed: AtomicU64,
}

impl HashQueue {
    /// Queues photo `id` and wakes the worker; a full queue leaves the photo to the next scan.
    pub(crate) fn push(&self, id: PhotoId) {
        {
            let mut ids = lock(&self.ids);
            if ids.len() < QUEUE {
                ids.push_back(id);
            } else {
                debug!(
                    photo = id,
                    "hash queue full: the photo waits for the next scan"
                );
            }
        }
        self.pushed.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Ids waiting.
    fn len(&self) -> usize {
        lock(&self.ids).len()
    }

    /// Takes up to `max` queued ids.
    fn take(&self, max: usize) -> Vec<PhotoId> {
        let mut ids = lock(&self.ids);
        let n = ids.len().min(max);
        ids.drain(..n).collect()
    }
}

/// What hashing some photos did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Hashes written.
    pub(crate) hashed: usize,
    /// Photos whose tensor is missing or unreadable here (logged; tried again by a scan).
    pub(crate) skipped: usize,
}

impl Pass {
    fn add(&mut self, other: Pass) {
        self.hashed += other.hashed;
        self.skipped += other.skipped;
    }
}

/// The worker of one node.
pub(crate) struct HashWorker {
    store: Arc<PhotoStore>,
    catalog: Arc<dyn DuplicateCatalog>,
    algorithm: NearHash,
    queue: Arc<HashQueue>,
    hasher: IdleHasher,
}

impl HashWorker {
    /// A worker hashing `store`'s photos by `algorithm` into `catalog`, those of `queue` first.
    pub(crate) fn new(
        store: Arc<PhotoStore>,
        catalog: Arc<dyn DuplicateCatalog>,
        algorithm: NearHash,
        queue: Arc<HashQueue>,
    ) -> std::io::Result<Self> {
        Ok(HashWorker {
            store,
            catalog,
            algorithm,
            queue,
            hasher: IdleHasher::start(algorithm)?,
        })
    }

    /// Hashes until `stop` turns true: a scan at once and every [`RESCAN`], the queued photos
    /// once the uploads pause ([`HashWorker::settle`]).
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut next_scan = Instant::now();
        loop {
            if Instant::now() >= next_scan {
                let scanned = self.scan().await;
                self.log("scan", scanned);
                next_scan = Instant::now() + RESCAN;
            }
            let mut queued = Pass::default();
            let mut failed = None;
            loop {
                let ids = self.queue.take(BATCH);
                if ids.is_empty() {
                    break;
                }
                match self.hash(ids).await {
                    Ok(pass) => queued.add(pass),
                    Err(e) => failed = Some(e),
                }
            }
            self.log("queue", failed.map_or(Ok(queued), Err));
            let queued = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = self.queue.wake.notified() => true,
                () = tokio::time::sleep_until(next_scan) => false,
            };
            if queued && self.settle(&mut stop).await {
                return;
            }
        }
    }

    /// Waits until ingest has queued nothing for [`SETTLE`], [`HIGH`] ids wait, or
    /// [`MAX_WAIT`] has passed; true when `stop` turned true meanwhile.
    async fn settle(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let started = Instant::now();
        loop {
            let before = self.queue.pushed.load(Ordering::Relaxed);
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return true,
                () = tokio::time::sleep(SETTLE) => {}
            }
            let paused = self.queue.pushed.load(Ordering::Relaxed) == before;
            if paused || self.queue.len() >= HIGH || started.elapsed() >= MAX_WAIT {
                return false;
            }
        }
    }

    /// Logs what hashing `what` came to.
    fn log(&self, what: &str, result: Result<Pass, HashError>) {
        match result {
            Ok(pass) if pass.hashed + pass.skipped > 0 => {
                info!(
                    what,
                    hashed = pass.hashed,
                    skipped = pass.skipped,
                    algorithm = self.algorithm.name(),
                    "perceptual hashes written"
                );
            }
            Ok(_) => {}
            Err(e) => warn!(what, error = %e, "hashing photos failed; a later scan tries again"),
        }
    }

    /// Hashes every photo of this node that has no hash by the algorithm, a window at a time.
    pub(crate) async fn scan(&self) -> Result<Pass, HashError> {
        let mut total = Pass::default();
        let mut after = None;
        loop {
            let (catalog, algorithm) = (self.catalog.clone(), self.algorithm.name());
            let (ids, last) = tokio::task::spawn_blocking(move || {
                catalog.photos_without_near_hash(algorithm, after, BATCH)
            })
            .await??;
            let Some(last) = last else {
                return Ok(total);
            };
            if !ids.is_empty() {
                total.add(self.hash(ids).await?);
            }
            after = Some(last);
        }
    }

    /// Hashes photos `ids`: their stored tensors read here, decoded and hashed on the idle
    /// thread, the hashes written to the catalog.
    async fn hash(&self, ids: Vec<PhotoId>) -> Result<Pass, HashError> {
        let store = self.store.clone();
        let (blobs, mut skipped) =
            tokio::task::spawn_blocking(move || read_tensors(&store, ids)).await?;
        let hashed = self.hasher.hash(blobs).await?;
        for (id, reason) in &hashed.failed {
            warn!(photo = id, %reason, "cannot hash a photo");
        }
        skipped += hashed.failed.len();
        let (catalog, algorithm) = (self.catalog.clone(), self.algorithm.name());
        let written =
            tokio::task::spawn_blocking(move || catalog.put_near_hashes(algorithm, &hashed.rows))
                .await??;
        Ok(Pass {
            hashed: written,
            skipped,
        })
    }
}

/// The stored tensors of `ids`, and how many could not be read (each logged).
fn read_tensors(store: &PhotoStore, ids: Vec<PhotoId>) -> (Vec<(PhotoId, Vec<u8>)>, usize) {
    let mut blobs = Vec::with_capacity(ids.len());
    let mut skipped = 0;
    for id in ids {
        match store.tensor(id) {
            Ok(Some((_, blob))) => blobs.push((id, blob)),
            Ok(None) => {
                warn!(photo = id, "cannot hash a photo: no tensor on this node");
                skipped += 1;
            }
            Err(e) => {
                warn!(photo = id, error = %e, "cannot hash a photo");
                skipped += 1;
            }
        }
    }
    (blobs, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{IngestConfig, Ingestor};
    use crate::metrics::StoreMetrics;
    use crate::testing::{png, setup};
    use ndpipe_model::TensorBlob;

    /// An ingestor over `s`, and the ids of `n` photos it stored.
    async fn ingested(s: &crate::testing::Setup, n: u8) -> (Ingestor, Vec<PhotoId>) {
        let ingestor = Ingestor::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            Arc::new(StoreMetrics::default()),
            IngestConfig::default(),
        );
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(ingestor.ingest(png(i * 40), None).await.unwrap().id);
        }
        (ingestor, ids)
    }

    /// The phash of photo `id`'s stored tensor.
    fn hash_of(s: &crate::testing::Setup, id: PhotoId) -> u64 {
        let (_, blob) = s.store.tensor(id).unwrap().unwrap();
        let tensor = TensorBlob::decode(&blob).unwrap();
        NearHash::Phash.hasher().hash_tensor(&tensor).unwrap()
    }

    #[tokio::test]
    async fn photos_ingest_queues_are_hashed_from_their_stored_tensors() {
        let s = setup();
        let (ingestor, ids) = ingested(&s, 3).await;
        let worker = HashWorker::new(
            s.store.clone(),
            s.catalog.clone(),
            NearHash::Phash,
            ingestor.hash_queue(),
        )
        .unwrap();
        let (stop, stopped) = watch::channel(false);
        let running = tokio::spawn(worker.run(stopped));
        let more = ingestor.ingest(png(200), None).await.unwrap().id;
        let expected: Vec<(PhotoId, u64)> = ids
            .iter()
            .chain([&more])
            .map(|&id| (id, hash_of(&s, id)))
            .collect();
        // A hang guard: 600 looks of 10 ms.
        for _ in 0..600 {
            if s.catalog.near_hashes("phash", 0).unwrap().len() == expected.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(s.catalog.near_hashes("phash", 0).unwrap(), expected);
        stop.send(true).unwrap();
        running.await.unwrap();
    }

    #[tokio::test]
    async fn a_scan_hashes_the_photos_no_queue_named_and_only_those() {
        let s = setup();
        let (_ingestor, ids) = ingested(&s, 3).await;
        // Another queue than ingest's: the worker hears of none of the photos.
        let worker = HashWorker::new(
            s.store.clone(),
            s.catalog.clone(),
            NearHash::Phash,
            Arc::default(),
        )
        .unwrap();
        s.catalog.put_near_hashes("phash", &[(ids[1], 5)]).unwrap();
        let pass = worker.scan().await.unwrap();
        assert_eq!(
            pass,
            Pass {
                hashed: 2,
                skipped: 0
            }
        );
        let hashes = s.catalog.near_hashes("phash", 0).unwrap();
        assert_eq!(
            hashes,
            [
                (ids[0], hash_of(&s, ids[0])),
                (ids[1], 5),
                (ids[2], hash_of(&s, ids[2]))
            ],
            "a photo with a hash already keeps it"
        );
        assert_eq!(worker.scan().await.unwrap(), Pass::default());
    }

    #[test]
    fn a_full_queue_keeps_what_it_has() {
        let queue = HashQueue::default();
        for id in 0..(QUEUE as u64 + 5) {
            queue.push(id);
        }
        let first = queue.take(3);
        assert_eq!(first, [0, 1, 2]);
        let mut rest = 0;
        loop {
            let batch = queue.take(BATCH);
            if batch.is_empty() {
                break;
            }
            rest += batch.len();
        }
        assert_eq!(rest + 3, QUEUE, "ids past the bound wait for a scan");
    }
}
