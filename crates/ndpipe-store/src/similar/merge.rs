//! The nodes' answers to one batch of queries as one: per query, each photo id once (copies
//! on several holders) with its best score, the best k; the nodes that did not answer, or
//! answered from an index still being built, named.

use std::collections::HashMap;

use ndpipe_proto::pb;
use serde::Serialize;

use super::NodeHits;

/// The answer to a similarity query.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Answer {
    /// The backbone the query vector and the hits' scores come from.
    pub(crate) backbone: String,
    pub(crate) k: usize,
    /// Up to k photos, most similar first, each id once.
    pub(crate) hits: Vec<Hit>,
    /// Whether some node did not answer, or answered from an index still being built.
    pub(crate) partial: bool,
    /// The nodes that did not answer, and why.
    pub(crate) not_answered: Vec<Missing>,
    /// The nodes whose index was still being built.
    pub(crate) building: Vec<String>,
}

/// One similar photo.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Hit {
    pub(crate) id: u64,
    /// Cosine similarity of the features, 1 for the same direction.
    pub(crate) score: f32,
    /// The node that answered with it.
    pub(crate) node: String,
    /// Whether that node has a live lease (always on a single node).
    pub(crate) available: bool,
}

/// A node that did not answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Missing {
    pub(crate) node: String,
    pub(crate) reason: String,
}

/// One node's answer to a batch: its name, whether it has a live lease, and its hits or why
/// it has none.
pub(super) type NodeAnswer = (String, bool, Result<NodeHits, String>);

/// A batch's answers merged.
#[derive(Debug, Clone)]
pub(crate) struct Merged {
    /// Per query, in order: up to k photos, most similar first, each id once.
    pub(crate) hits: Vec<Vec<Hit>>,
    /// The nodes that did not answer (or answered something unusable), and why.
    pub(crate) not_answered: Vec<Missing>,
    /// The nodes whose index was still being built.
    pub(crate) building: Vec<String>,
}

impl Merged {
    /// Whether some node's hits are missing or may be incomplete.
    pub(crate) fn partial(&self) -> bool {
        !self.not_answered.is_empty() || !self.building.is_empty()
    }

    /// The answer to a single query (the batch's first).
    pub(crate) fn into_answer(self, backbone: &str, k: usize) -> Answer {
        let partial = self.partial();
        Answer {
            backbone: backbone.into(),
            k,
            hits: self.hits.into_iter().next().unwrap_or_default(),
            partial,
            not_answered: self.not_answered,
            building: self.building,
        }
    }
}

