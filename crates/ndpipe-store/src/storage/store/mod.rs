//! The photo store: volumes + index, one writer thread with group commit, concurrent readers.
//!
//! Every write goes through the writer thread ([`writer`]), which appends the records of a batch
//! of requests, syncs the volumes once, commits the index once and only then answers each
//! request, so an acknowledged write is durable and a crash loses only unacknowledged work.
//! Opening the store recovers from a crash ([`recover`]); [`compact`] rewrites the volumes with
//! only live records. Writes that add data keep a free-space reserve ([`DiskSpace`]); a write
//! that finds the disk full anyway is rolled back and answered `InsufficientStorage`, and the
//! store takes writes again as soon as space returns.

mod compact;
#[cfg(test)]
mod full_disk;
mod ids;
mod recover;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use ndpipe_catalog::PhotoMeta;
use ndpipe_util::sync::{lock, read, write};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

pub use compact::CompactionReport;
pub use ids::PhotoIds;
pub use recover::RecoveryReport;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use recover::replay_all;

use crate::storage::StoreError;
use crate::storage::index::{Index, PhotoEntry};
use crate::storage::space::DiskSpace;
use crate::storage::volume::{Location, VolumeSet};
use writer::{Command, Writer};

pub(crate) const PHOTO_SET: u8 = 1;
pub(crate) const TENSOR_SET: u8 = 2;
const PHOTOS_DIR: &str = "photos";
const TENSORS_DIR: &str = "tensors";

/// Settings of the storage engine.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// A volume is sealed once it would grow past this many bytes.
    pub max_volume_bytes: u64,
    /// Free bytes kept on the store's file system: puts that would leave less are refused with
    /// [`StoreError::InsufficientStorage`]; deletes and reads go on.
    pub min_free_bytes: u64,
    /// Where new photo ids come from.
    pub ids: PhotoIds,
    /// Bytes of the index cached in memory.
    pub index_cache_bytes: usize,
}

/// Bytes of the index a store caches in memory unless configured otherwise: the entries of
/// about 500,000 photos.
pub(crate) const DEFAULT_INDEX_CACHE_BYTES: usize = 64 << 20;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_volume_bytes: 1 << 30,
            min_free_bytes: 256 << 20,
            ids: PhotoIds::Own,
            index_cache_bytes: DEFAULT_INDEX_CACHE_BYTES,
        }
    }
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

/// What the writer and the readers share.
struct Shared {
    photos: VolumeSet,
    tensors: VolumeSet,
    index: Index,
    space: DiskSpace,
}

impl Shared {
    /// The two volume sets with their watermark names.
    fn sets(&self) -> [(&'static str, &VolumeSet); 2] {
        [(PHOTOS_DIR, &self.photos), (TENSORS_DIR, &self.tensors)]
    }

    fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(self.photos.disk_bytes()? + self.tensors.disk_bytes()?)
    }
}

