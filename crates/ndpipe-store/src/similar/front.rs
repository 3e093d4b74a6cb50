//! A front door's similarity query (`ndpipe serve`, every PipeStore, `ndpipe gateway`): the
//! query vector (a stored photo's features from this node or a holder, or a posted photo's
//! computed here or by a live PipeStore), then every live node's k best within one deadline,
//! merged by score with duplicate ids (copies) dropped. Nodes that did not answer in time, or
//! answered an error, are named and the answer is marked partial; it never waits past the
//! deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ndpipe_catalog::{PlacementNode, ReplicaCatalog};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};
use serde::Serialize;

use super::metrics::SimilarMetrics;
use super::peers::{SimilarPeers, client_error};
use super::{Embedder, NodeHits, Queries, SimilarError, SimilarIndex};
use crate::storage::PhotoStore;

/// Settings of a front door's queries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrontSettings {
    /// The whole query's deadline, the fan-out included.
    pub(crate) timeout: Duration,
    /// Hits when the client names no `k`.
    pub(crate) default_k: usize,
    /// Largest `k` a client may ask for.
    pub(crate) max_k: usize,
}

/// The node a PipeStore's front door runs on.
pub(crate) struct Local {
    /// Its name in the cluster (its hits carry it).
    pub(crate) name: String,
    pub(crate) index: Arc<SimilarIndex>,
    pub(crate) embedder: Embedder,
    pub(crate) store: Arc<PhotoStore>,
}

/// How a front door reaches the nodes of a replicated cluster.
pub(crate) struct ClusterAccess {
    /// The replica map: the nodes, their leases and each photo's holders.
    pub(crate) catalog: Arc<dyn ReplicaCatalog>,
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) tls: Option<Tls>,
    /// Largest message to a node: a query photo and some room.
    pub(crate) max_message: usize,
}

/// The other nodes of a replicated cluster, and how to reach them.
struct Cluster {
    catalog: Arc<dyn ReplicaCatalog>,
    peers: SimilarPeers,
}

/// A front door's similarity queries.
pub(crate) struct SimilarFront {
    settings: FrontSettings,
    metrics: SimilarMetrics,
    local: Option<Local>,
    cluster: Option<Cluster>,
}

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
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Missing {
    pub(crate) node: String,
    pub(crate) reason: String,
}

impl SimilarFront {
    /// A front door answering from `local` (a PipeStore) and, on a replicated cluster, from
    /// every node `catalog` registers, called with `secret` over `tls` with query photos up
    /// to `max_message` bytes.
    pub(crate) fn new(
        settings: FrontSettings,
        metrics: SimilarMetrics,
        local: Option<Local>,
        cluster: Option<ClusterAccess>,
    ) -> Self {
        SimilarFront {
            settings,
            metrics,
            local,
            cluster: cluster.map(|c| Cluster {
                catalog: c.catalog,
                peers: SimilarPeers::new(c.secret, c.tls, c.max_message),
            }),
        }
    }

    /// `k`, else the default, checked against `1..=max_k`.
    pub(crate) fn k(&self, k: Option<usize>) -> Result<usize, SimilarError> {
        let k = k.unwrap_or(self.settings.default_k);
        if k == 0 || k > self.settings.max_k {
            return Err(SimilarError::BadQuery(format!(
                "k must be 1..={}, not {k}",
                self.settings.max_k
            )));
        }
        Ok(k)
    }

    /// The photos most similar to stored photo `id` (itself left out).
    pub(crate) async fn by_photo(&self, id: u64, k: usize) -> Result<Answer, SimilarError> {
        let started = Instant::now();
        let deadline = started + self.settings.timeout;
        let (backbone, query) = self.photo_features(id, deadline).await?;
        let answer = self
            .fan_out(&backbone, query, k, Some(id), deadline)
            .await?;
        self.metrics.query("photo", started.elapsed().as_secs_f64());
        Ok(answer)
    }

    /// The photos most similar to the posted photo `bytes` (not stored).
    pub(crate) async fn by_upload(
        &self,
        bytes: bytes::Bytes,
        k: usize,
    ) -> Result<Answer, SimilarError> {
        let started = Instant::now();
        let deadline = started + self.settings.timeout;
        let (backbone, query) = self.embed(bytes, deadline).await?;
        let answer = self.fan_out(&backbone, query, k, None, deadline).await?;
        self.metrics
            .query("upload", started.elapsed().as_secs_f64());
        Ok(answer)
    }

    /// Photo `id`'s stored features under the active backbone: this node's, else a holder's.
    async fn photo_features(
        &self,
        id: u64,
        deadline: Instant,
    ) -> Result<(String, Vec<f32>), SimilarError> {
        if let Some(local) = &self.local {
            let (store, index) = (local.store.clone(), local.index.clone());
            let found = tokio::task::spawn_blocking(move || {
                if !store.contains(id)? {
                    return Ok(None);
                }
                match index.features_of(id)? {
                    Some(f) => Ok(Some(f)),
                    None => Err(SimilarError::NotLabelled {
                        id,
                        backbone: index.active_backbone(),
                    }),
                }
            })
            .await??;
            if let Some(found) = found {
                return Ok(found);
            }
        }
        match &self.cluster {
            Some(cluster) => self.holder_features(cluster, id, deadline).await,
            None => Err(SimilarError::NotFound(id)),
        }
    }

