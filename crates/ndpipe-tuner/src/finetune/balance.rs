//! Load balancing: once every node has measured its throughput (on its validation set, or on
//! its first training chunks when it has none), slow nodes give photos not yet extracted, from
//! any of their runs, to fast ones, so that every node's work left is in proportion to its
//! rate and all finish together. A fast node takes the photos over in the job's mode and under
//! its own throttle and bandwidth cap, reading stored features where they exist.

use std::collections::BTreeSet;

use ndpipe_proto::pb;
use tracing::info;

use super::report::Rebalanced;
use super::request::FinetuneRequest;
use crate::TunerError;
use crate::nodes::{Node, node_error};

/// Work a slow node gave away, for a fast node to take over.
pub(crate) struct Handoff {
    /// Index of the slow node.
    pub(crate) slow: usize,
    /// Index of the fast node.
    pub(crate) fast: usize,
    /// The runs the photos belong to.
    pub(crate) runs: BTreeSet<u32>,
    /// The request for the fast node.
    pub(crate) request: pb::TakeOverRequest,
    /// For the report.
    pub(crate) moved: Rebalanced,
}

/// What balancing decided: the hand-offs, and why it did nothing when it should have.
pub(crate) struct Balance {
    pub(crate) handoffs: Vec<Handoff>,
    /// Why balancing was skipped, when it was.
    pub(crate) skipped: Option<String>,
}

/// Asks slow nodes to give work away, following [`balance_plan`] over each node's photos not
/// yet extracted (`remaining`) and measured `rates`. Nodes without a rate (nothing to extract)
/// take no part; moves smaller than a chunk are not worth it.
pub(crate) async fn rebalance(
    nodes: &[Node],
    job_id: &str,
    req: &FinetuneRequest,
    conventional: bool,
    remaining: &[u64],
    rates: &[f64],
) -> Result<Balance, TunerError> {
    let unrated: Vec<String> = nodes
        .iter()
        .zip(rates)
        .filter(|(_, r)| **r <= 0.0)
        .map(|(n, _)| n.label())
        .collect();
    if rates.iter().filter(|r| **r > 0.0).count() < 2 {
        return Ok(Balance {
            handoffs: Vec::new(),
            skipped: Some(format!(
                "fewer than two nodes measured a throughput (none from {})",
                unrated.join(", ")
            )),
        });
    }
    let plan = balance_plan(remaining, rates, u64::from(req.chunk_size));
    let mut handoffs = Vec::new();
    for &(slow, fast, n) in &plan {
        let request = pb::RebalanceRequest {
            job_id: job_id.to_string(),
            give: u32::try_from(n).unwrap_or(u32::MAX),
        };
        let reply = nodes[slow]
            .unary(request, |mut c, r| async move { c.rebalance(r).await })
            .await
            .map_err(|e| node_error(&nodes[slow], format!("rebalance failed: {}", e.message())))?;
        if reply.photos.is_empty() {
            continue;
        }
        let runs: BTreeSet<u32> = reply.photos.iter().map(|p| p.run).collect();
        let moved = Rebalanced {
            from: nodes[slow].label(),
            to: nodes[fast].label(),
            photos: reply.photos.len(),
            runs: runs.iter().copied().collect(),
        };
        info!(from = %moved.from, to = %moved.to, photos = moved.photos, runs = ?moved.runs, "load balancing");
        let request = pb::TakeOverRequest {
            job_id: job_id.to_string(),
            source_url: nodes[slow].url.clone(),
            photos: reply.photos,
            chunk_size: req.chunk_size,
            // Sequence numbers of their own, so that no take-over chunk reuses a node's.
            first_seq: 1_000_000 * (handoffs.len() as u32 + 1),
            timeout_ms: u32::try_from(nodes[fast].timeout().as_millis()).unwrap_or(u32::MAX),
            use_stored_features: req.use_stored_features,
            ship_tensors: conventional,
            throttle_images_per_second: req.throttle.get(&nodes[fast].name).copied().unwrap_or(0.0),
            bandwidth_bytes_per_second: req.bandwidth_bytes_per_second,
            source_lost: false,
        };
        handoffs.push(Handoff {
            slow,
            fast,
            runs,
            request,
            moved,
        });
    }
    let skipped = (handoffs.is_empty() && !plan.is_empty()).then(|| {
        "the slow nodes had extracted their photos by the time the rates were known".into()
    });
    Ok(Balance { handoffs, skipped })
}

