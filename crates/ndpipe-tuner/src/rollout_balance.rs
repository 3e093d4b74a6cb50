//! A rollout's load balancing, Tuner side, in two steps:
//!
//! 1. once every node has reported its first batch (its photos left and its pass's model rate),
//!    each node's share of the work left should be in proportion to its rate: a node above its
//!    share gives the excess, the photos its pass has not reached, to nodes below theirs;
//! 2. from then on, a node with nothing left to do (its pass ended, no take-over running) takes
//!    from the node furthest from finishing (photos left over rate) the part that lets both end
//!    together: the rates of one batch are estimates, and this corrects them.
//!
//! A move is two calls: the giving node records the photos durably as given
//! (`GiveBackbonePhotos`), the taking one runs the staged backbone over them and stores the
//! outputs back on it (`TakeOverBackbone`). Balancing only speeds the job up: a call that fails
//! is logged, a node whose take-over failed takes nothing more, and the giving node's commit
//! computes what no node stored.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use ndpipe_proto::pb;
use ndpipe_util::sync::lock;
use tracing::{info, warn};

use crate::nodes::Node;

/// The pause between two looks at the nodes' progress.
const WATCH_POLL: Duration = Duration::from_millis(50);
/// Moves smaller than this many photos are not worth the calls.
const MIN_MOVE: u64 = 8;

/// The nodes' latest extraction progress, shared between their streams and the balancer.
pub(crate) struct Watch {
    seen: Mutex<Vec<Seen>>,
}

/// One node's latest progress.
#[derive(Clone, Copy, Default)]
struct Seen {
    /// Photos its pass has left, once it reported a batch.
    left: Option<u64>,
    /// Photos per second inside its model in its pass (0 before a batch).
    rate: f64,
    /// Its extraction ended (done, or failed for good).
    finished: bool,
    /// It ended done: it may take photos over.
    done: bool,
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
            seen: Mutex::new(vec![Seen::default(); nodes]),
        }
    }

    /// Node `i` reported `p`.
    pub(crate) fn saw(&self, i: usize, p: &pb::ExtractBackboneProgress) {
        let mut seen = lock(&self.seen);
        seen[i].left = Some(p.total.saturating_sub(p.done));
        seen[i].rate = p.model_images_per_second;
    }

    /// Node `i`'s extraction ended, `done` or not (failed for good, lost).
    pub(crate) fn finish(&self, i: usize, done: bool) {
        let mut seen = lock(&self.seen);
        seen[i].left = Some(0);
        seen[i].finished = true;
        seen[i].done = done;
    }

    fn now(&self) -> Vec<Seen> {
        lock(&self.seen).clone()
    }
}

/// What the balancer knows of the moves it made.
struct Moves {
    shared: Vec<Shared>,
    /// A take-over of this node's is running.
    taking: Vec<bool>,
    /// This node's take-over failed: it takes nothing more.
    failed: Vec<bool>,
    /// This node gave nothing when asked with this many photos left: not asked again until its
    /// progress moves.
    refused_at: Vec<Option<u64>>,
}

/// Balances the rollout of backbone `sha` over `nodes` (see the module's doc) until every
/// node's extraction ended; returns each node's photos given and taken, and the seconds until
/// the last take-over ended.
pub(crate) async fn balance(nodes: &[Node], sha: &str, watch: &Watch) -> (Vec<Shared>, f64) {
    let started = Instant::now();
    let n = nodes.len();
    let mut m = Moves {
        shared: vec![Shared::default(); n],
        taking: vec![false; n],
        failed: vec![false; n],
        refused_at: vec![None; n],
    };
    let mut proportional_done = n < 2;
    let mut flights = FuturesUnordered::new();
    let mut last_end = 0.0;
    loop {
        let seen = watch.now();
        if seen.iter().all(|s| s.finished) && flights.is_empty() {
            break;
        }
        let mut planned = Vec::new();
        if !proportional_done && seen.iter().any(|s| s.finished || s.left.is_some()) {
            if seen.iter().any(|s| s.finished) {
                proportional_done = true;
            } else if seen.iter().all(|s| s.left.is_some()) {
                proportional_done = true;
                let left: Vec<u64> = seen.iter().map(|s| s.left.unwrap_or(0)).collect();
                let rates: Vec<f64> = seen.iter().map(|s| s.rate).collect();
                planned = proportional_moves(&left, &rates, MIN_MOVE);
            }
        }
        if proportional_done {
            planned.extend(steals(&seen, &m));
        }
        for (slow, fast, photos) in planned {
            m.taking[fast] = true;
            let left = seen[slow].left;
            let call = hand_off(&nodes[slow], &nodes[fast], sha, photos);
            flights.push(async move { (slow, fast, left, call.await) });
        }
        let ended = if flights.is_empty() {
            tokio::time::sleep(WATCH_POLL).await;
            None
        } else {
            tokio::select! {
                ended = flights.next() => ended,
                () = tokio::time::sleep(WATCH_POLL) => None,
            }
        };
        if let Some((slow, fast, left, moved)) = ended {
            m.taking[fast] = false;
            last_end = started.elapsed().as_secs_f64();
            match moved {
                Moved::Nothing => m.refused_at[slow] = left,
                Moved::Given {
                    given,
                    taken,
                    failed,
                } => {
                    m.shared[slow].given += given;
                    m.shared[fast].taken += taken;
                    m.failed[fast] |= failed;
                }
            }
        }
    }
    (m.shared, last_end)
}

