//! The writer thread: group commit of puts, deletes and tensor updates, and rollback of a batch
//! that fails.
//!
//! The thread takes up to [`MAX_BATCH`] queued requests at once, appends all their records,
//! syncs both volume sets, commits the index in one transaction and only then answers. If any
//! step fails, the batch's appends are cut off again (so a restart does not replay them) and
//! every request of the batch gets an error.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::compact::CompactionReport;
use super::{NewPhoto, Shared};
use crate::storage::StoreError;
use crate::storage::index::{Change, PhotoEntry, watermark_key};
use crate::storage::volume::format::RecordKind;

/// Most requests folded into one group commit.
const MAX_BATCH: usize = 128;

/// A request to the writer, with the channel its answer goes to.
pub(super) enum Command {
    Put(NewPhoto, oneshot::Sender<Result<u64, StoreError>>),
    Delete(u64, oneshot::Sender<Result<bool, StoreError>>),
    SetTensor(u64, Vec<u8>, oneshot::Sender<Result<bool, StoreError>>),
    Compact(oneshot::Sender<Result<CompactionReport, StoreError>>),
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) next_id: u64,
}

/// The volume state before a write batch: per set, the active volume and the newest number.
struct Snapshot {
    photos: (Option<(u32, u64)>, u32),
    tensors: (Option<(u32, u64)>, u32),
    next_id: u64,
}

/// A reply owed to a caller once the batch is durable.
enum Pending {
    /// A put, with the id it was given.
    Put(u64, oneshot::Sender<Result<u64, StoreError>>),
    /// A delete or a tensor update, with whether its photo existed.
    Found(bool, oneshot::Sender<Result<bool, StoreError>>),
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>, next_id: u64) -> Self {
        Writer { shared, next_id }
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
                        Pending::Found(existed, reply) => drop(reply.send(Ok(existed))),
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "write batch failed; rolling back its records");
                self.roll_back(&before);
                self.next_id = before.next_id;
                let reason = e.to_string();
                let err = || StoreError::WriteFailed {
                    reason: reason.clone(),
                };
                for p in pending {
                    match p {
                        Pending::Put(_, reply) => drop(reply.send(Err(err()))),
                        Pending::Found(_, reply) => drop(reply.send(Err(err()))),
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
            if let Err(e) = self.append_one(cmd, changes, pending) {
                failure = Some(e);
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
                pending.push(Pending::Found(exists, reply));
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
                pending.push(Pending::Found(exists, reply));
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
        self.shared
            .sets()
            .into_iter()
            .filter_map(|(name, set)| {
                set.active()
                    .map(|(number, len)| (watermark_key(name, number), len))
            })
            .collect()
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
}

/// Answers a request that cannot run because an earlier one in its batch failed.
fn reject(cmd: Command) {
    let err = || StoreError::WriteFailed {
        reason: "an earlier write in the same batch failed".into(),
    };
    match cmd {
        Command::Put(_, r) => drop(r.send(Err(err()))),
        Command::Delete(_, r) | Command::SetTensor(_, _, r) => drop(r.send(Err(err()))),
        Command::Compact(r) => drop(r.send(Err(err()))),
    }
}
