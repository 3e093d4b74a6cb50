//! The writer thread: group commit of puts, deletes and tensor updates, and rollback of a batch
//! that fails.
//!
//! The thread takes up to [`MAX_BATCH`] queued requests at once, appends all their records,
//! syncs both volume sets, commits the index in one transaction and only then answers. A put or
//! tensor update that would dip into the free-space reserve is refused on its own. If any step
//! fails, the batch's appends are cut off again (so a restart does not replay them) and every
//! request of the batch gets an error: `InsufficientStorage` when the disk was full. When the
//! index commit itself failed, the index (opened again) tells whether the commit landed: if it
//! did, the batch succeeded; if that cannot be told, the records stay (past the index, never
//! acknowledged) rather than risk cutting committed ones.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::compact::CompactionReport;
use super::ids::IdAllocator;
use super::{NewPhoto, Shared};
use crate::storage::StoreError;
use crate::storage::index::{Change, PhotoEntry, watermark_key};
use crate::storage::volume::VolumeSet;
use crate::storage::volume::format::{RECORD_HEADER_LEN, RecordKind};

/// Most requests folded into one group commit.
const MAX_BATCH: usize = 128;

/// A request to the writer, with the channel its answer goes to.
pub(super) enum Command {
    /// A new photo; with an id, a copy of another node's photo under that id (kept as it is
    /// when the store already has the id).
    Put(
        NewPhoto,
        Option<u64>,
        oneshot::Sender<Result<u64, StoreError>>,
    ),
    Delete(u64, oneshot::Sender<Result<bool, StoreError>>),
    SetTensor(u64, Vec<u8>, oneshot::Sender<Result<bool, StoreError>>),
    Compact(oneshot::Sender<Result<CompactionReport, StoreError>>),
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) ids: IdAllocator,
}

/// Where one volume set stands: its active volume (number, length) and its newest volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SetMark {
    active: Option<(u32, u64)>,
    newest: u32,
}

impl SetMark {
    /// The mark of `set` now.
    pub(super) fn of(set: &VolumeSet) -> Result<Self, StoreError> {
        Ok(SetMark {
            active: set.active(),
            newest: set.volumes()?.last().copied().unwrap_or(0),
        })
    }

    /// Cuts `set` back to this mark: removes newer volumes, truncates the active one and
    /// appends to it again. Each step is tried even if an earlier one failed.
    pub(super) fn roll_back(&self, set: &VolumeSet) {
        set.abandon();
        let mut failures = Vec::new();
        match set.volumes() {
            Ok(volumes) => {
                for n in volumes.into_iter().filter(|n| *n > self.newest) {
                    if let Err(e) = set.remove(n) {
                        failures.push(e);
                    }
                }
            }
            Err(e) => failures.push(e),
        }
        if let Some((n, len)) = self.active
            && let Err(e) = set.truncate(n, len).and_then(|()| set.resume(n, len))
        {
            failures.push(e);
        }
        for e in failures {
            warn!(error = %e, dir = %set.dir().display(), "could not roll back a failed write");
        }
    }
}

/// The state before a write batch, to roll back to if the batch fails.
struct Snapshot {
    photos: SetMark,
    tensors: SetMark,
    ids: IdAllocator,
}

impl Snapshot {
    /// The marks in the order of [`Shared::sets`].
    fn marks(&self) -> [SetMark; 2] {
        [self.photos, self.tensors]
    }
}

/// A reply owed to a caller once the batch is durable.
enum Pending {
    /// A put, with the id it was given.
    Put(u64, oneshot::Sender<Result<u64, StoreError>>),
    /// A delete or a tensor update, with whether its photo existed.
    Found(bool, oneshot::Sender<Result<bool, StoreError>>),
}

impl Pending {
    fn succeed(self) {
        match self {
            Pending::Put(id, reply) => drop(reply.send(Ok(id))),
            Pending::Found(existed, reply) => drop(reply.send(Ok(existed))),
        }
    }

    fn fail(self, e: StoreError) {
        match self {
            Pending::Put(_, reply) => drop(reply.send(Err(e))),
            Pending::Found(_, reply) => drop(reply.send(Err(e))),
        }
    }
}

/// What a batch has appended so far.
#[derive(Default)]
struct Batch {
    changes: Vec<Change>,
    pending: Vec<Pending>,
    bytes: u64,
}

