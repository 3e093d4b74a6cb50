//! A front door's similarity query (`ndpipe serve`, every PipeStore, `ndpipe gateway`): the
//! query vector (a stored photo's features from this node or a holder, or a posted photo's
//! computed here or by a live PipeStore), then every live node's k best within one deadline,
//! merged by score with duplicate ids (copies) dropped. Nodes that did not answer in time, or
//! answered an error, are named and the answer is marked partial; it never waits past the
//! deadline. A batch of queries (`neighbours.rs`) goes out the same way, one call per node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ndpipe_catalog::{PlacementNode, ReplicaCatalog};
use ndpipe_proto::pb;
use ndpipe_proto::transport::{ClusterSecret, Tls};

use super::hedge::first_answer;
use super::merge::{Answer, Merged, NodeAnswer, hits_of, merge};
use super::metrics::SimilarMetrics;
use super::peers::{SimilarPeers, client_error};
use super::{Embedder, Queries, SimilarError, SimilarIndex};
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

    /// This node's part, on a PipeStore with a model.
    pub(super) fn local(&self) -> Option<&Local> {
        self.local.as_ref()
    }

    /// The deadline of one query, or of one batch.
    pub(super) fn timeout(&self) -> Duration {
        self.settings.timeout
    }

    /// The query counts and latencies.
    pub(super) fn metrics(&self) -> &SimilarMetrics {
        &self.metrics
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
        let merged = self
            .fan_out(&Asks::one(&backbone, &query, k, &[id], deadline))
            .await?;
        self.metrics.query("photo", started.elapsed().as_secs_f64());
        Ok(merged.into_answer(&backbone, k))
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
        let merged = self
            .fan_out(&Asks::one(&backbone, &query, k, &[], deadline))
            .await?;
        self.metrics
            .query("upload", started.elapsed().as_secs_f64());
        Ok(merged.into_answer(&backbone, k))
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

    /// Photo `id`'s stored features from a live holder other than this node (the next holder
    /// asked when one fails or is slow); a 409 from a holder is the answer.
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
        let holders: Vec<PlacementNode> = self
            .nodes(cluster, deadline)
            .await?
            .into_iter()
            .filter(|n| copies.holders.contains(&n.name) && !self.is_here(&n.name) && n.live)
            .collect();
        let left = remaining(deadline)?;
        let ask = |node: &PlacementNode| {
            let url = node.url.clone();
            async move { cluster.peers.features(&url, id, left).await }
        };
        let not_labelled = |status: &tonic::Status| match client_error(status) {
            Some(e @ SimilarError::Remote { status: 409, .. }) => Some(e),
            _ => None,
        };
        let found = within(deadline, async {
            first_answer(
                holders,
                self.stagger(),
                ask,
                not_labelled,
                "no live node holds a copy",
            )
            .await
        })
        .await?;
        Ok((found.backbone, found.features))
    }

    /// The features of a query photo: computed here, else by a live PipeStore (a gateway's
    /// case; the next one asked when one fails or is slow).
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
        let live: Vec<PlacementNode> = self
            .nodes(cluster, deadline)
            .await?
            .into_iter()
            .filter(|n| n.live)
            .collect();
        let left = remaining(deadline)?;
        let ask = |node: &PlacementNode| {
            let (url, photo) = (node.url.clone(), bytes.to_vec());
            async move { cluster.peers.embed(&url, photo, left).await }
        };
        let found = within(deadline, async {
            first_answer(
                live,
                self.stagger(),
                ask,
                client_error,
                "no PipeStore is live",
            )
            .await
        })
        .await?;
        Ok((found.backbone, found.features))
    }

    /// How long the nodes asked for a query's features may be silent before the next is asked.
    fn stagger(&self) -> Duration {
        self.settings.timeout / 4
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

    /// Every live node's hits for a batch of queries, merged query by query.
    pub(super) async fn fan_out(&self, asks: &Asks<'_>) -> Result<Merged, SimilarError> {
        let nodes = match &self.cluster {
            Some(cluster) => self.nodes(cluster, asks.deadline).await?,
            None => Vec::new(),
        };
        let mut calls = Vec::new();
        if let Some(local) = &self.local {
            calls.push(self.ask_local(local, asks));
        }
        let mut answers: Vec<NodeAnswer> = Vec::new();
        let remote = nodes.iter().filter(|n| !self.is_here(&n.name));
        let mut remote_calls = Vec::new();
        for node in remote {
            if node.live {
                remote_calls.push(self.ask_remote(node, asks));
            } else {
                answers.push((node.name.clone(), false, Err("no live lease".into())));
            }
        }
        let (local, remote) = futures::join!(join_all(calls), join_all(remote_calls));
        answers.extend(local);
        answers.extend(remote);
        Ok(merge(asks.backbone, asks.k, asks.count(), answers))
    }

    /// This node's own hits, on a blocking thread, within the deadline.
    async fn ask_local(&self, local: &Local, asks: &Asks<'_>) -> NodeAnswer {
        let index = local.index.clone();
        let (backbone, queries, exclude) = (
            asks.backbone.to_string(),
            asks.queries.to_vec(),
            asks.exclude.to_vec(),
        );
        let (dim, k, min_score) = (asks.dim, asks.k, asks.min_score);
        let searched = within(asks.deadline, async move {
            tokio::task::spawn_blocking(move || {
                index.search(&Queries {
                    backbone: &backbone,
                    vectors: &queries,
                    dim,
                    k,
                    min_score,
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
    async fn ask_remote(&self, node: &PlacementNode, asks: &Asks<'_>) -> NodeAnswer {
        let Some(cluster) = &self.cluster else {
            return (node.name.clone(), node.live, Err("no cluster".into()));
        };
        let req = pb::SimilarSearchRequest {
            backbone: asks.backbone.into(),
            dim: u32::try_from(asks.dim).unwrap_or(u32::MAX),
            queries: asks.queries.to_vec(),
            k: u32::try_from(asks.k).unwrap_or(u32::MAX),
            min_score: asks.min_score,
            exclude: asks.exclude.to_vec(),
        };
        let answer = match remaining(asks.deadline) {
            Ok(left) => match cluster.peers.search(&node.url, req, left).await {
                Ok(reply) => hits_of(reply),
                // The client's own deadline (tonic's "Timeout expired") or the server's.
                Err(status)
                    if status.code() == tonic::Code::DeadlineExceeded
                        || Instant::now() >= asks.deadline =>
                {
                    Err("timeout".into())
                }
                Err(status) => Err(status.message().to_string()),
            },
            Err(_) => Err("timeout".into()),
        };
        (node.name.clone(), node.live, answer)
    }
}

/// What every node is asked: a batch of queries.
pub(super) struct Asks<'a> {
    /// The backbone that computed the queries.
    pub(super) backbone: &'a str,
    pub(super) dim: usize,
    /// Row-major, `dim` values per query.
    pub(super) queries: &'a [f32],
    /// Hits per query, at most.
    pub(super) k: usize,
    /// Hits below this cosine similarity are left out.
    pub(super) min_score: f32,
    /// Empty, or one photo id per query left out of its hits.
    pub(super) exclude: &'a [u64],
    pub(super) deadline: Instant,
}

impl<'a> Asks<'a> {
    /// One query with every hit (no least score), `exclude` empty or its photo.
    fn one(
        backbone: &'a str,
        query: &'a [f32],
        k: usize,
        exclude: &'a [u64],
        deadline: Instant,
    ) -> Self {
        Asks {
            backbone,
            dim: query.len(),
            queries: query,
            k,
            min_score: f32::MIN,
            exclude,
            deadline,
        }
    }

    /// Queries in the batch.
    fn count(&self) -> usize {
        self.queries.len().checked_div(self.dim).unwrap_or(0)
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
