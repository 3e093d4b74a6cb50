//! A node lost mid-job on a replicated cluster, without starting over: the job keeps every
//! feature it received (the lost node's too), and the live holders of copies take over the
//! lost node's training photos not yet received, reading their own copies (or the copies'
//! stored features), into the runs not yet trained; training goes on, each photo trained once.
//! Where this cannot apply (see [`Intake::cannot_take_over`]), the failure stands and
//! `failover::finetune_surviving` runs the job again on the survivors.
//!
//! [`Intake::cannot_take_over`]: super::intake::Intake::cannot_take_over

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ndpipe_catalog::{ReplicaCatalog, Split, TaskName, TaskTruth};
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
        let (name, catalog, task) = (lost.name.clone(), map.clone(), self.req.task.clone());
        let orphans = tokio::task::spawn_blocking(move || {
            orphans(&*catalog, (&name, &task), &classes, &received)
        })
        .await
        .map_err(|e| TunerError::Internal(e.to_string()))??;
        let live_names: HashMap<&str, usize> = (self.nodes.iter().enumerate())
            .filter(|&(n, _)| n != i && !self.intake.is_lost(n))
            .map(|(n, node)| (node.name.as_str(), n))
            .collect();
        let pending: Vec<u32> = (self.intake.next_run() as u32..self.req.runs).collect();
        if pending.is_empty() && !orphans.is_empty() {
            return Err(failure());
        }
        let (groups, stranded) = assign(orphans, &live_names, &pending);
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
        if !self.balanced {
            self.balanced = true;
            self.skip_balance(format!(
                "{} was lost before the rates were known",
                lost.label()
            ));
        }
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
            source_lost: true,
        }
    }
}

/// Each photo of `orphans` for its holder among `live` (by name: node index) with the lowest
/// name, as `ReplicaCatalog::fail_over` picks the new primary, spread over the `pending` runs
/// (not empty); and the ids of those without a live holder.
fn assign(
    orphans: Vec<Orphan>,
    live: &HashMap<&str, usize>,
    pending: &[u32],
) -> (BTreeMap<usize, Vec<pb::LabelledPhoto>>, Vec<u64>) {
    let (mut groups, mut stranded) = (BTreeMap::<usize, Vec<_>>::new(), Vec::new());
    for (j, o) in orphans.into_iter().enumerate() {
        let holder = (o.holders.iter())
            .filter_map(|h| live.get(h.as_str()).map(|&n| (h, n)))
            .min();
        match holder {
            Some((_, n)) => groups.entry(n).or_default().push(pb::LabelledPhoto {
                run: pending[j % pending.len()],
                ..o.photo
            }),
            None => stranded.push(o.photo.id),
        }
    }
    (groups, stranded)
}

/// The training photos of the job's `task` whose primary is `node` (lost), of the job's
/// `classes`, not among those `received`, with their live holders other than `node`.
fn orphans(
    catalog: &dyn ReplicaCatalog,
    (node, task): (&str, &TaskName),
    classes: &HashMap<String, u32>,
    received: &HashSet<u64>,
) -> Result<Vec<Orphan>, TunerError> {
    let wanted: Vec<(TaskTruth, u32)> = catalog
        .task_truths_of(node, task)?
        .into_iter()
        .filter_map(|t| orphan_truth(t, classes, received))
        .collect();
    let mut out = Vec::with_capacity(wanted.len());
    for page in wanted.chunks(PAGE as usize) {
        let ids: Vec<u64> = page.iter().map(|(t, _)| t.id).collect();
        let holders: HashMap<u64, Vec<String>> = catalog
            .copies_many(&ids)?
            .into_iter()
            .map(|c| (c.id, c.holders))
            .collect();
        for (truth, label) in page {
            let Some(holders) = holders.get(&truth.id) else {
                continue;
            };
            out.push(Orphan {
                photo: pb::LabelledPhoto {
                    id: truth.id,
                    label: *label,
                    run: 0,
                    sha256: truth.sha256.clone(),
                },
                holders: holders.iter().filter(|h| *h != node).cloned().collect(),
            });
        }
    }
    Ok(out)
}