/// NDPipe's proportional split of the work left: node `i` should do `rate_i / sum(rates)` of
/// it; each overloaded node gives its excess to underloaded ones. Nodes with no rate (0) take
/// no part. Returns (slow, fast, photos) moves of at least `min_move` photos.
pub(crate) fn balance_plan(
    remaining: &[u64],
    rates: &[f64],
    min_move: u64,
) -> Vec<(usize, usize, u64)> {
    let rated = |i: usize| rates[i] > 0.0 && rates[i].is_finite();
    let members: Vec<usize> = (0..remaining.len().min(rates.len()))
        .filter(|&i| rated(i))
        .collect();
    let total: u64 = members.iter().map(|&i| remaining[i]).sum();
    let rate_total: f64 = members.iter().map(|&i| rates[i]).sum();
    if members.len() < 2 || rate_total <= 0.0 {
        return Vec::new();
    }
    let mut diff: Vec<(usize, i64)> = members
        .iter()
        .map(|&i| {
            let share = (rates[i] / rate_total * total as f64).floor() as i64;
            (i, remaining[i] as i64 - share)
        })
        .collect();
    let mut moves = Vec::new();
    while let (Some(most), Some(least)) = (
        (0..diff.len()).max_by_key(|&k| diff[k].1),
        (0..diff.len()).min_by_key(|&k| diff[k].1),
    ) {
        let n = diff[most].1.min(-diff[least].1);
        if n < min_move.max(1) as i64 {
            break;
        }
        moves.push((diff[most].0, diff[least].0, n as u64));
        diff[most].1 -= n;
        diff[least].1 += n;
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::balance_plan;

    /// Each node's work after the moves of `plan`.
    fn after(remaining: &[u64], plan: &[(usize, usize, u64)]) -> Vec<u64> {
        let mut left = remaining.to_vec();
        for &(slow, fast, n) in plan {
            left[slow] -= n;
            left[fast] += n;
        }
        left
    }

    #[test]
    fn work_moves_from_slow_to_fast_in_proportion() {
        // Equal shares, but node 1 is three times slower: it should keep a quarter.
        assert_eq!(
            balance_plan(&[400, 400], &[300.0, 100.0], 10),
            vec![(1, 0, 200)]
        );
        // Balanced already, or moves smaller than a chunk: nothing to do.
        assert!(balance_plan(&[400, 400], &[100.0, 100.0], 10).is_empty());
        assert!(balance_plan(&[400, 405], &[100.0, 100.0], 10).is_empty());
        // Three nodes: the slow one feeds both fast ones; the total is preserved.
        let moves = balance_plan(&[300, 300, 300], &[200.0, 200.0, 50.0], 1);
        let moved: u64 = moves.iter().map(|m| m.2).sum();
        assert!(moves.iter().all(|m| m.0 == 2 && m.1 != 2), "{moves:?}");
        assert_eq!(moved, 300 - 100, "{moves:?}");
    }

    #[test]
    fn the_plan_over_the_work_left_reaches_proportional_shares() {
        // A 4x slower node with 4 runs of 90 photos each, after the validation set: the fast
        // node has done 60 more photos than the slow one. The plan moves more than the slow
        // node's last run (90), and afterwards every node finishes at the same time, to within
        // a photo per node.
        let remaining = [300, 360];
        let rates = [40.0, 10.0];
        let plan = balance_plan(&remaining, &rates, 8);
        assert_eq!(plan.len(), 1, "{plan:?}");
        assert!(plan[0].2 > 90, "more than one run moves: {plan:?}");
        let left = after(&remaining, &plan);
        assert_eq!(left.iter().sum::<u64>(), 660, "no photo lost or doubled");
        let finish: Vec<f64> = left.iter().zip(rates).map(|(n, r)| *n as f64 / r).collect();
        assert!(
            (finish[0] - finish[1]).abs() <= 1.0 / 10.0 + 1.0 / 40.0,
            "{finish:?}"
        );
        assert_eq!(left, [528, 132]);

        // Four nodes of rates 4:2:1:1 and equal work: shares 1/2, 1/4, 1/8, 1/8.
        let remaining = [200, 200, 200, 200];
        let plan = balance_plan(&remaining, &[4.0, 2.0, 1.0, 1.0], 1);
        assert_eq!(after(&remaining, &plan), [400, 200, 100, 100], "{plan:?}");
    }

    #[test]
    fn nodes_without_a_rate_take_no_part() {
        // Node 2 had nothing to extract: it neither gives nor takes.
        let plan = balance_plan(&[400, 400, 0], &[300.0, 100.0, 0.0], 10);
        assert_eq!(plan, vec![(1, 0, 200)]);
        assert!(
            balance_plan(&[400, 400], &[100.0, 0.0], 10).is_empty(),
            "one rate: no plan"
        );
        assert!(balance_plan(&[400, 400], &[f64::NAN, 1.0], 10).is_empty());
    }
}
