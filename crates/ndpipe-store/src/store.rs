//! The photo store: volumes + index, one writer thread with group commit, concurrent readers.
//!
//! Every write goes through the writer thread, which appends the records of a batch of requests,
//! syncs the volumes once, commits the index once and only then answers each request, so an
//! acknowledged write is durable and a crash loses only unacknowledged work.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::StoreError;
use crate::features::FeatureStore;
use crate::index::{Change, Index, PhotoEntry, PhotoMeta, watermark_key};
use crate::volume::format::RecordKind;
use crate::volume::{Location, VolumeSet};

const PHOTO_SET: u8 = 1;
const TENSOR_SET: u8 = 2;
const PHOTOS_DIR: &str = "photos";
const TENSORS_DIR: &str = "tensors";
/// Most requests folded into one group commit.
const MAX_BATCH: usize = 128;

/// Settings of the storage engine.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// A volume is sealed once it would grow past this many bytes.
    pub max_volume_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_volume_bytes: 1 << 30,
        }
    }
}

/// What opening the store found and repaired.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RecoveryReport {
    /// Whether the index was missing or unreadable and was rebuilt from the volumes.
    pub index_rebuilt: bool,
    /// Records replayed from the volumes into the index.
    pub replayed_records: u64,
    /// Torn tails cut: (volume path, offset cut at, reason).
    pub truncated: Vec<(String, u64, String)>,
    /// Sealed volumes with unreadable records: (volume path, offset, reason). Records after the
    /// offset are unreachable until repaired.
    pub damaged: Vec<(String, u64, String)>,
    /// Photos in the index, after recovery.
    pub photos: u64,
}

/// What a compaction did.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionReport {
    /// Disk bytes of all volumes before.
    pub bytes_before: u64,
    /// Disk bytes of all volumes after.
    pub bytes_after: u64,
    /// Live records copied.
    pub records_moved: u64,
    /// Volumes removed.
    pub volumes_removed: u64,
    /// Seconds taken.
    pub seconds: f64,
}

/// A photo to store: metadata, original bytes and the encoded tensor.
#[derive(Debug)]
pub struct NewPhoto {
    /// Metadata, kept in the record so the index and catalog can be rebuilt.
    pub meta: PhotoMeta,
    /// The original file.
    pub original: Vec<u8>,
    /// The encoded preprocessed tensor (`ndpipe_model::TensorBlob`).
    pub tensor: Vec<u8>,
}

enum Command {
    Put(NewPhoto, oneshot::Sender<Result<u64, StoreError>>),
    Delete(u64, oneshot::Sender<Result<bool, StoreError>>),
    SetTensor(u64, Vec<u8>, oneshot::Sender<Result<bool, StoreError>>),
    Compact(oneshot::Sender<Result<CompactionReport, StoreError>>),
}

struct Shared {
    photos: VolumeSet,
    tensors: VolumeSet,
    index: Index,
    features: Arc<FeatureStore>,
}

/// The durable photo store of one PipeStore.
pub struct PhotoStore {
    shared: Arc<Shared>,
    commands: Option<mpsc::Sender<Command>>,
    writer: Option<JoinHandle<()>>,
    root: PathBuf,
}

