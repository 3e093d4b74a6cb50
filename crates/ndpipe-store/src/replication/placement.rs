//! Where a photo's copies go: weighted rendezvous hashing over the live, active nodes.
//!
//! Each node scores `-weight / ln(u)`, where `u` in (0, 1) is a hash of the photo's key and the
//! node's name, and the photo goes to the highest scores. A node is chosen with probability in
//! proportion to its weight (its free bytes in quarter-octave steps; a node below its
//! free-space reserve is left out),
//! and adding or removing a node moves only the photos whose choice it was. The hash is the
//! standard library's SipHash with fixed keys: where a photo went is recorded in the catalog,
//! so a different build that hashes differently places new photos differently and loses none
//! (rebalancing then moves the photos it placed elsewhere).

use std::hash::{Hash, Hasher};

use ndpipe_catalog::PlacementNode;

/// The weight of a node that never reported its free space: as if it had 1 GiB.
const UNKNOWN_FREE_BYTES: u64 = 1 << 30;

/// The `replicas` nodes of `nodes` (live and active ones only) that should hold the photo with
/// `key`, best first (the first is the primary); fewer when fewer nodes qualify.
pub(crate) fn place(key: u64, nodes: &[PlacementNode], replicas: usize) -> Vec<PlacementNode> {
    let mut scored: Vec<(f64, &PlacementNode)> = nodes
        .iter()
        .filter(|n| eligible(n))
        .map(|n| (score(key, n), n))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    scored
        .into_iter()
        .take(replicas)
        .map(|(_, n)| n.clone())
        .collect()
}

/// Whether placement may choose `node`: live, active, above its free-space reserve.
pub(crate) fn eligible(node: &PlacementNode) -> bool {
    node.live && node.active && node.free_bytes != Some(0)
}

/// The nodes, best first, that should take a new copy of a photo that `holders` have: live,
/// active nodes that hold none, in rendezvous order.
pub(crate) fn targets(key: u64, nodes: &[PlacementNode], holders: &[String]) -> Vec<PlacementNode> {
    let others: Vec<PlacementNode> = nodes
        .iter()
        .filter(|n| !holders.contains(&n.name))
        .cloned()
        .collect();
    place(key, &others, others.len())
}

/// A photo's placement key from its SHA-256 (hex), which the catalog keeps: where a photo
/// belongs can be worked out again at any time (repair, rebalancing).
pub(crate) fn key_of(sha256: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sha256.hash(&mut h);
    h.finish()
}

fn score(key: u64, node: &PlacementNode) -> f64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    node.name.hash(&mut h);
    // A uniform value in (0, 1) from the top 53 bits.
    let u = ((h.finish() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -weight(node.free_bytes.unwrap_or(UNKNOWN_FREE_BYTES)) / u.ln()
}

/// A node's weight from its free bytes, in steps of a quarter octave (about 19%): the small
/// changes every write makes to free space then move no photo's placement, which rebalancing
/// would otherwise chase.
fn weight(free_bytes: u64) -> f64 {
    let octaves = (free_bytes.max(1) as f64).log2();
    ((octaves * 4.0).round() / 4.0).exp2()
}

/// A node for tests: `name` at `http://name`, active, with `free_bytes`.
#[cfg(test)]
pub(super) fn test_node(name: &str, live: bool, free_bytes: u64) -> PlacementNode {
    PlacementNode {
        name: name.into(),
        url: format!("http://{name}"),
        live,
        active: true,
        free_bytes: Some(free_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, free_bytes: u64) -> PlacementNode {
        test_node(name, true, free_bytes)
    }

    #[test]
    fn copies_go_to_distinct_nodes_and_spread_evenly() {
        let nodes = [node("a", 100), node("b", 100), node("c", 100)];
        let mut counts = std::collections::HashMap::new();
        for key in 0..30_000u64 {
            let chosen = place(key, &nodes, 2);
            assert_eq!(chosen.len(), 2);
            assert_ne!(chosen[0].name, chosen[1].name);
            for n in chosen {
                *counts.entry(n.name).or_insert(0u32) += 1;
            }
        }
        for (name, count) in counts {
            assert!(
                (19_000..21_000).contains(&count),
                "{name}: {count} of 60000"
            );
        }
    }

    #[test]
    fn free_space_weighs_and_dead_or_draining_nodes_are_skipped() {
        let mut nodes = vec![node("a", 300), node("b", 100)];
        let firsts = (0..10_000u64)
            .filter(|&k| place(k, &nodes, 1)[0].name == "a")
            .count();
        assert!(
            (7_000..8_000).contains(&firsts),
            "a first {firsts} of 10000"
        );
        nodes[0].live = false;
        assert_eq!(place(1, &nodes, 2).len(), 1);
        nodes[0].live = true;
        nodes[1].active = false;
        assert_eq!(place(1, &nodes, 2)[0].name, "a");
        assert_eq!(place(1, &nodes, 2).len(), 1);
        nodes[1].active = true;
        nodes[1].free_bytes = Some(0);
        assert_eq!(place(1, &nodes, 2).len(), 1, "a full node takes no photo");
        nodes[1].free_bytes = None;
        assert_eq!(place(1, &nodes, 2).len(), 2, "one that never reported does");
    }

    #[test]
    fn small_changes_of_free_space_move_nothing() {
        let before = [node("a", 100 << 30), node("b", 100 << 30)];
        let after = [node("a", (100 << 30) - (50 << 20)), node("b", 100 << 30)];
        for key in 0..2_000u64 {
            let first = |nodes: &[PlacementNode]| place(key, nodes, 1)[0].name.clone();
            assert_eq!(first(&before), first(&after), "key {key}");
        }
    }

    #[test]
    fn removing_a_node_moves_only_its_photos() {
        let all = [node("a", 1), node("b", 1), node("c", 1), node("d", 1)];
        let without_d: Vec<_> = all[..3].to_vec();
        for key in 0..2_000u64 {
            let before = place(key, &all, 1)[0].name.clone();
            let after = place(key, &without_d, 1)[0].name.clone();
            if before != "d" {
                assert_eq!(before, after, "key {key} moved");
            }
        }
    }

    #[test]
    fn targets_leave_out_the_holders() {
        let nodes = [node("a", 1), node("b", 1), node("c", 1)];
        let t = targets(7, &nodes, &["a".into(), "c".into()]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "b");
    }
}