/// A training photo of the job not `received`, with its class index.
fn orphan_truth(
    truth: TaskTruth,
    classes: &HashMap<String, u32>,
    received: &HashSet<u64>,
) -> Option<(TaskTruth, u32)> {
    let label = *classes.get(&truth.label)?;
    let wanted = truth.split == Split::Train && !received.contains(&truth.id);
    wanted.then_some((truth, label))
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap, HashSet};

    use ndpipe_catalog::{Split, TaskTruth};
    use ndpipe_proto::pb::{self, Part, extract_event::Event};
    use ndpipe_proto::{Features, decode_chunk, encode_chunk};

    use super::{Orphan, assign, orphan_truth};
    use crate::finetune::intake::Intake;
    use crate::finetune::streams::Source;

    fn truth(id: u64, label: &str, split: Split) -> TaskTruth {
        TaskTruth {
            id,
            label: label.into(),
            split,
            sha256: format!("sha{id}"),
        }
    }

    #[test]
    fn only_the_lost_nodes_training_photos_not_received_are_taken_over() {
        let classes = HashMap::from([("shirt".to_string(), 1)]);
        let received = HashSet::from([2]);
        let pick = |t| orphan_truth(t, &classes, &received).map(|(t, label)| (t.id, label));
        assert_eq!(pick(truth(1, "shirt", Split::Train)), Some((1, 1)));
        let left_alone = [
            (truth(2, "shirt", Split::Train), "received"),
            (truth(4, "shirt", Split::Val), "validation"),
            (truth(5, "coat", Split::Train), "not in the job"),
        ];
        for (t, why) in left_alone {
            assert!(pick(t).is_none(), "{why}");
        }
    }

    #[test]
    fn each_photo_goes_to_its_lowest_named_live_holder_over_the_runs_left() {
        let orphan = |id, holders: &[&str]| Orphan {
            photo: pb::LabelledPhoto {
                id,
                ..Default::default()
            },
            holders: holders.iter().map(|h| h.to_string()).collect(),
        };
        let live = HashMap::from([("a", 0), ("b", 1)]);
        let orphans = vec![
            orphan(1, &["b", "a"]),
            orphan(2, &["b", "x"]),
            orphan(3, &["x"]),
            orphan(4, &["b"]),
        ];
        let (groups, stranded) = assign(orphans, &live, &[1, 2]);
        let ids_runs = |n| groups[&n].iter().map(|p| (p.id, p.run)).collect::<Vec<_>>();
        assert_eq!(ids_runs(0), [(1, 1)], "a before b");
        assert_eq!(ids_runs(1), [(2, 2), (4, 2)]);
        assert_eq!(stranded, [3], "x is not live");
    }

    fn chunk(part: Part, run: u32, seq: u32, ids: std::ops::Range<u64>) -> Event {
        let features = Features {
            values: vec![0.5; (ids.end - ids.start) as usize * 2],
            dim: 2,
            labels: ids.clone().map(|_| 0).collect(),
            photo_ids: ids.collect(),
        };
        Event::Chunk(encode_chunk(part, run, seq, &features))
    }

    fn ready(part: Part, run: u32) -> Event {
        Event::RunReady(pb::RunReady {
            part: part as i32,
            run,
            ..Default::default()
        })
    }

    fn feed(intake: &mut Intake, source: Source, event: Event) {
        if let Some(c) = intake.on_event(source, event) {
            let features = decode_chunk(&c, intake.classes()).unwrap();
            intake.add(source, c.part, c.run, features).unwrap();
        }
    }

    #[test]
    fn a_lost_node_keeps_what_it_sent_and_runs_wait_only_for_its_take_overs() {
        let labels = vec!["a (node 1)".into(), "c (node 2)".into()];
        let mut i = Intake::new(labels, 2, 2, 2, false);
        let (a, c) = (Source::Node(0), Source::Node(1));
        feed(&mut i, c, chunk(Part::Val, 0, 0, 0..2));
        assert_eq!(
            i.cannot_take_over(1),
            Some("its validation set was incomplete")
        );
        feed(&mut i, c, ready(Part::Val, 0));
        feed(&mut i, c, chunk(Part::Train, 0, 1, 10..13));
        assert_eq!(i.cannot_take_over(1), None);
        assert_eq!(i.received(1), HashSet::from([0, 1, 10, 11, 12]));
        i.lose(1);
        feed(&mut i, c, chunk(Part::Train, 0, 2, 13..15));
        assert_eq!(i.received(1).len(), 5, "nothing more from a lost node");
        assert!(i.on_ended(c).is_ok());
        let t = Source::TakeOver(i.add_lost_takeover(1, 0, BTreeSet::from([0])));
        for event in [
            ready(Part::Val, 0),
            ready(Part::Train, 0),
            ready(Part::Train, 1),
        ] {
            feed(&mut i, a, event);
        }
        assert!(
            i.next_ready_run().is_none(),
            "run 0 waits for the take-over"
        );
        feed(&mut i, t, chunk(Part::Train, 0, 1_000_000, 13..15));
        feed(&mut i, t, ready(Part::Train, 0));
        let (run, data) = i.next_ready_run().unwrap();
        assert_eq!((run, data.len()), (0, 5), "c's 3 photos kept, 2 taken over");
        assert_eq!(
            i.next_ready_run().map(|r| r.0),
            Some(1),
            "nothing of run 1 moved"
        );
        assert_eq!(
            i.trained(),
            [vec![13, 14], vec![10, 11, 12]],
            "taken over: a's now"
        );
        let reports = i.node_reports();
        assert_eq!((reports[0].images, reports[1].images), (2, 5));
    }
}