impl PhotoStore {
    /// Opens the store in `root`, recovering from a crash if needed: torn tails are cut, records
    /// written after the last index commit are replayed, and a missing or unreadable index is
    /// rebuilt from the volumes.
    pub fn open(root: &Path, config: &StoreConfig) -> Result<(Self, RecoveryReport), StoreError> {
        std::fs::create_dir_all(root).map_err(StoreError::io("create store directory", root))?;
        let photos = VolumeSet::open(&root.join(PHOTOS_DIR), PHOTO_SET, config.max_volume_bytes)?;
        let tensors =
            VolumeSet::open(&root.join(TENSORS_DIR), TENSOR_SET, config.max_volume_bytes)?;
        let mut report = RecoveryReport::default();
        let index_path = root.join("index.redb");
        let index = match Index::open(&index_path) {
            Ok(index) => index,
            Err(e) => {
                let aside = root.join(format!("index.redb.broken-{}", now_ms()));
                warn!(error = %e, moved_to = %aside.display(), "index unreadable; rebuilding from volumes");
                std::fs::rename(&index_path, &aside)
                    .map_err(StoreError::io("move broken index", &index_path))?;
                report.index_rebuilt = true;
                Index::open(&index_path)?
            }
        };
        if !index_path.exists() || index.next_id()?.is_none() {
            report.index_rebuilt = true;
        }
        let features = Arc::new(FeatureStore::open(&root.join("features.redb"))?);
        let shared = Shared {
            photos,
            tensors,
            index,
            features,
        };
        let next_id = recover(&shared, &mut report)?;
        report.photos = shared.index.len()?;
        info!(
            photos = report.photos,
            next_id,
            replayed = report.replayed_records,
            "store opened"
        );
        let shared = Arc::new(shared);
        let (tx, rx) = mpsc::channel(1024);
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("ndpipe-store-writer".into())
            .spawn(move || {
                Writer {
                    shared: writer_shared,
                    next_id,
                }
                .run(rx)
            })
            .map_err(StoreError::io("start writer thread", root))?;
        Ok((
            PhotoStore {
                shared,
                commands: Some(tx),
                writer: Some(writer),
                root: root.to_path_buf(),
            },
            report,
        ))
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stores a photo durably and returns its new id.
    pub async fn put(&self, photo: NewPhoto) -> Result<u64, StoreError> {
        self.request(|reply| Command::Put(photo, reply)).await
    }

    /// Deletes a photo (writes a tombstone). Returns whether it existed.
    pub async fn delete(&self, id: u64) -> Result<bool, StoreError> {
        self.request(|reply| Command::Delete(id, reply)).await
    }

    /// Stores (or replaces) the tensor of an existing photo. Returns false if the photo is gone.
    pub async fn set_tensor(&self, id: u64, tensor: Vec<u8>) -> Result<bool, StoreError> {
        self.request(|reply| Command::SetTensor(id, tensor, reply))
            .await
    }

    /// Rewrites all volumes with only live records and removes the old ones. Writes wait while
    /// it runs; reads go on.
    pub async fn compact(&self) -> Result<CompactionReport, StoreError> {
        self.request(Command::Compact).await
    }

    /// Feature vectors of the stored photos, per backbone version.
    pub fn features(&self) -> &FeatureStore {
        &self.shared.features
    }

    /// The feature store, shareable with worker threads.
    pub fn features_arc(&self) -> &Arc<FeatureStore> {
        &self.shared.features
    }

    /// The index entry of `id`.
    pub fn entry(&self, id: u64) -> Result<Option<PhotoEntry>, StoreError> {
        self.shared.index.get(id)
    }

    /// Reads a photo's original bytes, verified against their checksum.
    pub fn original(&self, id: u64) -> Result<Option<(PhotoEntry, Vec<u8>)>, StoreError> {
        self.read_verified(id, |e| Some(e.photo), &self.shared.photos)
    }

    /// Reads a photo's encoded tensor, verified against its checksum. `None` if the photo or its
    /// tensor does not exist.
    pub fn tensor(&self, id: u64) -> Result<Option<(PhotoEntry, Vec<u8>)>, StoreError> {
        self.read_verified(id, |e| e.tensor, &self.shared.tensors)
    }

    /// Every live photo, in id order.
    pub fn entries(&self) -> Result<Vec<(u64, PhotoEntry)>, StoreError> {
        self.shared.index.entries()
    }

    /// Number of live photos.
    pub fn len(&self) -> Result<u64, StoreError> {
        self.shared.index.len()
    }

    /// Whether the store holds no photo.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        self.shared.index.is_empty()
    }

