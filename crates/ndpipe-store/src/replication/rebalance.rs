//! Rebalancing: when a node joins a cluster that already holds photos, its rendezvous share
//! moves to it. Every round, each node looks at a page of the photos it is the primary of; a
//! photo whose placement over the live, active nodes names a node that holds no copy is copied
//! there first (the receiver verifies and records it), and only then is the copy of a holder
//! its placement no longer names dropped, so no photo ever has fewer than `replicas` recorded
//! copies. When the holder to leave is the primary itself, it first hands the photo over to a
//! holder its placement names. A photo with a holder that is not live is left alone: its copy
//! could not be dropped.

use ndpipe_catalog::{PhotoCopies, PlacementNode};
use tracing::{info, warn};

use super::{Replication, ReplicationError, placement};

/// One move of a photo's copy.
#[derive(Debug, Clone, PartialEq)]
struct Move {
    /// The node that gets a copy first (`None`: the photo already has one too many).
    to: Option<PlacementNode>,
    /// The holder whose copy then goes.
    from: String,
    /// The holder that becomes the primary when `from` is the primary.
    heir: String,
}

/// What `photo` needs to sit where its placement over `nodes` puts it, one move at a time;
/// `None` when it is there already, or cannot be moved now.
fn plan(photo: &PhotoCopies, nodes: &[PlacementNode], wanted: usize) -> Option<Move> {
    let live = |name: &String| nodes.iter().any(|n| n.name == *name && n.live);
    if photo.holders.len() < wanted || !photo.holders.iter().all(live) {
        return None; // repair's work, or a copy that could not be dropped now
    }
    let desired = placement::place(placement::key_of(&photo.meta.sha256), nodes, wanted);
    if desired.len() < wanted {
        return None;
    }
    let named = |name: &String| desired.iter().any(|n| n.name == *name);
    let to = desired
        .iter()
        .find(|n| !photo.holders.contains(&n.name))
        .cloned();
    if to.is_none() && photo.holders.len() == wanted {
        return None;
    }
    let leaving: Vec<&String> = photo.holders.iter().filter(|h| !named(h)).collect();
    // Another holder before the primary: a move that needs no hand-over.
    let from = leaving
        .iter()
        .find(|h| ***h != photo.primary)
        .or(leaving.first())?;
    let heir = desired
        .iter()
        .map(|n| &n.name)
        .find(|n| photo.holders.contains(n) || to.as_ref().is_some_and(|t| t.name == **n))?;
    Some(Move {
        to,
        from: (*from).clone(),
        heir: heir.clone(),
    })
}

impl Replication {
    /// Looks at the next page of this node's photos after `cursor` (from the first again
    /// once the last was seen) and moves those placement puts elsewhere, up to the configured
    /// moves per round (`rebalance_moves_per_round`, `rebalance_page_photos` photos a page).
    pub(super) async fn rebalance_round(
        &self,
        cursor: &mut Option<u64>,
    ) -> Result<(), ReplicationError> {
        let catalog = self.catalog.clone();
        let after = *cursor;
        let (per_page, most) = (
            self.repair.rebalance_page.max(1),
            self.repair.rebalance_moves.max(1),
        );
        let (page, nodes) = tokio::task::spawn_blocking(move || {
            Ok::<_, ndpipe_catalog::CatalogError>((
                catalog.primaries_after(after, per_page)?,
                catalog.placement_nodes()?,
            ))
        })
        .await??;
        *cursor = if page.len() < per_page as usize {
            None
        } else {
            page.last().map(|p| p.id)
        };
        let mut moved = 0;
        for photo in &page {
            let Some(step) = plan(photo, &nodes, self.replicas() as usize) else {
                continue;
            };
            match self.move_copy(photo, &step, &nodes).await {
                Ok(()) => {
                    moved += 1;
                    self.metrics.replication.rebalanced.inc();
                }
                Err(e) => {
                    warn!(photo = photo.id, error = %e, "a rebalancing move failed; it is tried again");
                }
            }
            if moved == most {
                *cursor = Some(photo.id);
                break;
            }
        }
        if moved > 0 {
            info!(moved, "moved photos to where placement puts them");
        }
        Ok(())
    }

