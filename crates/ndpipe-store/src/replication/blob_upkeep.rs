//! Upkeep of the plain objects' files this node holds, as for photos: the scrub re-reads a few
//! files each round (at the photo scrub's rate) and replaces a damaged or missing one from
//! another holder; rebalancing moves files to where placement puts them once a node joined or
//! left placement (draining, full). A file has no primary, so the moves are split so that no
//! file ever has fewer than `replicas` recorded copies: the holder with the lowest name copies
//! the file to each node placement names that lacks one, and a holder placement no longer names
//! drops only its own copy, once every named node holds one. A file with a holder whose lease
//! ran out stays put.

use ndpipe_catalog::{BlobHolders, PlacementNode};
use tracing::{info, warn};

use ndpipe_proto::pb;

use super::copies::CopyError;
use super::{Replication, ReplicationError, placement};

/// What a file needs, as seen from one of its holders.
#[derive(Debug, Clone, PartialEq)]
enum FileMove {
    /// A copy to a node placement names (made by the lowest-named holder).
    CopyTo(PlacementNode),
    /// This holder's own copy goes: placement names others, which all hold one.
    DropHere,
}

/// What `file` needs from holder `here` to sit where its placement over `nodes` puts it;
/// `None` when nothing, or nothing now.
fn plan(
    file: &BlobHolders,
    nodes: &[PlacementNode],
    wanted: usize,
    here: &str,
) -> Option<FileMove> {
    let live = |name: &String| nodes.iter().any(|n| n.name == *name && n.live);
    if file.holders.len() < wanted || !file.holders.iter().all(live) {
        return None; // repair's work, or a copy that could not be dropped now
    }
    let desired = placement::place(placement::key_of(&file.sha256), nodes, wanted);
    if desired.len() < wanted {
        return None;
    }
    match desired.iter().find(|n| !file.holders.contains(&n.name)) {
        Some(to) => (file.holders.first().map(String::as_str) == Some(here))
            .then(|| FileMove::CopyTo(to.clone())),
        None => (!desired.iter().any(|n| n.name == here)).then_some(FileMove::DropHere),
    }
}

impl Replication {
    /// Re-reads up to `budget` of the files this node holds after `cursor` (from the first
    /// again once the last was seen), replacing a damaged or missing one from another holder.
    pub(super) async fn scrub_blobs(
        &self,
        cursor: &mut Option<String>,
        budget: u64,
    ) -> Result<(), ReplicationError> {
        if budget == 0 {
            return Ok(());
        }
        let limit = u32::try_from(budget).unwrap_or(u32::MAX);
        let page = self.held_files(cursor, limit).await?;
        for file in &page {
            self.metrics.replication.scrubbed.inc();
            match self.read_local_blob(&file.name, &file.sha256).await {
                Ok(_) => {}
                Err(CopyError::DamagedFile(_) | CopyError::NoFile(_)) => {
                    if let Err(e) = self.mend_file(file).await {
                        warn!(blob = %file.name, error = %e, "a damaged plain object could not be replaced yet");
                    }
                }
                Err(e) => warn!(blob = %file.name, error = %e, "cannot scrub a plain object"),
            }
        }
        Ok(())
    }

    /// Replaces this node's damaged or missing copy of `file` with another holder's.
    async fn mend_file(&self, file: &BlobHolders) -> Result<(), ReplicationError> {
        let bytes = self
            .front
            .read_blob(&file.name, &file.sha256, Some(&self.name))
            .await?;
        let copy = pb::BlobCopy {
            name: file.name.clone(),
            sha256: file.sha256.clone(),
            bytes,
        };
        self.receive_blob(copy)
            .await
            .map_err(|e| ReplicationError::Peer {
                url: "this node".into(),
                reason: e.to_string(),
            })?;
        self.metrics.replication.repaired.inc();
        Ok(())
    }

