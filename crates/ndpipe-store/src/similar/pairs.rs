//! The semantic level of duplicate finding from the similarity index: every photo this node
//! holds features of is a query ([`SimilarFront::neighbours`]), and each neighbour at or above
//! the threshold makes a pair. On one node that is every pair; on a replicated cluster, every
//! pair with a photo this node holds (primary or copy), the other photo anywhere.
//!
//! Each photo asks for up to the front door's default `k` neighbours: a group larger than that
//! is still one group, joined through its members' neighbours. The answer is kept for
//! [`KEEP`], so that paging through the groups does not search again for every page.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_util::sync::lock;

use super::{SimilarError, SimilarFront};
use crate::duplicates::semantic::{SemanticPair, SemanticPairs, SemanticUnavailable};

/// How long one search's pairs answer later requests at the same threshold.
const KEEP: Duration = Duration::from_secs(60);
/// Photos per call of [`SimilarFront::neighbours`].
const CALL: usize = 1024;

/// Pairs at one threshold, and when they were found.
struct Found {
    min_cosine: f64,
    at: Instant,
    pairs: Arc<Vec<SemanticPair>>,
}

/// A PipeStore's [`SemanticPairs`] source: its similarity index, queried with its photos.
pub(crate) struct IndexPairs {
    front: Arc<SimilarFront>,
    last: Mutex<Option<Found>>,
}

impl IndexPairs {
    /// Pairs from the photos `front` has features of (a PipeStore's front door).
    pub(crate) fn new(front: Arc<SimilarFront>) -> Self {
        IndexPairs {
            front,
            last: Mutex::new(None),
        }
    }

    /// [`IndexPairs::new`] as the source a front door takes.
    pub(crate) fn source(front: Arc<SimilarFront>) -> Arc<dyn SemanticPairs> {
        Arc::new(IndexPairs::new(front))
    }

    /// The pairs found within [`KEEP`] at `min_cosine`, if any.
    fn kept(&self, min_cosine: f64) -> Option<Arc<Vec<SemanticPair>>> {
        lock(&self.last)
            .as_ref()
            .filter(|f| f.min_cosine == min_cosine && f.at.elapsed() < KEEP)
            .map(|f| f.pairs.clone())
    }

    /// Searches the neighbours of every photo with features here.
    async fn search(&self, min_cosine: f64) -> Result<Vec<SemanticPair>, SemanticUnavailable> {
        let local = self.front.local().ok_or(SimilarError::NoModel)?;
        let index = local.index.clone();
        let ids = tokio::task::spawn_blocking(move || index.stored_ids())
            .await
            .map_err(SimilarError::from)??;
        let k = self.front.k(None)?;
        let mut best: HashMap<(u64, u64), f32> = HashMap::new();
        for chunk in ids.chunks(CALL) {
            let answer = self.front.neighbours(chunk, min_cosine as f32, k).await?;
            if answer.partial() {
                return Err(SemanticUnavailable {
                    reason: partial_reason(&answer),
                });
            }
            for photo in &answer.photos {
                for hit in &photo.hits {
                    let key = (photo.id.min(hit.id), photo.id.max(hit.id));
                    let score = best.entry(key).or_insert(hit.score);
                    *score = score.max(hit.score);
                }
            }
        }
        let mut pairs: Vec<SemanticPair> = best
            .into_iter()
            .map(|((a, b), cosine)| SemanticPair {
                a,
                b,
                cosine: f64::from(cosine),
            })
            .collect();
        pairs.sort_by_key(|p| (p.a, p.b));
        Ok(pairs)
    }
}

/// Why an answer is partial: the nodes that did not answer or were building their index.
fn partial_reason(answer: &super::Neighbours) -> String {
    let silent: Vec<String> = answer
        .not_answered
        .iter()
        .map(|m| format!("{} ({})", m.node, m.reason))
        .collect();
    format!(
        "not every node answered: silent {:?}, index still being built on {:?}; retry later",
        silent, answer.building
    )
}

impl From<SimilarError> for SemanticUnavailable {
    fn from(e: SimilarError) -> Self {
        SemanticUnavailable {
            reason: e.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl SemanticPairs for IndexPairs {
    async fn pairs(&self, min_cosine: f64) -> Result<Vec<SemanticPair>, SemanticUnavailable> {
        if let Some(pairs) = self.kept(min_cosine) {
            return Ok(pairs.as_ref().clone());
        }
        let pairs = self.search(min_cosine).await?;
        *lock(&self.last) = Some(Found {
            min_cosine,
            at: Instant::now(),
            pairs: Arc::new(pairs.clone()),
        });
        Ok(pairs)
    }
}