impl Batch {
    /// Whether the batch already stores photo `id`.
    fn puts(&self, id: u64) -> bool {
        self.changes
            .iter()
            .any(|c| matches!(c, Change::Put(p, _) if *p == id))
    }
}

/// How a failed batch ends.
enum Outcome {
    /// Nothing of it is indexed: cut its records.
    RollBack,
    /// The index commit landed after all.
    Landed,
    /// Whether the index commit landed is unknown: keep the records.
    Unknown,
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>, ids: IdAllocator) -> Self {
        Writer { shared, ids }
    }

    /// Serves requests until every sender is gone.
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Command>) {
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

    fn run_batch(&mut self, commands: Vec<Command>) {
        let mut writes = Vec::new();
        for cmd in commands {
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
                warn!(error = %e, "cannot list volumes; refusing the batch");
                let reason = e.to_string();
                for cmd in writes {
                    reject(cmd, || StoreError::WriteFailed {
                        reason: reason.clone(),
                    });
                }
                return;
            }
        };
        let mut batch = Batch::default();
        let mut writes = writes.into_iter();
        let mut failure = None;
        for cmd in writes.by_ref() {
            if let Err(e) = self.append_one(cmd, &mut batch) {
                failure = Some((e, Outcome::RollBack));
                break;
            }
        }
        if failure.is_none()
            && let Err(e) = self.sync()
        {
            failure = Some((e, Outcome::RollBack));
        }
        if failure.is_none()
            && let Err(e) = self.commit(&batch.changes, &before)
        {
            let outcome = self.outcome_of_failed_commit(&before);
            failure = Some((e, outcome));
        }
        match failure {
            None | Some((_, Outcome::Landed)) => {
                if let Some((e, _)) = failure {
                    warn!(error = %e, "the index commit reported a failure but landed");
                }
                self.shared.space.used(batch.bytes);
                batch.pending.into_iter().for_each(Pending::succeed);
            }
            Some((e, outcome)) => {
                let error = batch_error(&e);
                if e.is_no_space() {
                    self.shared.space.forget();
                }
                match outcome {
                    Outcome::Unknown => {
                        warn!(error = %e, "write batch failed and the index cannot tell whether it was committed; its records stay unacknowledged");
                    }
                    _ => {
                        warn!(error = %e, "write batch failed; rolling back its records");
                        before.photos.roll_back(&self.shared.photos);
                        before.tensors.roll_back(&self.shared.tensors);
                        self.ids = before.ids;
                    }
                }
                for p in batch.pending {
                    p.fail(error());
                }
                for cmd in writes {
                    reject(cmd, error);
                }
            }
        }
    }

    /// Appends the records of one request. A put or tensor update that the free-space reserve
    /// refuses is answered at once and is not a failure of the batch.
    fn append_one(&mut self, cmd: Command, batch: &mut Batch) -> Result<(), StoreError> {
        let floor = self.ids.peek();
        match cmd {
            Command::Put(photo, given, reply) => {
                if let Some(id) = given {
                    match self.shared.index.get(id) {
                        Ok(None) if !batch.puts(id) => {}
                        Ok(_) => {
                            drop(reply.send(Ok(id)));
                            return Ok(());
                        }
                        Err(e) => {
                            drop(reply.send(Err(e)));
                            return Ok(());
                        }
                    }
                }
                let meta =
                    serde_json::to_vec(&photo.meta).expect("metadata serialises; this is a bug");
                let bytes = record_bytes(meta.len() + photo.original.len())
                    + record_bytes(photo.tensor.len());
                if let Err(e) = self.shared.space.check(batch.bytes + bytes) {
                    drop(reply.send(Err(e)));
                    return Ok(());
                }
                let id = match given.map_or_else(|| self.ids.take(), Ok) {
                    Ok(id) => id,
                    Err(e) => {
                        drop(reply.send(Err(e)));
                        return Ok(());
                    }
                };
                batch.pending.push(Pending::Put(id, reply));
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
                batch.bytes += bytes;
                batch.changes.push(Change::Put(
                    id,
                    PhotoEntry {
                        photo: photo_loc,
                        tensor: Some(tensor_loc),
                        meta: photo.meta,
                    },
                ));
            }
            Command::Delete(id, reply) => {
                let exists = match self.shared.index.get(id) {
                    Ok(entry) => {
                        entry.is_some()
                            && !batch
                                .changes
                                .iter()
                                .any(|c| matches!(c, Change::Remove(r) if *r == id))
                    }
                    Err(e) => {
                        drop(reply.send(Err(e)));
                        return Ok(());
                    }
                };
                batch.pending.push(Pending::Found(exists, reply));
                if exists {
                    self.shared
                        .photos
                        .append(RecordKind::Tombstone, id, b"", b"", floor)?;
                    batch.bytes += record_bytes(0);
                    batch.changes.push(Change::Remove(id));
                }
            }
            Command::SetTensor(id, tensor, reply) => {
                let bytes = record_bytes(tensor.len());
                let exists = match self
                    .shared
                    .space
                    .check(batch.bytes + bytes)
                    .and_then(|()| self.shared.index.get(id))
                {
                    Ok(entry) => entry.is_some(),
                    Err(e) => {
                        drop(reply.send(Err(e)));
                        return Ok(());
                    }
                };
                batch.pending.push(Pending::Found(exists, reply));
                if exists {
                    let loc =
                        self.shared
                            .tensors
                            .append(RecordKind::Put, id, b"", &tensor, floor)?;
                    batch.bytes += bytes;
                    batch.changes.push(Change::Tensor(id, loc));
                }
            }
            Command::Compact(_) => unreachable!("compactions are taken out of write batches"),
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.shared.photos.sync()?;
        self.shared.tensors.sync()
    }

    fn commit(&self, changes: &[Change], before: &Snapshot) -> Result<(), StoreError> {
        let watermarks = self.watermarks(before)?;
        self.shared
            .index
            .commit(changes, &watermarks, &[], self.ids.peek())
    }

    /// The watermark of every volume the batch appended to: the active ones, and those it
    /// sealed or created on the way (so a restart replays nothing that was committed).
    fn watermarks(&self, before: &Snapshot) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for ((name, set), mark) in self.shared.sets().into_iter().zip(before.marks()) {
            let active = set.active();
            let active_number = active.map(|(n, _)| n);
            if mark.active.map(|(n, _)| n) != active_number {
                let sealed = mark.active.map(|(n, _)| n);
                let created = set.volumes()?.into_iter().filter(|n| *n > mark.newest);
                for n in sealed.into_iter().chain(created) {
                    if Some(n) != active_number {
                        out.push((watermark_key(name, n), set.file_len(n)?));
                    }
                }
            }
            if let Some((n, len)) = active {
                out.push((watermark_key(name, n), len));
            }
        }
        Ok(out)
    }

    /// After a failed index commit, asks the index (opened again) whether the commit landed:
    /// it did if the watermark of every volume the batch appended to is the batch's end.
    fn outcome_of_failed_commit(&self, before: &Snapshot) -> Outcome {
        let mut landed = true;
        for ((name, set), mark) in self.shared.sets().into_iter().zip(before.marks()) {
            let Some((number, len)) = set.active() else {
                continue;
            };
            if mark.active == Some((number, len)) {
                continue;
            }
            match self.shared.index.meta(&watermark_key(name, number)) {
                Ok(committed) => landed &= committed == Some(len),
                Err(e) => {
                    warn!(error = %e, "cannot read the index after a failed commit");
                    return Outcome::Unknown;
                }
            }
        }
        if landed {
            Outcome::Landed
        } else {
            Outcome::RollBack
        }
    }

    /// Where each volume set stands before a batch, to roll back to if the batch fails.
    fn snapshot(&self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot {
            photos: SetMark::of(&self.shared.photos)?,
            tensors: SetMark::of(&self.shared.tensors)?,
            ids: self.ids.clone(),
        })
    }
}

/// Bytes of a record with `body` bytes of metadata and data.
fn record_bytes(body: usize) -> u64 {
    (RECORD_HEADER_LEN + body) as u64
}

/// The error every request of a batch that failed with `e` gets: `InsufficientStorage` when
/// the disk was full, else `WriteFailed`.
fn batch_error(e: &StoreError) -> impl Fn() -> StoreError + Copy + '_ {
    move || {
        let reason = e.to_string();
        if e.is_no_space() {
            StoreError::InsufficientStorage { reason }
        } else {
            StoreError::WriteFailed { reason }
        }
    }
}

/// Answers a request that did not run with `error`.
fn reject(cmd: Command, error: impl Fn() -> StoreError) {
    match cmd {
        Command::Put(_, _, r) => drop(r.send(Err(error()))),
        Command::Delete(_, r) | Command::SetTensor(_, _, r) => drop(r.send(Err(error()))),
        Command::Compact(r) => drop(r.send(Err(error()))),
    }
}