/// Moves (from, to, photos) for every node with nothing left to do: from the node furthest from
/// finishing, the photos that let both end together.
fn steals(seen: &[Seen], m: &Moves) -> Vec<(usize, usize, u64)> {
    let mut moves = Vec::new();
    let mut asked = vec![false; seen.len()];
    for thief in 0..seen.len() {
        if !seen[thief].done || m.taking[thief] || m.failed[thief] {
            continue;
        }
        let victim = (0..seen.len())
            .filter(|&v| v != thief && !asked[v] && !seen[v].finished)
            .filter_map(|v| seen[v].left.map(|left| (v, left)))
            .filter(|&(v, left)| left >= MIN_MOVE && m.refused_at[v] != Some(left))
            .max_by(|a, b| {
                let t = |(v, left): (usize, u64)| left as f64 / rate_or(seen[v].rate, 1.0);
                t(*a).total_cmp(&t(*b))
            });
        let Some((victim, left)) = victim else {
            continue;
        };
        let rv = rate_or(seen[victim].rate, 1.0);
        let rt = rate_or(seen[thief].rate, rv);
        let photos = (left as f64 * rt / (rt + rv)).round() as u64;
        if photos >= MIN_MOVE {
            asked[victim] = true;
            moves.push((victim, thief, photos));
        }
    }
    moves
}

/// `rate` when it is a usable rate, else `otherwise`.
fn rate_or(rate: f64, otherwise: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        otherwise
    }
}

/// What one move did.
enum Moved {
    /// The giving node gave nothing (no pass runs, nothing left, the call failed).
    Nothing,
    /// It gave `given` photos, of which the taking node stored `taken`; `failed` when the
    /// take-over failed.
    Given {
        given: u64,
        taken: u64,
        failed: bool,
    },
}

/// `slow` gives up to `n` photos to `fast`, which runs the staged backbone over them.
async fn hand_off(slow: &Node, fast: &Node, sha: &str, n: u64) -> Moved {
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
            return Moved::Nothing;
        }
    };
    let given = photos.len() as u64;
    if photos.is_empty() {
        return Moved::Nothing;
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
        Ok(reply) => Moved::Given {
            given,
            taken: reply.taken,
            failed: false,
        },
        Err(e) => {
            warn!(from = %slow.label(), to = %fast.label(), error = %e.message(),
                "a rollout take-over failed: the giving node's commit computes its photos");
            Moved::Given {
                given,
                taken: 0,
                failed: true,
            }
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
    use super::{Moves, Seen, proportional_moves, steals};

    fn seen(left: u64, rate: f64, finished: bool) -> Seen {
        Seen {
            left: Some(left),
            rate,
            finished,
            done: finished,
        }
    }

    fn moves(n: usize) -> Moves {
        Moves {
            shared: vec![Default::default(); n],
            taking: vec![false; n],
            failed: vec![false; n],
            refused_at: vec![None; n],
        }
    }

    #[test]
    fn a_node_that_finished_takes_from_the_one_furthest_from_finishing_so_both_end_together() {
        // Node 0 is done; node 1 has 50 photos at 10/s (5 s), node 2 has 30 at 2/s (15 s).
        let nodes = [
            seen(0, 40.0, true),
            seen(50, 10.0, false),
            seen(30, 2.0, false),
        ];
        let m = moves(3);
        // Node 0 takes 40/(40+2) of node 2's 30 photos.
        assert_eq!(steals(&nodes, &m), vec![(2, 0, 29)]);
        // A node whose take-over runs, or failed, takes nothing; nor does one still working.
        let mut busy = moves(3);
        busy.taking[0] = true;
        assert!(steals(&nodes, &busy).is_empty());
        let mut failed = moves(3);
        failed.failed[0] = true;
        assert!(steals(&nodes, &failed).is_empty());
        // Nor does a node whose extraction failed for good, or that was lost.
        let mut gone = nodes;
        gone[0].done = false;
        assert!(steals(&gone, &m).is_empty());
        // A node that gave nothing at 30 photos left is not asked again until that changes.
        let mut refused = moves(3);
        refused.refused_at[2] = Some(30);
        assert_eq!(steals(&nodes, &refused), vec![(1, 0, 40)]);
    }

    #[test]
    fn too_little_left_stays_and_two_idle_nodes_ask_different_nodes() {
        let few = [seen(0, 10.0, true), seen(7, 10.0, false)];
        assert!(steals(&few, &moves(2)).is_empty());
        // Without a rate yet, the thief counts as fast as its victim: half each.
        let unrated = [
            seen(0, 0.0, true),
            seen(0, 0.0, true),
            seen(40, 5.0, false),
            seen(20, 5.0, false),
        ];
        assert_eq!(steals(&unrated, &moves(4)), vec![(2, 0, 20), (3, 1, 10)]);
    }

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