/// The durable photo store of one PipeStore (`DATA/store`).
///
/// A building block: [`crate::PipeStore`] runs one; a benchmark can open one on its own to fill
/// it and re-label it with a [`crate::Relabeler`].
pub struct PhotoStore {
    shared: Arc<Shared>,
    commands: RwLock<Option<mpsc::Sender<Command>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl PhotoStore {
    /// Opens the store in `root`, recovering from a crash if needed: torn tails are cut, records
    /// written after the last index commit are replayed, and a missing or unreadable index is
    /// rebuilt from the volumes. Blocks (file I/O): call it off the async runtime.
    pub fn open(root: &Path, config: &StoreConfig) -> Result<(Self, RecoveryReport), StoreError> {
        std::fs::create_dir_all(root).map_err(StoreError::io("create store directory", root))?;
        let photos = VolumeSet::open(&root.join(PHOTOS_DIR), PHOTO_SET, config.max_volume_bytes)?;
        let tensors =
            VolumeSet::open(&root.join(TENSORS_DIR), TENSOR_SET, config.max_volume_bytes)?;
        let mut report = RecoveryReport::default();
        let index = recover::open_index(root, config.index_cache_bytes, &mut report)?;
        let shared = Shared {
            photos,
            tensors,
            index,
            space: DiskSpace::new(root, config.min_free_bytes),
        };
        shared.space.warn_if_low_at_start();
        let next_id = recover::recover(&shared, &mut report)?;
        report.photos = shared.index.len()?;
        info!(
            photos = report.photos,
            next_id,
            replayed = report.replayed_records,
            "store opened"
        );
        let shared = Arc::new(shared);
        let (tx, rx) = mpsc::channel(1024);
        let ids = ids::IdAllocator::new(next_id, config.ids.clone())?;
        let writer = Writer::new(shared.clone(), ids);
        let writer = std::thread::Builder::new()
            .name("ndpipe-store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(StoreError::io("start writer thread", root))?;
        Ok((
            PhotoStore {
                shared,
                commands: RwLock::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
            },
            report,
        ))
    }

    /// Stores a photo durably and returns its new id.
    pub async fn put(&self, photo: NewPhoto) -> Result<u64, StoreError> {
        self.request(|reply| Command::Put(photo, None, reply)).await
    }

    /// Stores a copy of another node's photo under its id `id`, durably; a store that already
    /// has `id` keeps what it has (a repeated copy is not an error).
    pub(crate) async fn put_copy(&self, id: u64, photo: NewPhoto) -> Result<(), StoreError> {
        self.request(|reply| Command::Put(photo, Some(id), reply))
            .await
            .map(drop)
    }

    /// Deletes a photo (writes a tombstone). Returns whether it existed.
    pub async fn delete(&self, id: u64) -> Result<bool, StoreError> {
        self.request(|reply| Command::Delete(id, reply)).await
    }

    /// Stores (or replaces) the tensor of an existing photo. Returns false if the photo is gone.
    pub(crate) async fn set_tensor(&self, id: u64, tensor: Vec<u8>) -> Result<bool, StoreError> {
        self.request(|reply| Command::SetTensor(id, tensor, reply))
            .await
    }

    /// Rewrites all volumes with only live records and removes the old ones. Writes wait while
    /// it runs; reads go on.
    pub async fn compact(&self) -> Result<CompactionReport, StoreError> {
        self.request(Command::Compact).await
    }

    /// Reads a photo's original bytes, verified against their checksum.
    pub(crate) fn original(&self, id: u64) -> Result<Option<(PhotoEntry, Vec<u8>)>, StoreError> {
        self.read_verified(id, |e| Some(e.photo), &self.shared.photos)
    }

    /// Reads a photo's encoded tensor, verified against its checksum. `None` if the photo or its
    /// tensor does not exist.
    pub(crate) fn tensor(&self, id: u64) -> Result<Option<(PhotoEntry, Vec<u8>)>, StoreError> {
        self.read_verified(id, |e| e.tensor, &self.shared.tensors)
    }

    /// Every live photo, in id order.
    pub(crate) fn entries(&self) -> Result<Vec<(u64, PhotoEntry)>, StoreError> {
        self.shared.index.entries()
    }

    /// Up to `limit` ids of live photos above `after`, in order.
    pub(crate) fn ids_after(&self, after: u64, limit: usize) -> Result<Vec<u64>, StoreError> {
        self.shared.index.ids_after(after, limit)
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
        self.shared.disk_bytes()
    }

    /// Whether photo `id` is in the store.
    pub(crate) fn contains(&self, id: u64) -> Result<bool, StoreError> {
        Ok(self.shared.index.get(id)?.is_some())
    }

    /// The hex SHA-256 of photo `id`'s original, if the store holds it.
    pub(crate) fn sha256(&self, id: u64) -> Result<Option<String>, StoreError> {
        Ok(self.shared.index.get(id)?.map(|e| e.meta.sha256))
    }

    /// Refuses (with [`StoreError::InsufficientStorage`]) a write of about `bytes` that the
    /// free-space reserve would not allow, before any work is done for it.
    pub(crate) fn check_space(&self, bytes: u64) -> Result<(), StoreError> {
        self.shared.space.check(bytes)
    }

    /// Free bytes on the store's file system, and whether they are below the reserve (the
    /// store then refuses uploads).
    pub(crate) fn free_space(&self) -> Result<(u64, bool), StoreError> {
        let available = self.shared.space.available()?;
        Ok((available, self.shared.space.is_low()))
    }

    /// The free-space reserve (`min_free_bytes`), in bytes.
    pub(crate) fn reserve_bytes(&self) -> u64 {
        self.shared.space.reserve()
    }

    /// Ids of live photos that have no tensor (a crash between the two writes, or an old store).
    pub(crate) fn missing_tensors(&self) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(_, e)| e.tensor.is_none())
            .map(|(id, _)| id)
            .collect())
    }

    /// Stops the writer after it finishes what it has been given, and waits for it; later writes
    /// fail with [`StoreError::Closed`], reads go on. Blocks: call it off the async runtime.
    /// Dropping the store does the same.
    pub fn close(&self) {
        write(&self.commands).take();
        if let Some(w) = lock(&self.writer).take()
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
        let commands = read(&self.commands).clone().ok_or(StoreError::Closed)?;
        commands
            .send(make(tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

impl Drop for PhotoStore {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored photo of 3 bytes of `n`, with a 5-byte tensor.
    pub(crate) fn photo(n: u8) -> NewPhoto {
        NewPhoto {
            meta: PhotoMeta {
                sha256: format!("{n:064}"),
                bytes: 3,
                width: 1,
                height: 1,
                content_type: "image/png".into(),
                created_ms: 0,
                ground_truth: None,
            },
            original: vec![n; 3],
            tensor: vec![n; 5],
        }
    }

    #[tokio::test]
    async fn copies_keep_their_ids_and_ids_after_pages_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = PhotoStore::open(dir.path(), &StoreConfig::default()).unwrap();
        store.put_copy(70_000, photo(7)).await.unwrap();
        store.put_copy(70_000, photo(8)).await.unwrap(); // kept as it was
        assert_eq!(store.original(70_000).unwrap().unwrap().1, vec![7; 3]);
        let own = store.put(photo(1)).await.unwrap();
        assert_eq!(own, 1, "a copy does not move the store's own counter");
        assert_eq!(store.ids_after(0, 10).unwrap(), [1, 70_000]);
        assert_eq!(store.ids_after(1, 10).unwrap(), [70_000]);
        assert_eq!(store.ids_after(0, 1).unwrap(), [1]);
        assert!(store.ids_after(u64::MAX, 10).unwrap().is_empty());
    }

    #[tokio::test]
    async fn writes_survive_a_reopen_and_close_refuses_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig::default();
        {
            let (store, report) = PhotoStore::open(dir.path(), &config).unwrap();
            assert!(report.index_rebuilt, "a new store has no index yet");
            let a = store.put(photo(1)).await.unwrap();
            let b = store.put(photo(2)).await.unwrap();
            assert_eq!((a, b), (1, 2));
            assert!(store.delete(a).await.unwrap());
            assert!(!store.delete(a).await.unwrap());
            assert!(store.set_tensor(b, vec![9; 4]).await.unwrap());
            store.close();
            assert!(matches!(store.put(photo(3)).await, Err(StoreError::Closed)));
            assert_eq!(store.tensor(b).unwrap().unwrap().1, vec![9; 4]);
        }
        let (store, report) = PhotoStore::open(dir.path(), &config).unwrap();
        assert!(!report.index_rebuilt);
        assert_eq!(report.photos, 1);
        assert_eq!(store.original(2).unwrap().unwrap().1, vec![2; 3]);
        assert!(store.original(1).unwrap().is_none());
        assert_eq!(
            store.put(photo(4)).await.unwrap(),
            3,
            "ids are never reused"
        );
        let compacted = store.compact().await.unwrap();
        assert_eq!(compacted.records_moved, 4, "two photos, two tensors");
        assert_eq!(store.tensor(2).unwrap().unwrap().1, vec![9; 4]);
        assert!(store.missing_tensors().unwrap().is_empty());
    }

    /// Compaction over many volumes: every old volume goes, every live photo and tensor reads
    /// back, also after a reopen, no deleted one comes back, and space is reclaimed.
    #[tokio::test]
    async fn compaction_rewrites_many_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            max_volume_bytes: 256,
            ..StoreConfig::default()
        };
        let (store, _) = PhotoStore::open(dir.path(), &config).unwrap();
        let mut ids = Vec::new();
        for n in 0..40u8 {
            ids.push((n, store.put(photo(n)).await.unwrap()));
        }
        let volumes = |set: &str| std::fs::read_dir(dir.path().join(set)).unwrap().count();
        for (_, id) in ids.iter().filter(|(n, _)| n % 2 == 0) {
            assert!(store.delete(*id).await.unwrap());
        }
        let before = (volumes(PHOTOS_DIR), volumes(TENSORS_DIR));
        assert!(before.0 > 4 && before.1 > 4, "{before:?} volumes");
        let report = store.compact().await.unwrap();
        assert_eq!(report.records_moved, 40, "20 photos, 20 tensors");
        assert_eq!(report.volumes_removed as usize, before.0 + before.1);
        assert!(report.bytes_after < report.bytes_before, "{report:?}");
        drop(store);
        let (store, _) = PhotoStore::open(dir.path(), &config).unwrap();
        for (n, id) in &ids {
            let original = store.original(*id).unwrap().map(|(_, b)| b);
            let tensor = store.tensor(*id).unwrap().map(|(_, b)| b);
            if n % 2 == 0 {
                assert!(original.is_none() && tensor.is_none(), "{id} came back");
            } else {
                assert_eq!(original, Some(vec![*n; 3]), "{id}");
                assert_eq!(tensor, Some(vec![*n; 5]), "{id}");
            }
        }
    }

    #[tokio::test]
    async fn the_reserve_refuses_puts_but_not_deletes_or_reads() {
        let dir = tempfile::tempdir().unwrap();
        let open = |min_free_bytes| {
            let config = StoreConfig {
                min_free_bytes,
                ..StoreConfig::default()
            };
            PhotoStore::open(dir.path(), &config).unwrap().0
        };
        let store = open(0);
        let id = store.put(photo(1)).await.unwrap();
        drop(store);
        let store = open(u64::MAX / 2);
        assert!(matches!(
            store.put(photo(2)).await,
            Err(StoreError::InsufficientStorage { .. })
        ));
        assert!(matches!(
            store.set_tensor(id, vec![0; 4]).await,
            Err(StoreError::InsufficientStorage { .. })
        ));
        assert!(store.check_space(1).is_err());
        assert!(store.free_space().unwrap().1, "below the reserve");
        assert_eq!(store.original(id).unwrap().unwrap().1, vec![1; 3]);
        assert!(store.delete(id).await.unwrap());
        assert!(!store.contains(id).unwrap());
        drop(store);
        let store = open(0);
        assert_eq!(store.put(photo(3)).await.unwrap(), 2, "no id was spent");
    }
}