/// A node's reply as [`NodeHits`]; a reply that does not add up is an error.
pub(super) fn hits_of(reply: pb::SimilarSearchReply) -> Result<NodeHits, String> {
    let hits = reply
        .results
        .into_iter()
        .map(|r| {
            if r.ids.len() == r.scores.len() {
                Ok(r.ids.into_iter().zip(r.scores).collect())
            } else {
                Err(format!(
                    "{} ids with {} scores",
                    r.ids.len(),
                    r.scores.len()
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeHits {
        backbone: reply.backbone,
        building: reply.building,
        hits,
    })
}

/// The nodes' answers to `queries` queries of `backbone` as one, k hits per query at most.
pub(super) fn merge(backbone: &str, k: usize, queries: usize, answers: Vec<NodeAnswer>) -> Merged {
    let mut best: Vec<HashMap<u64, Hit>> = vec![HashMap::new(); queries];
    let mut not_answered = Vec::new();
    let mut building = Vec::new();
    for (node, live, answer) in answers {
        let hits = match usable(backbone, queries, answer) {
            Ok(h) => h,
            Err(reason) => {
                not_answered.push(Missing { node, reason });
                continue;
            }
        };
        if hits.building {
            building.push(node.clone());
        }
        for (query, found) in best.iter_mut().zip(hits.hits) {
            for (id, score) in found {
                if query.get(&id).is_none_or(|h| score > h.score) {
                    let (node, available) = (node.clone(), live);
                    query.insert(
                        id,
                        Hit {
                            id,
                            score,
                            node,
                            available,
                        },
                    );
                }
            }
        }
    }
    not_answered.sort_by(|a, b| a.node.cmp(&b.node));
    building.sort();
    Merged {
        hits: best.into_iter().map(|q| top(q, k)).collect(),
        not_answered,
        building,
    }
}

/// A node's hits, unless it answered an error, for another backbone, or for another number
/// of queries.
fn usable(
    backbone: &str,
    queries: usize,
    answer: Result<NodeHits, String>,
) -> Result<NodeHits, String> {
    let hits = answer?;
    if hits.backbone != backbone {
        return Err(format!("its index is of backbone {}", hits.backbone));
    }
    if hits.hits.len() != queries {
        return Err(format!(
            "it answered {} results for {queries} queries",
            hits.hits.len()
        ));
    }
    Ok(hits)
}

/// The best `k` of one query's hits, most similar first (ties by id).
fn top(hits: HashMap<u64, Hit>, k: usize) -> Vec<Hit> {
    let mut hits: Vec<Hit> = hits.into_values().collect();
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
    hits.truncate(k);
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(
        backbone: &str,
        building: bool,
        hits: Vec<Vec<(u64, f32)>>,
    ) -> Result<NodeHits, String> {
        Ok(NodeHits {
            backbone: backbone.into(),
            building,
            hits,
        })
    }

    fn ids(hits: &[Hit]) -> Vec<u64> {
        hits.iter().map(|h| h.id).collect()
    }

    #[test]
    fn merge_keeps_each_id_once_by_its_best_score_and_names_the_silent_nodes() {
        let answer = merge(
            "bb",
            3,
            1,
            vec![
                (
                    "a".into(),
                    true,
                    hits("bb", false, vec![vec![(1, 0.9), (2, 0.5)]]),
                ),
                (
                    "b".into(),
                    true,
                    hits("bb", true, vec![vec![(1, 0.9), (3, 0.7), (4, 0.1)]]),
                ),
                ("c".into(), true, Err("timeout".into())),
                ("d".into(), true, hits("other", false, vec![vec![(9, 1.0)]])),
            ],
        )
        .into_answer("bb", 3);
        assert_eq!(ids(&answer.hits), vec![1, 3, 2]);
        assert!(answer.partial);
        assert_eq!(answer.building, vec!["b".to_string()]);
        let silent: Vec<&str> = answer
            .not_answered
            .iter()
            .map(|m| m.node.as_str())
            .collect();
        assert_eq!(silent, vec!["c", "d"]);
    }

    #[test]
    fn an_answer_of_every_node_is_complete() {
        let answer = merge(
            "bb",
            10,
            1,
            vec![("a".into(), true, hits("bb", false, vec![vec![(1, 0.9)]]))],
        )
        .into_answer("bb", 10);
        assert!(!answer.partial);
        assert_eq!(answer.hits.len(), 1);
        assert_eq!(answer.hits[0].node, "a");
    }

    #[test]
    fn a_batch_is_merged_query_by_query_and_a_short_reply_is_not_used() {
        let merged = merge(
            "bb",
            2,
            2,
            vec![
                (
                    "a".into(),
                    true,
                    hits("bb", false, vec![vec![(1, 0.99)], vec![(5, 0.97)]]),
                ),
                (
                    "b".into(),
                    false,
                    hits(
                        "bb",
                        false,
                        vec![vec![(2, 0.98)], vec![(6, 0.99), (7, 0.96)]],
                    ),
                ),
                ("c".into(), true, hits("bb", false, vec![vec![(8, 1.0)]])),
            ],
        );
        assert_eq!(ids(&merged.hits[0]), vec![1, 2]);
        assert_eq!(ids(&merged.hits[1]), vec![6, 5]);
        assert!(!merged.hits[1][0].available, "b has no live lease");
        assert_eq!(merged.not_answered.len(), 1);
        assert_eq!(merged.not_answered[0].node, "c");
        assert!(merged.partial());
    }
}