    /// Looks at the next page of this node's files after `cursor` and makes the moves
    /// placement asks of this node, up to the configured moves per round.
    pub(super) async fn rebalance_blobs(
        &self,
        cursor: &mut Option<String>,
    ) -> Result<(), ReplicationError> {
        let (per_page, most) = (
            self.repair.rebalance_page.max(1),
            self.repair.rebalance_moves.max(1),
        );
        let page = self.held_files(cursor, per_page).await?;
        let catalog = self.catalog.clone();
        let nodes = tokio::task::spawn_blocking(move || catalog.placement_nodes()).await??;
        let mut moved = 0;
        for file in &page {
            let Some(step) = plan(file, &nodes, self.replicas() as usize, &self.name) else {
                continue;
            };
            match self.move_file(file, &step).await {
                Ok(()) => {
                    moved += 1;
                    self.metrics.replication.rebalanced.inc();
                }
                Err(e) => {
                    warn!(blob = %file.name, error = %e, "a rebalancing move of a plain object failed; it is tried again");
                }
            }
            if moved == most {
                *cursor = Some(file.name.clone());
                break;
            }
        }
        if moved > 0 {
            info!(moved, "moved plain objects to where placement puts them");
        }
        Ok(())
    }

    async fn move_file(&self, file: &BlobHolders, step: &FileMove) -> Result<(), ReplicationError> {
        match step {
            FileMove::CopyTo(to) => {
                let copy = self
                    .read_local_blob(&file.name, &file.sha256)
                    .await
                    .map_err(|e| ReplicationError::Peer {
                        url: "this node".into(),
                        reason: e.to_string(),
                    })?;
                let bytes = copy.bytes.len() as u64;
                self.front
                    .peers
                    .put_blob(&to.url, copy)
                    .await
                    .map_err(|e| ReplicationError::Peer {
                        url: to.url.clone(),
                        reason: e.message().to_string(),
                    })?;
                self.metrics.replication.copied_bytes.inc_by(bytes);
                Ok(())
            }
            FileMove::DropHere => self.drop_local_blob(&file.name).await.map(drop),
        }
    }

    /// A page of the files this node holds after `cursor` (moved on; `None` again after the
    /// last page).
    async fn held_files(
        &self,
        cursor: &mut Option<String>,
        limit: u32,
    ) -> Result<Vec<BlobHolders>, ReplicationError> {
        let (catalog, after) = (self.catalog.clone(), cursor.clone());
        let page =
            tokio::task::spawn_blocking(move || catalog.held_blobs_after(after.as_deref(), limit))
                .await??;
        *cursor = if page.len() < limit as usize {
            None
        } else {
            page.last().map(|f| f.name.clone())
        };
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, live: bool) -> PlacementNode {
        placement::test_node(name, live, 100)
    }

    fn file(sha256: &str, holders: &[&str]) -> BlobHolders {
        BlobHolders {
            name: "f".into(),
            sha256: sha256.into(),
            holders: holders.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn the_lowest_holder_copies_first_and_a_holder_drops_only_itself_once_placement_holds_it() {
        let nodes = [node("a", true), node("b", true), node("c", true)];
        let mut moves = 0;
        for i in 0..200 {
            let sha = format!("{i:064x}");
            let desired: Vec<String> = placement::place(placement::key_of(&sha), &nodes, 2)
                .into_iter()
                .map(|n| n.name)
                .collect();
            let f = file(&sha, &["a", "b"]);
            let (from_a, from_b) = (plan(&f, &nodes, 2, "a"), plan(&f, &nodes, 2, "b"));
            assert_eq!(from_b, None, "only the lowest holder copies");
            match from_a {
                None => assert!(desired.contains(&"a".into()) && desired.contains(&"b".into())),
                Some(m) => {
                    moves += 1;
                    assert_eq!(m, FileMove::CopyTo(node("c", true)));
                    // Once c holds it, the holder placement no longer names drops its copy.
                    let after = file(&sha, &["a", "b", "c"]);
                    let leaving = if desired.contains(&"a".to_string()) {
                        "b"
                    } else {
                        "a"
                    };
                    assert_eq!(plan(&after, &nodes, 2, leaving), Some(FileMove::DropHere));
                    for stays in desired {
                        assert_eq!(plan(&after, &nodes, 2, &stays), None);
                    }
                }
            }
        }
        assert!((100..170).contains(&moves), "{moves} of 200 move to c");
    }

    #[test]
    fn files_short_of_copies_or_on_a_dead_node_stay() {
        let nodes = [node("a", true), node("b", true), node("c", false)];
        assert_eq!(plan(&file("x", &["a"]), &nodes, 2, "a"), None);
        assert_eq!(plan(&file("x", &["a", "c"]), &nodes, 2, "a"), None);
    }
}