    /// Photo `id`'s stored features from a holder other than this node, live ones first.
    async fn holder_features(
        &self,
        cluster: &Cluster,
        id: u64,
        deadline: Instant,
    ) -> Result<(String, Vec<f32>), SimilarError> {
        let catalog = cluster.catalog.clone();
        let copies = within(deadline, async {
            Ok(tokio::task::spawn_blocking(move || catalog.copies(id)).await?)
        })
        .await?
        .map_err(|e| SimilarError::Unavailable(format!("the catalog: {e}")))?
        .ok_or(SimilarError::NotFound(id))?;
        let mut tried = Vec::new();
        for node in self.nodes(cluster, deadline).await? {
            if !copies.holders.contains(&node.name) || self.is_here(&node.name) || !node.live {
                continue;
            }
            let left = remaining(deadline)?;
            match cluster.peers.features(&node.url, id, left).await {
                Ok(f) => return Ok((f.backbone, f.features)),
                Err(status) => match client_error(&status) {
                    Some(e @ SimilarError::Remote { status: 409, .. }) => return Err(e),
                    _ => tried.push(format!("{}: {}", node.name, status.message())),
                },
            }
        }
        if tried.is_empty() {
            tried.push("no live node holds a copy".into());
        }
        Err(SimilarError::Unavailable(tried.join("; ")))
    }

    /// The features of a query photo: computed here, else by the first live PipeStore that
    /// answers (a gateway's case).
    async fn embed(
        &self,
        bytes: bytes::Bytes,
        deadline: Instant,
    ) -> Result<(String, Vec<f32>), SimilarError> {
        if let Some(local) = &self.local {
            return within(deadline, local.embedder.embed(bytes)).await;
        }
        let Some(cluster) = &self.cluster else {
            return Err(SimilarError::NoModel);
        };
        let mut tried = Vec::new();
        for node in self.nodes(cluster, deadline).await? {
            if !node.live {
                continue;
            }
            let left = remaining(deadline)?;
            match cluster.peers.embed(&node.url, bytes.to_vec(), left).await {
                Ok(f) => return Ok((f.backbone, f.features)),
                Err(status) => match client_error(&status) {
                    Some(e) => return Err(e),
                    None => tried.push(format!("{}: {}", node.name, status.message())),
                },
            }
        }
        if tried.is_empty() {
            tried.push("no PipeStore is live".into());
        }
        Err(SimilarError::Unavailable(tried.join("; ")))
    }

    /// Every registered node, read from the catalog within the deadline.
    async fn nodes(
        &self,
        cluster: &Cluster,
        deadline: Instant,
    ) -> Result<Vec<PlacementNode>, SimilarError> {
        let catalog = cluster.catalog.clone();
        within(deadline, async {
            Ok(tokio::task::spawn_blocking(move || catalog.placement_nodes()).await?)
        })
        .await?
        .map_err(|e| SimilarError::Unavailable(format!("the catalog: {e}")))
    }

    fn is_here(&self, node: &str) -> bool {
        self.local.as_ref().is_some_and(|l| l.name == node)
    }

    /// Every live node's hits for `query`, merged.
    async fn fan_out(
        &self,
        backbone: &str,
        query: Vec<f32>,
        k: usize,
        exclude: Option<u64>,
        deadline: Instant,
    ) -> Result<Answer, SimilarError> {
        let nodes = match &self.cluster {
            Some(cluster) => self.nodes(cluster, deadline).await?,
            None => Vec::new(),
        };
        let asks = Asks {
            backbone,
            query: &query,
            k,
            exclude,
            deadline,
        };
        let mut calls = Vec::new();
        if let Some(local) = &self.local {
            calls.push(self.ask_local(local, &asks));
        }
        let mut answers: Vec<(String, bool, Result<NodeHits, String>)> = Vec::new();
        let remote = nodes.iter().filter(|n| !self.is_here(&n.name));
        let mut remote_calls = Vec::new();
        for node in remote {
            if node.live {
                remote_calls.push(self.ask_remote(node, &asks));
            } else {
                answers.push((node.name.clone(), false, Err("no live lease".into())));
            }
        }
        let (local, remote) = futures::join!(join_all(calls), join_all(remote_calls));
        answers.extend(local);
        answers.extend(remote);
        Ok(merge(backbone, k, answers))
    }

    /// This node's own hits, on a blocking thread, within the deadline.
    async fn ask_local(
        &self,
        local: &Local,
        asks: &Asks<'_>,
    ) -> (String, bool, Result<NodeHits, String>) {
        let index = local.index.clone();
        let (backbone, query, k, exclude) = (
            asks.backbone.to_string(),
            asks.query.to_vec(),
            asks.k,
            asks.exclude.into_iter().collect::<Vec<_>>(),
        );
        let searched = within(asks.deadline, async move {
            tokio::task::spawn_blocking(move || {
                index.search(&Queries {
                    backbone: &backbone,
                    vectors: &query,
                    dim: query.len(),
                    k,
                    min_score: f32::MIN,
                    exclude: &exclude,
                })
            })
            .await?
        })
        .await;
        (
            local.name.clone(),
            true,
            searched.map_err(|e| e.to_string()),
        )
    }