    /// Bytes used by all volume files.
    pub fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(self.shared.photos.disk_bytes()? + self.shared.tensors.disk_bytes()?)
    }

    /// Ids of live photos that have no tensor (a crash between the two writes, or an old store).
    pub fn missing_tensors(&self) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(_, e)| e.tensor.is_none())
            .map(|(id, _)| id)
            .collect())
    }

    /// Stops the writer after it finishes what it has been given.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.commands.take();
        if let Some(w) = self.writer.take()
            && w.join().is_err()
        {
            warn!("store writer thread panicked");
        }
    }

    fn read_verified(
        &self,
        id: u64,
        pick: impl Fn(&PhotoEntry) -> Option<Location>,
        set: &VolumeSet,
    ) -> Result<Option<(PhotoEntry, Vec<u8>)>, StoreError> {
        // A compaction may remove the volume between lookup and read: look up again once.
        for attempt in 0..2 {
            let Some(entry) = self.shared.index.get(id)? else {
                return Ok(None);
            };
            let Some(loc) = pick(&entry) else {
                return Ok(None);
            };
            match set.read(loc, id) {
                Ok(record) => return Ok(Some((entry, record.data))),
                Err(StoreError::VolumeGone { .. }) if attempt == 0 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::VolumeGone { volume: 0 })
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        let commands = self.commands.as_ref().ok_or(StoreError::Closed)?;
        commands
            .send(make(tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

impl Drop for PhotoStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Replays volume records past the index's watermarks; returns the next photo id.
fn recover(shared: &Shared, report: &mut RecoveryReport) -> Result<u64, StoreError> {
    let mut changes = Vec::new();
    let mut watermarks = Vec::new();
    let mut next_id = shared.index.next_id()?.unwrap_or(1);
    for (name, set) in [(PHOTOS_DIR, &shared.photos), (TENSORS_DIR, &shared.tensors)] {
        let volumes = set.volumes()?;
        for (i, &number) in volumes.iter().enumerate() {
            let is_last = i + 1 == volumes.len();
            let header = match set.header(number) {
                Ok(h) => h,
                Err(e) if is_last && header_never_written(set, number) => {
                    warn!(error = %e, "removing a volume whose creation was interrupted");
                    set.remove(number)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            next_id = next_id.max(header.id_floor);
            let key = watermark_key(name, number);
            let from = shared.index.meta(&key)?.unwrap_or(0);
            let scan = set.scan(number, from)?;
            if let Some(reason) = scan.invalid_tail {
                let path = set.path(number).display().to_string();
                if is_last {
                    warn!(volume = %path, offset = scan.end, reason, "cutting a torn tail");
                    set.truncate(number, scan.end)?;
                    report.truncated.push((path, scan.end, reason.into()));
                } else {
                    warn!(volume = %path, offset = scan.end, reason, "sealed volume is damaged");
                    report.damaged.push((path, scan.end, reason.into()));
                }
            }
            for record in scan.records {
                report.replayed_records += 1;
                next_id = next_id.max(record.id + 1);
                changes.push(replay(set_kind(set), record)?);
            }
            watermarks.push((key, scan.end));
            if is_last {
                set.resume(number, scan.end)?;
            }
        }
    }
    shared.index.commit(&changes, &watermarks, &[], next_id)?;
    Ok(next_id)
}

fn set_kind(set: &VolumeSet) -> u8 {
    set.set_id()
}

fn replay(set: u8, record: crate::volume::ScannedRecord) -> Result<Change, StoreError> {
    Ok(match (set, record.kind) {
        (_, RecordKind::Tombstone) => Change::Remove(record.id),
        (PHOTO_SET, RecordKind::Put) => {
            let meta: PhotoMeta =
                serde_json::from_slice(&record.meta).map_err(|e| StoreError::Corrupt {
                    what: format!("metadata of photo {}", record.id),
                    reason: e.to_string(),
                })?;
            Change::Put(
                record.id,
                PhotoEntry {
                    photo: record.location,
                    tensor: None,
                    meta,
                },
            )
        }
        (_, RecordKind::Put) => Change::Tensor(record.id, record.location),
    })
}

fn header_never_written(set: &VolumeSet, number: u32) -> bool {
    std::fs::metadata(set.path(number))
        .map(|m| m.len() <= crate::volume::format::FILE_HEADER_LEN)
        .unwrap_or(false)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Writer {
    shared: Arc<Shared>,
    next_id: u64,
}

/// The volume state before a write batch: per set, the active volume and the newest number.
struct Snapshot {
    photos: (Option<(u32, u64)>, u32),
    tensors: (Option<(u32, u64)>, u32),
    next_id: u64,
}

/// A reply owed to a caller once the batch is durable.
enum Pending {
    Put(u64, oneshot::Sender<Result<u64, StoreError>>),
    Delete(bool, oneshot::Sender<Result<bool, StoreError>>),
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            self.run_batch(batch);
        }
    }

    fn run_batch(&mut self, batch: Vec<Command>) {
        let mut writes = Vec::new();
        for cmd in batch {
            match cmd {
                Command::Compact(reply) => {
                    let _ = reply.send(self.compact());
                }
                other => writes.push(other),
            }
        }
        if writes.is_empty() {
            return;
        }
        let before = match self.snapshot() {
            Ok(b) => b,
            Err(e) => {
                writes.into_iter().for_each(reject);
                warn!(error = %e, "cannot list volumes; refusing the batch");
                return;
            }
        };
        let mut changes = Vec::new();
        let mut pending = Vec::new();
        let result = self.append_all(writes, &mut changes, &mut pending);
        let result = result.and_then(|()| self.commit(&changes));
        match result {
            Ok(()) => {
                for p in pending {
                    match p {
                        Pending::Put(id, reply) => drop(reply.send(Ok(id))),
                        Pending::Delete(existed, reply) => drop(reply.send(Ok(existed))),
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "write batch failed; rolling back its records");
                self.roll_back(&before);
                self.next_id = before.next_id;
                let msg = e.to_string();
                for p in pending {
                    let err = || StoreError::Index(format!("write failed: {msg}"));
                    match p {
                        Pending::Put(_, reply) => drop(reply.send(Err(err()))),
                        Pending::Delete(_, reply) => drop(reply.send(Err(err()))),
                    }
                }
            }
        }
    }

    fn append_all(
        &mut self,
        writes: Vec<Command>,
        changes: &mut Vec<Change>,
        pending: &mut Vec<Pending>,
    ) -> Result<(), StoreError> {
        let mut failure = None;
        for cmd in writes {
            if failure.is_some() {
                reject(cmd);
                continue;
            }
            match self.append_one(cmd, changes, pending) {
                Ok(()) => {}
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn append_one(
        &mut self,
        cmd: Command,
        changes: &mut Vec<Change>,
        pending: &mut Vec<Pending>,
    ) -> Result<(), StoreError> {
        let floor = self.next_id;
        match cmd {
            Command::Put(photo, reply) => {
                let id = self.next_id;
                let meta =
                    serde_json::to_vec(&photo.meta).expect("metadata serialises; this is a bug");
                let photo_loc = self.shared.photos.append(
                    RecordKind::Put,
                    id,
                    &meta,
                    &photo.original,
                    floor,
                )?;
                let tensor_loc =
                    self.shared
                        .tensors
                        .append(RecordKind::Put, id, b"", &photo.tensor, floor)?;
                self.next_id += 1;
                changes.push(Change::Put(
                    id,
                    PhotoEntry {
                        photo: photo_loc,
                        tensor: Some(tensor_loc),
                        meta: photo.meta,
                    },
                ));
                pending.push(Pending::Put(id, reply));
            }
            Command::Delete(id, reply) => {
                let exists = self.shared.index.get(id)?.is_some()
                    && !changes
                        .iter()
                        .any(|c| matches!(c, Change::Remove(r) if *r == id));
                if exists {
                    self.shared
                        .photos
                        .append(RecordKind::Tombstone, id, b"", b"", floor)?;
                    changes.push(Change::Remove(id));
                }
                pending.push(Pending::Delete(exists, reply));
            }
            Command::SetTensor(id, tensor, reply) => {
                let exists = self.shared.index.get(id)?.is_some();
                if exists {
                    let loc =
                        self.shared
                            .tensors
                            .append(RecordKind::Put, id, b"", &tensor, floor)?;
                    changes.push(Change::Tensor(id, loc));
                }
                pending.push(Pending::Delete(exists, reply));
            }
            Command::Compact(_) => unreachable!("compactions are taken out of write batches"),
        }
        Ok(())
    }

    fn commit(&self, changes: &[Change]) -> Result<(), StoreError> {
        self.shared.photos.sync()?;
        self.shared.tensors.sync()?;
        let watermarks = self.active_watermarks();
        self.shared
            .index
            .commit(changes, &watermarks, &[], self.next_id)
    }

    fn active_watermarks(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, set) in [
            (PHOTOS_DIR, &self.shared.photos),
            (TENSORS_DIR, &self.shared.tensors),
        ] {
            if let Some((number, len)) = set.active() {
                out.push((watermark_key(name, number), len));
            }
        }
        out
    }

    /// Where each volume set stands before a batch, to roll back to if the batch fails.
    fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let mut sets = Vec::with_capacity(2);
        for set in [&self.shared.photos, &self.shared.tensors] {
            let newest = set.volumes()?.last().copied().unwrap_or(0);
            sets.push((set.active(), newest));
        }
        Ok(Snapshot {
            photos: sets[0],
            tensors: sets[1],
            next_id: self.next_id,
        })
    }

    /// Undoes the appends of a failed batch, so that they are not replayed after a restart.
    fn roll_back(&self, before: &Snapshot) {
        for (set, (active, newest)) in [
            (&self.shared.photos, before.photos),
            (&self.shared.tensors, before.tensors),
        ] {
            let result = (|| -> Result<(), StoreError> {
                set.seal()?;
                for n in set.volumes()? {
                    if n > newest {
                        set.remove(n)?;
                    }
                }
                if let Some((n, len)) = active {
                    set.truncate(n, len)?;
                    set.resume(n, len)?;
                }
                Ok(())
            })();
            if let Err(e) = result {
                warn!(error = %e, dir = %set.dir().display(), "could not roll back a failed batch");
            }
        }
    }

    fn compact(&mut self) -> Result<CompactionReport, StoreError> {
        let started = Instant::now();
        let bytes_before = self.shared.photos.disk_bytes()? + self.shared.tensors.disk_bytes()?;
        let entries: std::collections::HashMap<u64, PhotoEntry> =
            self.shared.index.entries()?.into_iter().collect();
        let mut records_moved = 0;
        let mut volumes_removed = 0;
        for (name, set) in [
            (PHOTOS_DIR, &self.shared.photos),
            (TENSORS_DIR, &self.shared.tensors),
        ] {
            set.seal()?;
            let old = set.volumes()?;
            let mut live: Vec<(u64, Location)> = entries
                .iter()
                .filter_map(|(id, e)| {
                    let loc = if set_kind(set) == PHOTO_SET {
                        Some(e.photo)
                    } else {
                        e.tensor
                    };
                    loc.map(|l| (*id, l))
                })
                .collect();
            live.sort_by_key(|(_, l)| (l.volume, l.offset));
            let mut changes = Vec::with_capacity(live.len());
            for (id, loc) in live {
                let record = set.read(loc, id)?;
                let new = set.append(
                    RecordKind::Put,
                    id,
                    &record.meta,
                    &record.data,
                    self.next_id,
                )?;
                changes.push(if set_kind(set) == PHOTO_SET {
                    let mut entry = entries[&id].clone();
                    entry.photo = new;
                    Change::Put(id, entry)
                } else {
                    Change::Tensor(id, new)
                });
                records_moved += 1;
            }
            set.sync()?;
            let dropped: Vec<String> = old.iter().map(|n| watermark_key(name, *n)).collect();
            let mut watermarks = Vec::new();
            for n in set.volumes()?.into_iter().filter(|n| !old.contains(n)) {
                let len = std::fs::metadata(set.path(n))
                    .map_err(StoreError::io("stat volume", &set.path(n)))?
                    .len();
                watermarks.push((watermark_key(name, n), len));
            }
            self.shared
                .index
                .commit(&changes, &watermarks, &dropped, self.next_id)?;
            for n in old {
                set.remove(n)?;
                volumes_removed += 1;
            }
        }
        let bytes_after = self.shared.photos.disk_bytes()? + self.shared.tensors.disk_bytes()?;
        let report = CompactionReport {
            bytes_before,
            bytes_after,
            records_moved,
            volumes_removed,
            seconds: started.elapsed().as_secs_f64(),
        };
        info!(?report, "compaction finished");
        Ok(report)
    }
}

fn reject(cmd: Command) {
    let err = || StoreError::Index("an earlier write in the same batch failed".into());
    match cmd {
        Command::Put(_, r) => drop(r.send(Err(err()))),
        Command::Delete(_, r) | Command::SetTensor(_, _, r) => drop(r.send(Err(err()))),
        Command::Compact(r) => drop(r.send(Err(err()))),
    }
}
