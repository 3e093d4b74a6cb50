//! A rollout's load balancing, Tuner side. Once every node has reported its first batch (its
//! photos left and the staged backbone's model-only rate, timed before its pass), each node's
//! share of the work left should be in proportion to its rate; a node above its share gives
//! the excess, the photos its pass has not reached, to nodes below theirs
//! (`GiveBackbonePhotos`), which run the staged backbone over them and store the outputs on it
//! (`TakeOverBackbone`). Balancing only speeds the job up: a call that fails is logged, and the
//! giving node's commit computes what no node stored.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ndpipe_proto::pb;
use ndpipe_util::sync::lock;
use tracing::{info, warn};

use crate::nodes::Node;

/// Polls of the nodes' progress before their rates are known, and the pause between two.
const WATCH_POLLS: u32 = 12_000;
const WATCH_POLL: Duration = Duration::from_millis(50);
/// Moves smaller than this many photos are not worth the calls.
const MIN_MOVE: u64 = 8;

/// The nodes' latest extraction progress, shared between their streams and the balancer.
pub(crate) struct Watch {
    seen: Mutex<Vec<Option<Seen>>>,
    finished: AtomicUsize,
}

/// One node's latest progress.
#[derive(Clone, Copy)]
struct Seen {
    left: u64,
    model_only: f64,
}

/// Photos one node gave away and took over.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Shared {
    pub(crate) given: u64,
    pub(crate) taken: u64,
}

impl Watch {
    /// A watch over `nodes` extraction streams.
    pub(crate) fn new(nodes: usize) -> Self {
        Watch {
            seen: Mutex::new(vec![None; nodes]),
            finished: AtomicUsize::new(0),
        }
    }

    /// Node `i` reported `p`.
    pub(crate) fn saw(&self, i: usize, p: &pb::ExtractBackboneProgress) {
        lock(&self.seen)[i] = Some(Seen {
            left: p.total.saturating_sub(p.done),
            model_only: p.model_only_images_per_second,
        });
    }

