//! Uploads around a dead or hung node: a node that refused a connection or gave no answer
//! within the copy deadline is a suspect for a while, and placement passes over it to the next
//! node of the rendezvous order. Before an upload is forwarded to a primary that has not
//! answered lately, a cheap call within the copy deadline checks that it is alive, so that a
//! hung primary costs an upload the copy deadline rather than the whole peer deadline.
//!
//! A node whose lease ran out only because the lease could not be renewed (the catalog was
//! away) still counts when it answers: while fewer nodes than copies wanted are live, the
//! front door asks the others within the copy deadline, so uploads do not fail in a burst of
//! `insufficient_replicas` after a catalog outage until every lease is renewed.
//!
//! Where the copies went is recorded as they are made (`add_copy` on the receiver), so a
//! photo placed around a node is an ordinary photo whose holders are not its rendezvous-first
//! nodes: once that node is back, rebalancing (`rebalance.rs`) copies the photo to it and
//! drops the copy placement no longer names, and repair (`repair.rs`) makes up any copy short.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ndpipe_catalog::PlacementNode;
use ndpipe_util::sync::lock;
use tonic::Code;
use tracing::warn;

use super::front::FrontDoor;
use super::{ReplicationError, placement};

/// How long a node that failed a call is passed over.
const SUSPECT_FOR: Duration = Duration::from_secs(10);
/// How recently a node must have answered to be forwarded to without a check.
const FRESH: Duration = Duration::from_secs(1);

/// What the front door knows of each node's recent answers.
#[derive(Default)]
pub(crate) struct Health {
    /// Nodes that failed a call, and when.
    suspects: Mutex<HashMap<String, Instant>>,
    /// Nodes that answered, and when.
    answered: Mutex<HashMap<String, Instant>>,
}

impl Health {
    /// Notes that `node` failed a call.
    pub(crate) fn failed(&self, node: &str) {
        lock(&self.suspects).insert(node.to_string(), Instant::now());
    }

    /// Notes that `node` answered a call.
    pub(crate) fn answered(&self, node: &str) {
        lock(&self.suspects).remove(node);
        lock(&self.answered).insert(node.to_string(), Instant::now());
    }

    /// Whether `node` failed a call within [`SUSPECT_FOR`].
    pub(crate) fn suspect(&self, node: &str) -> bool {
        lock(&self.suspects)
            .get(node)
            .is_some_and(|at| at.elapsed() < SUSPECT_FOR)
    }

    fn fresh(&self, node: &str) -> bool {
        lock(&self.answered)
            .get(node)
            .is_some_and(|at| at.elapsed() < FRESH)
    }
}

/// Whether a failed call says that the node is out of reach (no connection, no answer in
/// time, a connection broken mid-call, which the transport reports as `UNKNOWN`) rather than
/// that it refused the request: only then is a copy placed elsewhere.
pub(crate) fn unreachable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// Whether an upload forwarded to a primary that failed with `status` may go to another
/// primary: the primary was out of reach, and not merely slow (a primary past its deadline
/// may still finish the upload, which would then be stored twice).
pub(crate) fn forward_again(status: &tonic::Status) -> bool {
    unreachable(status) && status.code() != Code::DeadlineExceeded
}

/// The nodes placement may choose for the photo with `key`, best first, the suspects left out
/// (unless too few others remain for `wanted` copies, when they go last).
pub(crate) fn order(
    key: u64,
    nodes: &[PlacementNode],
    health: &Health,
    wanted: usize,
) -> Vec<PlacementNode> {
    let all = placement::place(key, nodes, nodes.len());
    let (mut trusted, suspects): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|n| !health.suspect(&n.name));
    if trusted.len() < wanted {
        trusted.extend(suspects);
    }
    trusted
}

impl FrontDoor {
    /// The nodes placement may choose for the photo with `key`, best first, suspects last;
    /// while fewer are live than copies wanted, the active nodes whose lease ran out count
    /// too when they answer ([`FrontDoor::alive`]).
    pub(super) async fn order(&self, key: u64) -> Result<Vec<PlacementNode>, ReplicationError> {
        let mut nodes = self.placement_nodes().await?;
        let wanted = self.config.replicas as usize;
        let trusted = |n: &&PlacementNode| placement::eligible(n) && !self.health.suspect(&n.name);
        if nodes.iter().filter(trusted).count() < wanted {
            for node in nodes.iter_mut().filter(|n| !n.live && n.active) {
                node.live = !self.health.suspect(&node.name) && self.alive(node).await;
            }
        }
        Ok(order(key, &nodes, &self.health, wanted))
    }

    /// Whether `node` answers within the copy deadline: at once when it answered lately,
    /// else after a cheap call (a lookup of photo 0, which no node holds). A node that does
    /// not is a suspect.
    pub(super) async fn alive(&self, node: &PlacementNode) -> bool {
        if self.health.fresh(&node.name) {
            return true;
        }
        match self.peers.probe(&node.url).await {
            Err(status) if unreachable(&status) => {
                warn!(node = %node.name, error = %status.message(),
                    "a node does not answer; uploads go to the next node of their placement");
                self.health.failed(&node.name);
                false
            }
            _ => {
                self.health.answered(&node.name);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::placement::test_node;

    #[test]
    fn suspects_go_last_and_only_when_needed() {
        let nodes: Vec<PlacementNode> = ["a", "b", "c"]
            .iter()
            .map(|n| test_node(n, true, 1 << 30))
            .collect();
        let health = Health::default();
        let key = 42;
        let full = order(key, &nodes, &health, 2);
        assert_eq!(full.len(), 3);
        let first = full[0].name.clone();
        health.failed(&first);
        let around = order(key, &nodes, &health, 2);
        let names: Vec<&str> = around.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!names.contains(&first.as_str()), "{names:?}");
        assert_eq!(names[0], full[1].name, "the next of the rendezvous order");
        let needed = order(key, &nodes, &health, 3);
        assert_eq!(
            needed.last().unwrap().name,
            first,
            "a suspect rather than too few"
        );
        health.answered(&first);
        assert_eq!(order(key, &nodes, &health, 2)[0].name, first);
    }

    #[test]
    fn only_unreachable_nodes_are_passed_over() {
        assert!(unreachable(&tonic::Status::unavailable("refused")));
        assert!(unreachable(&tonic::Status::deadline_exceeded("slow")));
        assert!(forward_again(&tonic::Status::unknown("transport error")));
        assert!(!forward_again(&tonic::Status::deadline_exceeded("slow")));
        assert!(!unreachable(&tonic::Status::invalid_argument("bad")));
        assert!(!unreachable(&tonic::Status::resource_exhausted("full")));
    }
}
