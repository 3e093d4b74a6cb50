//! The job's bookkeeping of what the streams sent: each node's progress, the take-overs, and the
//! validation set and training runs being collected, with the checks every chunk passes.

use std::collections::{BTreeSet, HashSet};

use ndpipe_proto::Features;
use ndpipe_proto::pb::{self, extract_event::Event};

use super::cached::RemoteRow;
use super::quality::ClassMeans;
use super::report::NodeReport;
use super::streams::{Source, wire_bytes};
use super::trainer::RunData;
use crate::TunerError;

/// A node's progress in the job.
#[derive(Debug, Default)]
struct NodeState {
    val_ready: bool,
    runs_ready: BTreeSet<u32>,
    done: bool,
    /// Lost mid-job: what it sent is kept, take-overs send the rest.
    lost: bool,
    /// Its validation photos received (before any is left out).
    val_ids: Vec<u64>,
    /// Photos whose features it sent, take-overs included.
    images: u64,
    extracted: u64,
    deleted: u64,
    seconds: f64,
    rate: f64,
    /// Photos of its own it has extracted, and has in all (validation included).
    extracted_so_far: u64,
    total: u64,
}

/// Work the fast node took over from the slow one, streamed as [`Source::TakeOver`].
#[derive(Debug)]
struct TakeOver {
    fast: usize,
    slow: usize,
    /// The node the photos are booked to: the slow node's, or the fast node's when it takes
    /// over a lost node's photos (it is their primary now).
    owner: usize,
    /// The runs its photos belong to, and those it has sent in full.
    runs: BTreeSet<u32>,
    runs_ready: BTreeSet<u32>,
    done: bool,
}

/// What the job has received so far.
#[derive(Debug)]
pub(crate) struct Intake {
    /// Node labels, for messages.
    labels: Vec<String>,
    classes: usize,
    dim: usize,
    /// Training rows are kept by reference (read through a cache later), not as features.
    by_reference: bool,
    nodes: Vec<NodeState>,
    takeovers: Vec<TakeOver>,
    seen: HashSet<(Source, i32, u32, u32)>,
    val: Features,
    runs: Vec<Features>,
    remote: Vec<Vec<RemoteRow>>,
    next_run: usize,
    bytes: u64,
    /// Bytes between nodes for the take-overs, as they reported them.
    peer_bytes: u64,
    refetched: u64,
    /// Per node, the photos an ancestor of the new version trained on: left out of validation.
    trained_before: Vec<HashSet<u64>>,
    /// Validation photos left out for that reason.
    val_left_out: u64,
    /// Per node, the photos this job trains on.
    trained: Vec<Vec<u64>>,
    /// The class means of the training features received (the novelty check's).
    means: ClassMeans,
}

impl Intake {
    /// Nothing received yet from the nodes named `labels`, for a job of `runs` runs over
    /// `classes` classes and `dim`-d features.
    pub(crate) fn new(
        labels: Vec<String>,
        runs: usize,
        classes: usize,
        dim: usize,
        by_reference: bool,
    ) -> Self {
        let nodes = labels.len();
        Intake {
            nodes: labels.iter().map(|_| NodeState::default()).collect(),
            labels,
            classes,
            dim,
            by_reference,
            takeovers: Vec::new(),
            seen: HashSet::new(),
            val: empty(dim),
            runs: (0..runs).map(|_| empty(dim)).collect(),
            remote: (0..runs).map(|_| Vec::new()).collect(),
            next_run: 0,
            bytes: 0,
            peer_bytes: 0,
            refetched: 0,
            trained_before: vec![HashSet::new(); nodes],
            val_left_out: 0,
            trained: vec![Vec::new(); nodes],
            means: ClassMeans::new(classes, dim),
        }
    }

    /// Leaves out of validation, per node (in the order of the nodes), the photos an ancestor
    /// of the new version trained on.
    pub(crate) fn leave_out_of_val(&mut self, trained_before: Vec<HashSet<u64>>) {
        if trained_before.len() == self.trained.len() {
            self.trained_before = trained_before;
        }
    }

