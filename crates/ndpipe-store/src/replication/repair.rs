//! The background worker of replication. Every round it reports this node's free space (what
//! placement weighs nodes by), copies each of its photos that has fewer than `replicas` copies
//! (after a node was removed) to the node rendezvous hashing picks (plain objects' files too,
//! and every ten minutes it sweeps away the files no object names: `blobs.rs`; their scrub and
//! rebalancing are `blob_upkeep.rs`), scrubs a few local
//! copies, replacing a damaged one from another holder, and moves a few photos to where
//! placement puts them now (`rebalance.rs`). At start it first drops what must not
//! stay: copies of deleted photos (a node that was away during a delete) and copies of uploads
//! that never finished (the primary failed before cataloguing them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::{PhotoCopies, PlacementNode};
use ndpipe_util::time::now_ms;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{Replication, ReplicationError, placement};
use crate::storage::StoreError;

/// Photos looked at per catalog query.
const PAGE: u32 = 256;
/// Repair copies in flight at once.
const PARALLEL_COPIES: usize = 8;
/// A copy younger than this whose photo has no catalog row may still be catalogued by its
/// primary: the start-up sweep keeps it.
const ORPHAN_GRACE_MS: i64 = 60_000;
/// How far back each round looks again for deletes, for clocks that differ between nodes.
const CLOCK_SLACK_MS: i64 = 60_000;

/// Settings of the background worker.
#[derive(Debug, Clone)]
pub(crate) struct RepairConfig {
    /// Pause between rounds.
    pub(crate) interval: Duration,
    /// Local copies re-read and verified per second (0: no scrub).
    pub(crate) scrub_per_second: u32,
    /// Photos moved per rebalancing round at most (at least 1).
    pub(crate) rebalance_moves: u32,
    /// Photos rebalancing looks at per round (at least 1).
    pub(crate) rebalance_page: u32,
}

/// Where the worker's walks through this node's photos and files stand.
#[derive(Debug, Default)]
struct Cursors {
    /// The last photo scrubbed.
    scrub: u64,
    /// The last file scrubbed.
    scrub_files: Option<String>,
    /// The last photo rebalancing looked at.
    rebalance: Option<u64>,
    /// The last file rebalancing looked at.
    rebalance_files: Option<String>,
}

/// What the start-up sweep did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct SweepReport {
    /// Copies of deleted photos dropped.
    pub(crate) tombstoned: u64,
    /// Copies of uploads that were never catalogued, dropped.
    pub(crate) orphans: u64,
    /// Copies held here that the catalog did not list, recorded.
    pub(crate) recorded: u64,
}

impl Replication {
    /// Drops the local copies of deleted photos and of uploads that never finished, and
    /// records copies the catalog does not know; run at start, before reconciling.
    pub(crate) async fn sweep(&self) -> Result<SweepReport, ReplicationError> {
        let mut report = SweepReport::default();
        let (store, blocks) = (self.store.clone(), self.blocks.clone());
        let (entries, own_blocks) = tokio::task::spawn_blocking(move || {
            Ok::<_, ReplicationError>((store.entries()?, blocks.photo_id_blocks()?))
        })
        .await??;
        let ids: Vec<u64> = entries.iter().map(|(id, _)| *id).collect();
        for chunk in ids.chunks(PAGE as usize) {
            let catalog = self.catalog.clone();
            let chunk = chunk.to_vec();
            let dead = tokio::task::spawn_blocking(move || catalog.tombstoned(&chunk)).await??;
            for id in dead {
                self.drop_local(id).await?;
                report.tombstoned += 1;
            }
        }
        let now = now_ms();
        // Others' photos held here, with their catalog rows, a page per query.
        let others: Vec<_> = entries
            .into_iter()
            .filter(|(id, _)| !own_blocks.iter().any(|b| b.contains(id)))
            .collect();
        let mut rows = HashMap::new();
        for chunk in others.chunks(PAGE as usize) {
            let catalog = self.catalog.clone();
            let ids: Vec<u64> = chunk.iter().map(|(id, _)| *id).collect();
            let found = tokio::task::spawn_blocking(move || catalog.copies_many(&ids)).await??;
            rows.extend(found.into_iter().map(|c| (c.id, c)));
        }
        for (id, entry) in others {
            match rows.remove(&id) {
                Some(c) if !c.holders.contains(&self.name) => {
                    let (catalog, name) = (self.catalog.clone(), self.name.clone());
                    tokio::task::spawn_blocking(move || catalog.add_copy(id, &name)).await??;
                    report.recorded += 1;
                }
                Some(_) => {}
                None if now - entry.meta.created_ms > ORPHAN_GRACE_MS
                    && self.store.contains(id)? =>
                {
                    self.drop_local(id).await?;
                    report.orphans += 1;
                }
                None => {}
            }
        }
        Ok(report)
    }