    /// A remote node's hits, within the deadline.
    async fn ask_remote(
        &self,
        node: &PlacementNode,
        asks: &Asks<'_>,
    ) -> (String, bool, Result<NodeHits, String>) {
        let Some(cluster) = &self.cluster else {
            return (node.name.clone(), node.live, Err("no cluster".into()));
        };
        let req = pb::SimilarSearchRequest {
            backbone: asks.backbone.into(),
            dim: u32::try_from(asks.query.len()).unwrap_or(u32::MAX),
            queries: asks.query.to_vec(),
            k: u32::try_from(asks.k).unwrap_or(u32::MAX),
            min_score: f32::MIN,
            exclude: asks.exclude.into_iter().collect(),
        };
        let answer = match remaining(asks.deadline) {
            Ok(left) => match cluster.peers.search(&node.url, req, left).await {
                Ok(reply) => hits_of(reply),
                Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                    Err("timeout".into())
                }
                Err(status) => Err(status.message().to_string()),
            },
            Err(_) => Err("timeout".into()),
        };
        (node.name.clone(), node.live, answer)
    }
}

/// What every node is asked.
struct Asks<'a> {
    backbone: &'a str,
    query: &'a [f32],
    k: usize,
    exclude: Option<u64>,
    deadline: Instant,
}

/// A node's reply to one query as [`NodeHits`]; a reply that does not add up is an error.
fn hits_of(reply: pb::SimilarSearchReply) -> Result<NodeHits, String> {
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

/// The nodes' answers as one: each id once with its best score, the best k, the nodes that
/// did not answer or answered from an index being built.
fn merge(
    backbone: &str,
    k: usize,
    answers: Vec<(String, bool, Result<NodeHits, String>)>,
) -> Answer {
    let mut best: HashMap<u64, Hit> = HashMap::new();
    let mut not_answered = Vec::new();
    let mut building = Vec::new();
    for (node, live, answer) in answers {
        let hits = match answer {
            Ok(h) if h.backbone != backbone => {
                not_answered.push(Missing {
                    node,
                    reason: format!("its index is of backbone {}", h.backbone),
                });
                continue;
            }
            Ok(h) => h,
            Err(reason) => {
                not_answered.push(Missing { node, reason });
                continue;
            }
        };
        if hits.building {
            building.push(node.clone());
        }
        for (id, score) in hits.hits.into_iter().flatten() {
            let better = best.get(&id).is_none_or(|h| score > h.score);
            if better {
                let (node, available) = (node.clone(), live);
                best.insert(
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
    let mut hits: Vec<Hit> = best.into_values().collect();
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
    hits.truncate(k);
    not_answered.sort_by(|a, b| a.node.cmp(&b.node));
    building.sort();
    Answer {
        backbone: backbone.into(),
        k,
        hits,
        partial: !not_answered.is_empty() || !building.is_empty(),
        not_answered,
        building,
    }
}

/// Time left before `deadline`, or a timeout.
fn remaining(deadline: Instant) -> Result<Duration, SimilarError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| SimilarError::Unavailable("the query's deadline passed".into()))
}

/// `work`, unless `deadline` passes first.
async fn within<T>(
    deadline: Instant,
    work: impl Future<Output = Result<T, SimilarError>>,
) -> Result<T, SimilarError> {
    let left = remaining(deadline)?;
    tokio::time::timeout(left, work)
        .await
        .map_err(|_| SimilarError::Unavailable("the query's deadline passed".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(backbone: &str, building: bool, hits: Vec<(u64, f32)>) -> Result<NodeHits, String> {
        Ok(NodeHits {
            backbone: backbone.into(),
            building,
            hits: vec![hits],
        })
    }

    #[test]
    fn merge_keeps_each_id_once_by_its_best_score_and_names_the_silent_nodes() {
        let answer = merge(
            "bb",
            3,
            vec![
                (
                    "a".into(),
                    true,
                    hits("bb", false, vec![(1, 0.9), (2, 0.5)]),
                ),
                (
                    "b".into(),
                    true,
                    hits("bb", true, vec![(1, 0.9), (3, 0.7), (4, 0.1)]),
                ),
                ("c".into(), true, Err("timeout".into())),
                ("d".into(), true, hits("other", false, vec![(9, 1.0)])),
            ],
        );
        let ids: Vec<u64> = answer.hits.iter().map(|h| h.id).collect();
        assert_eq!(ids, vec![1, 3, 2]);
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
            vec![("a".into(), true, hits("bb", false, vec![(1, 0.9)]))],
        );
        assert!(!answer.partial);
        assert_eq!(answer.hits.len(), 1);
        assert_eq!(answer.hits[0].node, "a");
    }
}