    /// A node's extraction ended (done or failed for good).
    pub(crate) fn finish(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    /// Every node's photos left and rate, once every node reported one and none finished.
    fn rated(&self) -> Option<(Vec<u64>, Vec<f64>)> {
        let seen = lock(&self.seen);
        let all: Option<Vec<Seen>> = seen.iter().copied().collect();
        all.map(|s| {
            (
                s.iter().map(|n| n.left).collect(),
                s.iter().map(|n| n.model_only).collect(),
            )
        })
    }
}

/// Balances the rollout of backbone `sha` over `nodes` once their rates are known (see the
/// module's doc); returns each node's photos given and taken, and the seconds until the last
/// take-over ended.
pub(crate) async fn balance(nodes: &[Node], sha: &str, watch: &Watch) -> (Vec<Shared>, f64) {
    let started = Instant::now();
    let mut shared = vec![Shared::default(); nodes.len()];
    let mut rated = None;
    for _ in 0..WATCH_POLLS {
        if watch.finished.load(Ordering::SeqCst) > 0 {
            break;
        }
        rated = watch.rated();
        if rated.is_some() {
            break;
        }
        tokio::time::sleep(WATCH_POLL).await;
    }
    let Some((left, rates)) = rated else {
        return (shared, 0.0);
    };
    let moves = proportional_moves(&left, &rates, MIN_MOVE);
    let moved = futures::future::join_all(
        moves
            .iter()
            .map(|&(slow, fast, n)| hand_off(&nodes[slow], &nodes[fast], sha, n)),
    )
    .await;
    for (&(slow, fast, _), (given, taken)) in moves.iter().zip(moved) {
        shared[slow].given += given;
        shared[fast].taken += taken;
    }
    (shared, started.elapsed().as_secs_f64())
}

/// `slow` gives up to `n` photos to `fast`; returns the photos given and those `fast` stored.
async fn hand_off(slow: &Node, fast: &Node, sha: &str, n: u64) -> (u64, u64) {
    let request = pb::GiveBackbonePhotosRequest {
        backbone_version: sha.to_string(),
        give: u32::try_from(n).unwrap_or(u32::MAX),
    };
    let photos = match slow
        .unary(request, |mut c, r| async move {
            c.give_backbone_photos(r).await
        })
        .await
    {
        Ok(reply) => reply.photos,
        Err(e) => {
            warn!(node = %slow.label(), error = %e.message(), "giving rollout photos away failed");
            return (0, 0);
        }
    };
    let given = photos.len() as u64;
    if photos.is_empty() {
        return (0, 0);
    }
    info!(from = %slow.label(), to = %fast.label(), photos = given, "rollout load balancing");
    let request = pb::TakeOverBackboneRequest {
        backbone_version: sha.to_string(),
        source_url: slow.url.clone(),
        photos,
        timeout_ms: u32::try_from(fast.timeout().as_millis()).unwrap_or(u32::MAX),
    };
    match fast
        .unary(
            request,
            |mut c, r| async move { c.take_over_backbone(r).await },
        )
        .await
    {
        Ok(reply) => (given, reply.taken),
        Err(e) => {
            warn!(from = %slow.label(), to = %fast.label(), error = %e.message(),
                "a rollout take-over failed: the giving node's commit computes its photos");
            (given, 0)
        }
    }
}

/// Moves (from, to, photos) that bring each node's photos `left` to its share of their sum in
/// proportion to its rate; nodes without a positive rate neither give nor take, and moves under
/// `min` photos are dropped.
fn proportional_moves(left: &[u64], rates: &[f64], min: u64) -> Vec<(usize, usize, u64)> {
    let usable: Vec<usize> = (0..left.len())
        .filter(|&i| rates[i].is_finite() && rates[i] > 0.0)
        .collect();
    let work: u64 = usable.iter().map(|&i| left[i]).sum();
    let speed: f64 = usable.iter().map(|&i| rates[i]).sum();
    if usable.len() < 2 {
        return Vec::new();
    }
    let share = |i: usize| (work as f64 * rates[i] / speed).round() as u64;
    let mut over: Vec<(usize, u64)> = Vec::new();
    let mut under: Vec<(usize, u64)> = Vec::new();
    for &i in &usable {
        let s = share(i);
        if left[i] > s {
            over.push((i, left[i] - s));
        } else if s > left[i] {
            under.push((i, s - left[i]));
        }
    }
    let mut moves = Vec::new();
    let (mut a, mut b) = (0, 0);
    while a < over.len() && b < under.len() {
        let n = over[a].1.min(under[b].1);
        if n >= min.max(1) {
            moves.push((over[a].0, under[b].0, n));
        }
        over[a].1 -= n;
        under[b].1 -= n;
        a += usize::from(over[a].1 == 0);
        b += usize::from(under[b].1 == 0);
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::proportional_moves;

    #[test]
    fn a_four_times_slower_node_keeps_a_fifth_of_the_work_left() {
        // Node 1 is 4x slower: of 200 photos left, it should keep 40.
        assert_eq!(
            proportional_moves(&[100, 100], &[40.0, 10.0], 8),
            vec![(1, 0, 60)]
        );
        // Equal rates, or a move under the minimum: nothing moves.
        assert!(proportional_moves(&[100, 100], &[10.0, 10.0], 8).is_empty());
        assert!(proportional_moves(&[100, 104], &[10.0, 10.0], 8).is_empty());
    }

    #[test]
    fn one_slow_node_feeds_every_fast_one_and_unrated_nodes_stay_out() {
        let moves = proportional_moves(&[300, 300, 300, 50], &[20.0, 20.0, 5.0, 0.0], 1);
        let mut left = [300i64, 300, 300, 50];
        for &(from, to, n) in &moves {
            assert!(from == 2 && to != 2 && to != 3, "{moves:?}");
            left[from] -= n as i64;
            left[to] += n as i64;
        }
        assert_eq!(left, [400, 400, 100, 50], "{moves:?}");
        assert!(proportional_moves(&[100, 100], &[10.0, f64::NAN], 1).is_empty());
    }
}