    /// Runs rounds until `stop` turns true.
    pub(crate) async fn run_worker(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut cursors = Cursors::default();
        let mut deletes_seen = now_ms();
        let mut next_blob_sweep = tokio::time::Instant::now();
        loop {
            if tokio::time::Instant::now() >= next_blob_sweep {
                match self.sweep_blobs().await {
                    Ok(swept) if swept.recorded + swept.removed > 0 => {
                        info!(
                            ?swept,
                            "plain objects' files recorded, and removed where no object names them"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "sweeping the plain objects' files failed; trying again")
                    }
                }
                next_blob_sweep += super::blobs::SWEEP_EVERY;
            }
            if let Err(e) = self.drop_deleted(&mut deletes_seen).await {
                warn!(error = %e, "checking for deleted photos failed; trying again");
            }
            if let Err(e) = self.round(&mut cursors).await {
                warn!(error = %e, "a replication round failed; trying again");
            }
            if let Err(e) = self.rebalance_round(&mut cursors.rebalance).await {
                warn!(error = %e, "a rebalancing round failed; trying again");
            }
            if let Err(e) = self.rebalance_blobs(&mut cursors.rebalance_files).await {
                warn!(error = %e, "a rebalancing round of plain objects failed; trying again");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.repair.interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Drops the local copies of photos deleted since `seen` (with some slack), which a delete
    /// could not reach while this node was unreachable; moves `seen` on.
    async fn drop_deleted(&self, seen: &mut i64) -> Result<(), ReplicationError> {
        let catalog = self.catalog.clone();
        let since = *seen - CLOCK_SLACK_MS;
        let recent = tokio::task::spawn_blocking(move || catalog.tombstones_since(since)).await??;
        for (id, deleted_ms) in recent {
            *seen = (*seen).max(deleted_ms);
            if self.store.contains(id)? {
                self.drop_local(id).await?;
                info!(photo = id, "dropped the copy of a photo deleted elsewhere");
            }
        }
        Ok(())
    }

    async fn round(&self, cursors: &mut Cursors) -> Result<(), ReplicationError> {
        let (free, low) = self.store.free_space()?;
        let free = if low { 0 } else { free };
        let catalog = self.catalog.clone();
        tokio::task::spawn_blocking(move || catalog.report_free_space(free)).await??;
        self.repair_round().await?;
        self.repair_blobs().await?;
        let budget = self.scrub_budget();
        self.scrub_round(&mut cursors.scrub, budget).await?;
        self.scrub_blobs(&mut cursors.scrub_files, budget).await?;
        let catalog = self.catalog.clone();
        let wanted = self.replicas();
        let (counts, files) = tokio::task::spawn_blocking(move || {
            Ok::<_, ReplicationError>((
                catalog.replication_counts(wanted)?,
                catalog.blob_counts(wanted)?,
            ))
        })
        .await??;
        self.metrics.replication.set_counts(&counts);
        self.metrics.replication.set_file_counts(&files);
        Ok(())
    }

    /// Copies this node's under-replicated photos until none is left or no node can take one.
    async fn repair_round(&self) -> Result<(), ReplicationError> {
        loop {
            let catalog = self.catalog.clone();
            let wanted = self.replicas();
            let short = tokio::task::spawn_blocking(move || catalog.under_replicated(wanted, PAGE))
                .await??;
            if short.is_empty() {
                return Ok(());
            }
            // Fresh, not the front door's cached list: a node removed a moment ago must not
            // be a target.
            let catalog = self.catalog.clone();
            let nodes = tokio::task::spawn_blocking(move || catalog.placement_nodes()).await??;
            let mut copied = 0;
            for batch in short.chunks(PARALLEL_COPIES) {
                let copies = batch.iter().map(|photo| self.copy_once(photo, &nodes));
                let done = futures::future::join_all(copies).await;
                copied += done.into_iter().filter(|d| *d).count();
            }
            if copied == 0 {
                return Ok(());
            }
            info!(copied, "repaired under-replicated photos");
        }
    }

    /// Copies `photo` to the best node that holds none; whether it did.
    async fn copy_once(&self, photo: &PhotoCopies, nodes: &[PlacementNode]) -> bool {
        let key = placement::key_of(&photo.meta.sha256);
        let Some(target) = placement::targets(key, nodes, &photo.holders)
            .into_iter()
            .next()
        else {
            return false;
        };
        let copy = match self.read_local_copy(photo.id).await {
            Ok(copy) => copy,
            Err(e) => {
                warn!(photo = photo.id, error = %e, "cannot read a photo to copy it");
                return false;
            }
        };
        let bytes = copy.original.len() as u64;
        let sent = self.front.peers.put_copy(&target.url, copy).await;
        self.repair_sent(sent, bytes, &format!("photo {}", photo.id), &target.name)
    }

    /// Counts a repair copy of `bytes` (of `what`, to node `to`) when it was `sent`, logs it
    /// when not; whether it was.
    pub(super) fn repair_sent(
        &self,
        sent: Result<(), tonic::Status>,
        bytes: u64,
        what: &str,
        to: &str,
    ) -> bool {
        match sent {
            Ok(()) => {
                self.metrics.replication.copies_made.inc();
                self.metrics.replication.copied_bytes.inc_by(bytes);
                true
            }
            Err(e) => {
                warn!(what, node = to, error = %e.message(), "a repair copy failed");
                false
            }
        }
    }

    /// Copies (and files) the scrub re-reads per round: a round's worth of its rate.
    fn scrub_budget(&self) -> u64 {
        (u64::from(self.repair.scrub_per_second) * self.repair.interval.as_millis() as u64)
            .div_ceil(1000)
    }

    /// Re-reads up to `per_round` local copies from `cursor` on, replacing damaged ones.
    async fn scrub_round(&self, cursor: &mut u64, per_round: u64) -> Result<(), ReplicationError> {
        if per_round == 0 {
            return Ok(());
        }
        let store = self.store.clone();
        let from = *cursor;
        let limit = usize::try_from(per_round).unwrap_or(usize::MAX);
        let ids = tokio::task::spawn_blocking(move || store.ids_after(from, limit)).await??;
        *cursor = ids.last().copied().unwrap_or(0);
        for id in ids {
            let store = self.store.clone();
            let read = tokio::task::spawn_blocking(move || store.original(id)).await?;
            self.metrics.replication.scrubbed.inc();
            match read {
                Ok(_) => {}
                Err(StoreError::Corrupt { .. }) => {
                    if let Err(e) = self.repair_local(id).await {
                        warn!(photo = id, error = %e, "a damaged copy could not be repaired yet");
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