    /// The photos this job trains on, per node (in the order of the nodes), sorted.
    pub(crate) fn trained(&self) -> Vec<Vec<u64>> {
        self.trained
            .iter()
            .map(|ids| {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect()
    }

    /// Validation photos left out because an ancestor version trained on them.
    pub(crate) fn val_left_out(&self) -> u64 {
        self.val_left_out
    }

    /// The job's number of classes (labels of a chunk must be below it).
    pub(crate) fn classes(&self) -> usize {
        self.classes
    }

    /// Records a take-over of `slow`'s photos of `runs` by `fast`; returns its index for
    /// [`Source::TakeOver`].
    pub(crate) fn add_takeover(&mut self, slow: usize, fast: usize, runs: BTreeSet<u32>) -> usize {
        self.takeovers.push(TakeOver {
            fast,
            slow,
            owner: slow,
            runs,
            runs_ready: BTreeSet::new(),
            done: false,
        });
        self.takeovers.len() - 1
    }

    /// Records that node `lost` is gone: what it sent stays, its events are ignored from now
    /// on, and runs no longer wait for it.
    pub(crate) fn lose(&mut self, lost: usize) {
        self.nodes[lost].lost = true;
    }

    /// Whether node `i` was lost mid-job.
    pub(crate) fn is_lost(&self, i: usize) -> bool {
        self.nodes[i].lost
    }

    /// Why the photos of node `i`, lost, cannot be taken over in the job, if they cannot: its
    /// validation set is incomplete, a load-balancing take-over involves it, or training reads
    /// features through the cache (rows stay on the node that sent them).
    pub(crate) fn cannot_take_over(&self, i: usize) -> Option<&'static str> {
        if self.by_reference {
            Some("training reads features through the cache")
        } else if !self.nodes[i].val_ready {
            Some("its validation set was incomplete")
        } else if self.takeovers.iter().any(|t| t.fast == i || t.slow == i) {
            Some("load balancing had moved work from or to it")
        } else {
            None
        }
    }

    /// The photos node `i` sent, validation and training.
    pub(crate) fn received(&self, i: usize) -> HashSet<u64> {
        self.nodes[i]
            .val_ids
            .iter()
            .chain(&self.trained[i])
            .copied()
            .collect()
    }

    /// The validation photos each node sent (by node index), as their owner.
    pub(crate) fn val_owners(&self) -> Vec<(usize, Vec<u64>)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.val_ids.clone()))
            .collect()
    }

    /// The first run not yet handed to the trainer.
    pub(crate) fn next_run(&self) -> usize {
        self.next_run
    }

    /// Records a take-over by `fast` of photos of `lost` (now `fast`'s, as their primary) in
    /// `runs`; returns its index for [`Source::TakeOver`].
    pub(crate) fn add_lost_takeover(
        &mut self,
        lost: usize,
        fast: usize,
        runs: BTreeSet<u32>,
    ) -> usize {
        let k = self.add_takeover(lost, fast, runs);
        self.takeovers[k].owner = fast;
        k
    }

    /// The node that sends `source`'s chunks.
    pub(crate) fn sender(&self, source: Source) -> usize {
        match source {
            Source::Node(i) => i,
            Source::TakeOver(k) => self.takeovers[k].fast,
        }
    }

    /// Books an event; returns a chunk seen for the first time, for the caller to decode and
    /// [`add`](Self::add). A chunk seen before (a node re-sent it), or from a lost node, is
    /// dropped.
    pub(crate) fn on_event(&mut self, source: Source, event: Event) -> Option<pb::FeatureChunk> {
        if matches!(source, Source::Node(i) if self.nodes[i].lost) {
            return None;
        }
        match (source, event) {
            (_, Event::Chunk(chunk)) => {
                if !self.seen.insert((source, chunk.part, chunk.run, chunk.seq)) {
                    return None;
                }
                self.bytes += wire_bytes(&chunk);
                return Some(chunk);
            }
            (Source::Node(i), Event::RunReady(ready)) => {
                if ready.part == pb::Part::Val as i32 {
                    self.nodes[i].val_ready = true;
                } else {
                    self.nodes[i].runs_ready.insert(ready.run);
                }
            }
            (Source::Node(i), Event::Throughput(t)) => {
                let node = &mut self.nodes[i];
                node.rate = t.images_per_second;
                (node.extracted_so_far, node.total) = (t.done, t.total);
            }
            (Source::Node(i), Event::Done(done)) => {
                let node = &mut self.nodes[i];
                node.done = true;
                node.extracted += done.extracted;
                node.deleted = done.deleted;
                node.seconds = done.seconds;
            }
            (Source::TakeOver(k), Event::Done(done)) => {
                let t = &mut self.takeovers[k];
                t.done = true;
                self.nodes[t.fast].extracted += done.extracted;
                self.peer_bytes += done.peer_bytes;
            }
            (Source::TakeOver(k), Event::RunReady(ready)) => {
                self.takeovers[k].runs_ready.insert(ready.run);
            }
            (Source::TakeOver(_), Event::Throughput(_)) => {}
        }
        None
    }

    /// Counts a chunk fetched again after a checksum failure.
    pub(crate) fn on_refetched(&mut self, chunk: &pb::FeatureChunk) {
        self.refetched += 1;
        self.bytes += wire_bytes(chunk);
    }

    /// Adds the decoded features of a chunk of `part` and `run` from `source`.
    pub(crate) fn add(
        &mut self,
        source: Source,
        part: i32,
        run: u32,
        features: Features,
    ) -> Result<(), TunerError> {
        if features.dim != self.dim {
            return Err(self.blame(
                source,
                &format!("sent {}-d features, expected {}", features.dim, self.dim),
            ));
        }
        let (credited, owner) = match source {
            Source::Node(i) => (i, i),
            Source::TakeOver(k) => (self.takeovers[k].fast, self.takeovers[k].owner),
        };
        self.nodes[credited].images += features.len() as u64;
        if part == pb::Part::Val as i32 {
            self.nodes[owner]
                .val_ids
                .extend_from_slice(&features.photo_ids);
            let before = &self.trained_before[owner];
            let (kept, left_out) = without(features, |id| before.contains(&id));
            self.val_left_out += left_out;
            append(&mut self.val, kept);
            return Ok(());
        }
        self.trained[owner].extend_from_slice(&features.photo_ids);
        self.means.add(&features);
        let runs = self.runs.len();
        let out_of_range = || format!("sent run {run} of {runs}");
        let k = run as usize;
        if self.by_reference {
            let Some(rows) = self.remote.get_mut(k) else {
                return Err(self.blame(source, &out_of_range()));
            };
            rows.extend(rows_of(owner, &features));
        } else {
            let Some(target) = self.runs.get_mut(k) else {
                return Err(self.blame(source, &out_of_range()));
            };
            append(target, features);
        }
        Ok(())
    }

    /// The error for a stream that ended: none once it was done.
    pub(crate) fn on_ended(&self, source: Source) -> Result<(), TunerError> {
        match source {
            Source::Node(i) if !self.nodes[i].done && !self.nodes[i].lost => {
                Err(self.blame(source, "its feature stream ended before the job was done"))
            }
            Source::TakeOver(k) if !self.takeovers[k].done => {
                Err(self.blame(source, "its take-over stream ended early"))
            }
            _ => Ok(()),
        }
    }

    /// The error for `source` failing with `message`. A take-over's failure is its fast node's,
    /// naming the slow node whose work it was.
    pub(crate) fn blame(&self, source: Source, message: &str) -> TunerError {
        let (node, message) = match source {
            Source::Node(i) => (i, message.to_string()),
            Source::TakeOver(k) => {
                let t = &self.takeovers[k];
                (
                    t.fast,
                    format!(
                        "taking over work from {} failed: {message}",
                        self.labels[t.slow]
                    ),
                )
            }
        };
        TunerError::Node {
            node: self.labels[node].clone(),
            message,
        }
    }

    /// Whether every node has sent its validation set.
    pub(crate) fn all_val_ready(&self) -> bool {
        self.nodes.iter().all(|n| n.val_ready || n.lost)
    }

    /// Whether every node has sent everything of its own, and every take-over its photos.
    pub(crate) fn all_done(&self) -> bool {
        self.nodes.iter().all(|n| n.done || n.lost) && self.takeovers.iter().all(|t| t.done)
    }

    /// Whether load balancing can be planned: every node has sent its validation set, and has
    /// measured its throughput (on the validation set, or else on its first training chunks)
    /// or is done.
    pub(crate) fn rates_known(&self) -> bool {
        self.all_val_ready() && self.nodes.iter().all(|n| n.rate > 0.0 || n.done || n.lost)
    }

    /// Each node's last reported throughput, images/s (0 for none).
    pub(crate) fn rates(&self) -> Vec<f64> {
        self.nodes.iter().map(|n| n.rate).collect()
    }

    /// Each node's photos not yet extracted, as it last reported (0 once done).
    pub(crate) fn remaining(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| match n.done {
                true => 0,
                false => n.total.saturating_sub(n.extracted_so_far),
            })
            .collect()
    }

    /// The next run to train, once every node has sent it and the validation set, and every
    /// take-over holding photos of it has sent them.
    pub(crate) fn next_ready_run(&mut self) -> Option<(usize, RunData)> {
        let k = self.next_run;
        let run = k as u32;
        let ready = k < self.runs.len()
            && self
                .nodes
                .iter()
                .all(|n| n.lost || (n.val_ready && n.runs_ready.contains(&run)))
            && self
                .takeovers
                .iter()
                .all(|t| t.done || !t.runs.contains(&run) || t.runs_ready.contains(&run));
        if !ready {
            return None;
        }
        self.next_run += 1;
        let data = if self.by_reference {
            RunData::Remote(std::mem::take(&mut self.remote[k]))
        } else {
            let run = std::mem::replace(&mut self.runs[k], empty(self.dim));
            RunData::Memory {
                values: run.values,
                labels: run.labels,
            }
        };
        Some((k, data))
    }

    /// The validation set, for the trainer (a copy stays, for the figures after training).
    pub(crate) fn val(&self) -> Features {
        self.val.clone()
    }

    /// The class means of the training features received.
    pub(crate) fn means(&self) -> &ClassMeans {
        &self.means
    }

    /// Bytes of features, labels and ids received, re-fetches included.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes that crossed between nodes for the take-overs.
    pub(crate) fn peer_bytes(&self) -> u64 {
        self.peer_bytes
    }

    /// Chunks fetched again.
    pub(crate) fn refetched(&self) -> u64 {
        self.refetched
    }

    /// Photos received, validation and training, all nodes.
    pub(crate) fn images(&self) -> u64 {
        self.nodes.iter().map(|n| n.images).sum()
    }

    /// Per-node figures.
    pub(crate) fn node_reports(&self) -> Vec<NodeReport> {
        self.labels
            .iter()
            .zip(&self.nodes)
            .map(|(label, n)| NodeReport {
                node: label.clone(),
                images: n.images,
                extracted: n.extracted,
                deleted: n.deleted,
                seconds: n.seconds,
                images_per_second: n.rate,
            })
            .collect()
    }
}