    /// Makes `step`: the new copy first, then the hand-over when this node leaves, then the
    /// drop.
    async fn move_copy(
        &self,
        photo: &PhotoCopies,
        step: &Move,
        nodes: &[PlacementNode],
    ) -> Result<(), ReplicationError> {
        let id = photo.id;
        let peer = |url: &str, e: tonic::Status| ReplicationError::Peer {
            url: url.into(),
            reason: e.message().to_string(),
        };
        if let Some(to) = &step.to {
            let copy = self
                .read_local_copy(id)
                .await
                .map_err(|e| ReplicationError::Peer {
                    url: "this node".into(),
                    reason: e.to_string(),
                })?;
            let bytes = copy.original.len() as u64;
            self.front
                .peers
                .put_copy(&to.url, copy)
                .await
                .map_err(|e| peer(&to.url, e))?;
            self.metrics.replication.copied_bytes.inc_by(bytes);
        }
        if step.from == self.name {
            let (catalog, heir) = (self.catalog.clone(), step.heir.clone());
            if !tokio::task::spawn_blocking(move || catalog.hand_over(id, &heir)).await?? {
                return Err(ReplicationError::Peer {
                    url: step.heir.clone(),
                    reason: format!("photo {id} could not be handed over"),
                });
            }
            self.release_local(id).await?;
            return Ok(());
        }
        let Some(from) = nodes.iter().find(|n| n.name == step.from) else {
            return Ok(());
        };
        self.front
            .peers
            .drop_copy(&from.url, id)
            .await
            .map_err(|e| peer(&from.url, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::PhotoMeta;

    use super::*;

    fn node(name: &str, live: bool) -> PlacementNode {
        placement::test_node(name, live, 100)
    }

    fn photo(sha256: &str, primary: &str, holders: &[&str]) -> PhotoCopies {
        PhotoCopies {
            id: 1,
            meta: PhotoMeta {
                sha256: sha256.into(),
                bytes: 1,
                width: 1,
                height: 1,
                content_type: "image/png".into(),
                created_ms: 0,
                ground_truth: None,
            },
            primary: primary.into(),
            holders: holders.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn a_move_copies_first_and_never_drops_a_named_holder() {
        let nodes = [node("a", true), node("b", true), node("c", true)];
        let mut moves = 0;
        for i in 0..200 {
            let sha = format!("{i:064x}");
            let desired: Vec<String> = placement::place(placement::key_of(&sha), &nodes, 2)
                .into_iter()
                .map(|n| n.name)
                .collect();
            let p = photo(&sha, "a", &["a", "b"]);
            match plan(&p, &nodes, 2) {
                None => assert!(desired.contains(&"a".into()) && desired.contains(&"b".into())),
                Some(m) => {
                    moves += 1;
                    assert_eq!(m.to.as_ref().map(|t| t.name.as_str()), Some("c"));
                    assert!(!desired.contains(&m.from), "{m:?} {desired:?}");
                    assert!(desired.contains(&m.heir), "{m:?} {desired:?}");
                    if m.from != "a" {
                        assert_eq!(m.from, "b", "the primary stays when it can");
                    }
                }
            }
        }
        assert!((100..170).contains(&moves), "{moves} of 200 move to c");
    }

    #[test]
    fn photos_short_of_copies_or_on_a_dead_node_stay() {
        let nodes = [node("a", true), node("b", true), node("c", false)];
        assert_eq!(plan(&photo("x", "a", &["a"]), &nodes, 2), None);
        assert_eq!(plan(&photo("x", "a", &["a", "c"]), &nodes, 2), None);
        // One copy too many (a move that stopped halfway): only a drop.
        let m = plan(
            &photo("x", "a", &["a", "b", "c"]),
            &[node("a", true), node("b", true), node("c", true)],
            2,
        );
        assert!(m.is_some_and(|m| m.to.is_none()));
    }
}
