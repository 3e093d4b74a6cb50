//! A node lost mid-job on a replicated cluster, without starting over: the job keeps every
//! feature it received (the lost node's too), and the live holders of copies take over the
//! lost node's training photos not yet received, reading their own copies (or the copies'
//! stored features), into the runs not yet trained; training goes on, each photo trained once.
//! Where this cannot apply (see [`Intake::cannot_take_over`]), the failure stands and
//! `failover::finetune_surviving` runs the job again on the survivors.
//!
//! [`Intake::cannot_take_over`]: super::intake::Intake::cannot_take_over

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ndpipe_catalog::{PhotoCopies, ReplicaCatalog, Split};
use ndpipe_proto::pb;
use tokio::sync::mpsc;
use tracing::warn;

use super::Job;
use super::streams::{self, Msg, Source};
use crate::TunerError;
use crate::failover::{FailedOver, answers};

/// Catalog rows read per page when listing the lost node's photos.
const PAGE: u32 = 1000;

/// A photo of the lost node to take over: its wire form (run not yet set) and live holders.
struct Orphan {
    photo: pb::LabelledPhoto,
    holders: Vec<String>,
}

impl Job<'_> {
    /// Handles node `i`'s stream failing with `message`: its photos not yet received pass to
    /// live holders of copies, and the job goes on. Otherwise (no replica map, the node still
    /// answers, the job's state does not allow it) the error for the failure, unchanged; photos
    /// with no live copy fail the job, named.
    pub(super) async fn on_node_failed(
        &mut self,
        i: usize,
        message: &str,
    ) -> Result<(), TunerError> {
        let failure = || self.intake.blame(Source::Node(i), message);
        let Some(map) = self.replicas.clone() else {
            return Err(failure());
        };
        let live = (0..self.nodes.len())
            .filter(|&n| !self.intake.is_lost(n))
            .count();
        if let Some(why) = self.intake.cannot_take_over(i) {
            warn!(node = %self.nodes[i].label(), reason = why, "a lost node's work cannot be taken over in the job");
            return Err(failure());
        }
        if live < 2 || self.next_rx.is_some() || answers(&self.nodes[i]).await {
            return Err(failure());
        }
        let lost = self.nodes[i].clone();
        let classes: HashMap<String, u32> = (self.classes.iter().cloned()).zip(0..).collect();
        let received = self.intake.received(i);
        let (name, catalog) = (lost.name.clone(), map.clone());
        let orphans =
            tokio::task::spawn_blocking(move || orphans(&*catalog, &name, &classes, &received))
                .await
                .map_err(|e| TunerError::Internal(e.to_string()))??;
        let by_name: HashMap<&str, usize> = (self.nodes.iter().enumerate())
            .filter(|&(n, _)| n != i && !self.intake.is_lost(n))
            .map(|(n, node)| (node.name.as_str(), n))
            .collect();
        let pending: Vec<u32> = (self.intake.next_run() as u32..self.req.runs).collect();
        let (mut groups, mut stranded) = (BTreeMap::<usize, Vec<_>>::new(), Vec::new());
        for (j, o) in orphans.into_iter().enumerate() {
            // The lowest name, as `ReplicaCatalog::fail_over` picks the new primary.
            let holder = (o.holders.iter().filter_map(|h| by_name.get(h.as_str())))
                .min_by_key(|&&n| &self.nodes[n].name);
            match (holder, pending.get(j % pending.len().max(1))) {
                (Some(&n), Some(&run)) => groups
                    .entry(n)
                    .or_default()
                    .push(pb::LabelledPhoto { run, ..o.photo }),
                _ => stranded.push(o.photo.id),
            }
        }
        if !stranded.is_empty() {
            let shown: Vec<u64> = stranded.iter().take(100).copied().collect();
            return Err(failure_with(
                failure(),
                format!(
                    "{} of its photos not yet received have no copy on a live node of the job (ids {shown:?}{})",
                    stranded.len(),
                    if stranded.len() > shown.len() {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            ));
        }
        let name = lost.name.clone();
        let moved = tokio::task::spawn_blocking(move || map.fail_over(&name))
            .await
            .map_err(|e| TunerError::Internal(e.to_string()))??;
        self.intake.lose(i);
        self.balanced = true;
        let tx = self.sender();
        let mut taken_over = BTreeMap::new();
        for (fast, photos) in groups {
            taken_over.insert(self.nodes[fast].label(), photos.len() as u64);
            let runs: BTreeSet<u32> = photos.iter().map(|p| p.run).collect();
            let k = self.intake.add_lost_takeover(i, fast, runs);
            let request = self.takeover_request(k, &lost.url, fast, photos);
            streams::spawn_takeover(
                k,
                &self.nodes[fast],
                request,
                tx.clone(),
                self.ingress.clone(),
            );
        }
        let kept = self.intake.received(i).len() as u64;
        warn!(node = %lost.label(), kept, taken_over = ?taken_over, reason = %message,
            "a node was lost during the fine-tune; live holders of copies take over its photos not yet received");
        self.failed_over.push(FailedOver {
            node: lost.name.clone(),
            reason: message.to_string(),
            photos_moved: moved.moved,
            kept,
            taken_over,
            rerun: false,
        });
        Ok(())
    }

    /// A sender into the job's channel; a new channel, read once the old one is drained, when
    /// every stream of the old one has ended.
    fn sender(&mut self) -> mpsc::Sender<Msg> {
        if let Some(tx) = self.tx.upgrade() {
            return tx;
        }
        let (tx, rx) = mpsc::channel(64);
        self.next_rx = Some(rx);
        self.tx = tx.downgrade();
        tx
    }

    /// The take-over request `k` for node `fast`: `photos` of the lost node at `lost_url`, in
    /// the job's mode, throttle and bandwidth cap.
    fn takeover_request(
        &self,
        k: usize,
        lost_url: &str,
        fast: usize,
        mut photos: Vec<pb::LabelledPhoto>,
    ) -> pb::TakeOverRequest {
        photos.sort_by_key(|p| (p.run, p.id));
        let node = &self.nodes[fast];
        pb::TakeOverRequest {
            job_id: self.job_id.to_string(),
            source_url: lost_url.to_string(),
            photos,
            chunk_size: self.req.chunk_size,
            first_seq: 1_000_000 * (k as u32 + 1),
            timeout_ms: u32::try_from(node.timeout().as_millis()).unwrap_or(u32::MAX),
            use_stored_features: self.req.use_stored_features,
            ship_tensors: self.conventional.is_some(),
            throttle_images_per_second: self.req.throttle.get(&node.name).copied().unwrap_or(0.0),
            bandwidth_bytes_per_second: self.req.bandwidth_bytes_per_second,
        }
    }
}

/// The training photos of the job whose primary is `node` (lost), of the job's `classes`,
/// not among those `received`, with their live holders other than `node`.
fn orphans(
    catalog: &dyn ReplicaCatalog,
    node: &str,
    classes: &HashMap<String, u32>,
    received: &HashSet<u64>,
) -> Result<Vec<Orphan>, TunerError> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = catalog.list_cluster(after, PAGE)?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        after = Some(last.id);
        out.extend(
            page.into_iter()
                .filter_map(|p| orphan(p, node, classes, received)),
        );
    }
}

fn orphan(
    p: PhotoCopies,
    node: &str,
    classes: &HashMap<String, u32>,
    received: &HashSet<u64>,
) -> Option<Orphan> {
    let truth = p.meta.ground_truth.as_ref()?;
    let label = *classes.get(&truth.label)?;
    let wanted = p.primary == node && truth.split == Split::Train && !received.contains(&p.id);
    wanted.then(|| Orphan {
        photo: pb::LabelledPhoto {
            id: p.id,
            label,
            run: 0,
            sha256: p.meta.sha256.clone(),
        },
        holders: p.holders.into_iter().filter(|h| h != node).collect(),
    })
}

/// `error` (a node's) with `more` added to its message.
fn failure_with(error: TunerError, more: String) -> TunerError {
    match error {
        TunerError::Node { node, message } => TunerError::Node {
            node,
            message: format!("{message}; {more}"),
        },
        other => other,
    }
}