fn empty(dim: usize) -> Features {
    Features {
        values: Vec::new(),
        dim,
        labels: Vec::new(),
        photo_ids: Vec::new(),
    }
}

/// `features` without the rows whose photo id `drop` names, and how many were dropped.
fn without(features: Features, drop: impl Fn(u64) -> bool) -> (Features, u64) {
    if !features.photo_ids.iter().any(|&id| drop(id)) {
        return (features, 0);
    }
    let mut kept = empty(features.dim);
    let mut dropped = 0;
    let rows = features.values.chunks_exact(features.dim.max(1));
    for ((row, &label), &id) in rows.zip(&features.labels).zip(&features.photo_ids) {
        if drop(id) {
            dropped += 1;
        } else {
            kept.values.extend_from_slice(row);
            kept.labels.push(label);
            kept.photo_ids.push(id);
        }
    }
    (kept, dropped)
}

fn append(target: &mut Features, more: Features) {
    target.values.extend(more.values);
    target.labels.extend(more.labels);
    target.photo_ids.extend(more.photo_ids);
}

fn rows_of(node: usize, f: &Features) -> impl Iterator<Item = RemoteRow> + '_ {
    f.photo_ids
        .iter()
        .zip(&f.labels)
        .map(move |(photo, label)| RemoteRow {
            node,
            photo: *photo,
            label: *label,
        })
}

#[cfg(test)]
mod tests;
