//! The batch API for semantic duplicates: for photos of this node, their neighbours across the
//! cluster whose cosine similarity is at least a threshold. The photos' stored features (the
//! active backbone's) are the queries; they go out in batches of [`NEIGHBOUR_BATCH`], one
//! `Similar/Search` call per live node per batch (`min_score` applied by each node), each
//! batch within the query deadline (`similar_timeout_ms`), and the answers are merged photo by
//! photo as a single query's are. A pair of duplicates held on two nodes is found from both
//! sides, once by each node's run.

use std::time::Instant;

use serde::Serialize;

use super::front::Asks;
use super::merge::{Hit, Merged, Missing};
use super::{SimilarError, SimilarFront};

/// Photos whose neighbours one call to a node asks for (64 queries of 1280-d features are
/// 320 KiB, well within a message).
pub(crate) const NEIGHBOUR_BATCH: usize = 64;

/// One photo's neighbours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PhotoNeighbours {
    /// The photo asked about.
    pub(crate) id: u64,
    /// Up to k other photos at or above the least score, most similar first, each id once,
    /// with the node that answered and whether it is live.
    pub(crate) hits: Vec<Hit>,
}

/// The neighbours of a batch of this node's photos.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Neighbours {
    /// The backbone whose features were compared.
    pub(crate) backbone: String,
    /// Each photo asked about that has features, in the order asked.
    pub(crate) photos: Vec<PhotoNeighbours>,
    /// The photos asked about without features under the backbone here (not labelled yet, or
    /// not held by this node): not searched.
    pub(crate) without_features: Vec<u64>,
    /// The nodes that did not answer some batch, and why (the first reason given).
    pub(crate) not_answered: Vec<Missing>,
    /// The nodes that answered some batch from an index still being built.
    pub(crate) building: Vec<String>,
}

impl Neighbours {
    /// Whether some node's photos may be missing from the answer.
    pub(crate) fn partial(&self) -> bool {
        !self.not_answered.is_empty() || !self.building.is_empty()
    }

    /// Adds a batch's merged answers for `ids`.
    fn add(&mut self, ids: &[u64], merged: Merged) {
        for (&id, hits) in ids.iter().zip(merged.hits) {
            self.photos.push(PhotoNeighbours { id, hits });
        }
        for missing in merged.not_answered {
            if !self.not_answered.iter().any(|m| m.node == missing.node) {
                self.not_answered.push(missing);
            }
        }
        for node in merged.building {
            if !self.building.contains(&node) {
                self.building.push(node);
            }
        }
    }
}

impl SimilarFront {
    /// For each of `ids`, photos of this node, up to `k` (`1..=similar_max_k`) photos of the
    /// whole cluster whose features' cosine similarity to its own is at least `min_score`
    /// (`-1..=1`; e.g. 0.95 for semantic duplicates), itself left out. Only a PipeStore with a
    /// model has features to ask with: elsewhere [`SimilarError::NoModel`]. A node that does
    /// not answer a batch within the deadline is named in the answer, never waited for longer.
    pub(crate) async fn neighbours(
        &self,
        ids: &[u64],
        min_score: f32,
        k: usize,
    ) -> Result<Neighbours, SimilarError> {
        let started = Instant::now();
        let k = self.k(Some(k))?;
        if !(-1.0..=1.0).contains(&min_score) {
            return Err(SimilarError::BadQuery(format!(
                "min_score must be in -1..=1, not {min_score}"
            )));
        }
        let index = self.local().ok_or(SimilarError::NoModel)?.index.clone();
        let asked = ids.to_vec();
        let (backbone, found) =
            tokio::task::spawn_blocking(move || index.features_of_many(&asked)).await??;
        let mut answer = Neighbours {
            backbone,
            photos: Vec::with_capacity(found.len()),
            without_features: Vec::new(),
            not_answered: Vec::new(),
            building: Vec::new(),
        };
        let mut with: Vec<(u64, Vec<f32>)> = Vec::with_capacity(found.len());
        for (id, features) in found {
            match features {
                Some(f) => with.push((id, f)),
                None => answer.without_features.push(id),
            }
        }
        for batch in with.chunks(NEIGHBOUR_BATCH) {
            let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
            let dim = batch[0].1.len();
            let queries: Vec<f32> = batch.iter().flat_map(|(_, f)| f.iter().copied()).collect();
            let merged = self
                .fan_out(&Asks {
                    backbone: &answer.backbone,
                    dim,
                    queries: &queries,
                    k,
                    min_score,
                    exclude: &ids,
                    deadline: Instant::now() + self.timeout(),
                })
                .await?;
            answer.add(&ids, merged);
        }
        self.metrics()
            .query("neighbours", started.elapsed().as_secs_f64());
        Ok(answer)
    }
}
