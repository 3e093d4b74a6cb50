//! Load balancing: once every node has sent its validation set (and so measured its throughput),
//! slow nodes give the tail of their last run to fast ones, which fetch the photos' tensors from
//! the slow node and run the backbone on them.

use ndpipe_proto::pb;
use tracing::info;

use super::report::Rebalanced;
use crate::TunerError;
use crate::nodes::{Node, node_error};

/// Work a slow node gave away, for a fast node to take over.
pub(crate) struct Handoff {
    /// Index of the slow node.
    pub(crate) slow: usize,
    /// Index of the fast node.
    pub(crate) fast: usize,
    /// The request for the fast node.
    pub(crate) request: pb::TakeOverRequest,
    /// For the report.
    pub(crate) moved: Rebalanced,
}

/// Asks slow nodes to give work away, following [`balance_plan`] over the nodes' training photos
/// `have` and measured `rates`; moves smaller than a chunk are not worth it.
pub(crate) async fn rebalance(
    nodes: &[Node],
    job_id: &str,
    chunk_size: u32,
    have: &[u64],
    rates: &[f64],
) -> Result<Vec<Handoff>, TunerError> {
    let mut handoffs = Vec::new();
    for (slow, fast, n) in balance_plan(have, rates, u64::from(chunk_size)) {
        let request = pb::RebalanceRequest {
            job_id: job_id.to_string(),
            give: n as u32,
        };
        let reply = nodes[slow]
            .unary(request, |mut c, r| async move { c.rebalance(r).await })
            .await
            .map_err(|e| node_error(&nodes[slow], format!("rebalance failed: {}", e.message())))?;
        if reply.photos.is_empty() {
            continue;
        }
        let moved = Rebalanced {
            from: nodes[slow].label(),
            to: nodes[fast].label(),
            photos: reply.photos.len(),
        };
        info!(from = %moved.from, to = %moved.to, photos = moved.photos, "load balancing");
        let request = pb::TakeOverRequest {
            job_id: job_id.to_string(),
            source_url: nodes[slow].url.clone(),
            photos: reply.photos,
            run: reply.run,
            chunk_size,
            // Sequence numbers of their own, so that no take-over chunk reuses a node's.
            first_seq: 1_000_000 * (handoffs.len() as u32 + 1),
            timeout_ms: u32::try_from(nodes[fast].timeout().as_millis()).unwrap_or(u32::MAX),
        };
        handoffs.push(Handoff {
            slow,
            fast,
            request,
            moved,
        });
    }
    Ok(handoffs)
}

/// NDPipe's proportional split: node `i` should do `rate_i / sum(rates)` of all the work; each
/// overloaded node gives its excess to underloaded ones. Returns (slow, fast, photos) moves of at
/// least `min_move` photos.
pub(crate) fn balance_plan(have: &[u64], rates: &[f64], min_move: u64) -> Vec<(usize, usize, u64)> {
    let total: u64 = have.iter().sum();
    let rate_total: f64 = rates.iter().sum();
    if rate_total <= 0.0 || rates.iter().any(|r| *r <= 0.0) {
        return Vec::new();
    }
    let mut diff: Vec<i64> = have
        .iter()
        .zip(rates)
        .map(|(h, r)| *h as i64 - (r / rate_total * total as f64).floor() as i64)
        .collect();
    let mut moves = Vec::new();
    while let (Some((slow, &most)), Some((fast, &least))) = (
        diff.iter().enumerate().max_by_key(|(_, d)| **d),
        diff.iter().enumerate().min_by_key(|(_, d)| **d),
    ) {
        let n = most.min(-least);
        if n < min_move.max(1) as i64 {
            break;
        }
        moves.push((slow, fast, n as u64));
        diff[slow] -= n;
        diff[fast] += n;
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::balance_plan;

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
        // No rate yet: no plan.
        assert!(balance_plan(&[400, 400], &[100.0, 0.0], 10).is_empty());
        // Three nodes: the slow one feeds both fast ones; the total is preserved.
        let moves = balance_plan(&[300, 300, 300], &[200.0, 200.0, 50.0], 1);
        let moved: u64 = moves.iter().map(|m| m.2).sum();
        assert!(moves.iter().all(|m| m.0 == 2 && m.1 != 2), "{moves:?}");
        assert_eq!(moved, 300 - 100, "{moves:?}");
    }
}
