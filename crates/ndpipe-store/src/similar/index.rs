//! A node's similarity index: one [`AnnIndex`] over the stored features of the node's active
//! backbone, every photo it holds features of (primaries and copies alike). The feature store
//! tells it of every change ([`FeatureHook`]); a worker thread of its own applies them, so no
//! write of features (the labeller's, on an upload's path) waits for the graph. The worker also
//! opens the saved index (reconciled against the feature store), rebuilds it when it cannot be
//! trusted, follows the active model to a new backbone, and saves periodically and at stop.

use std::path::PathBuf;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ndpipe_util::sync::{lock, read};
use tracing::warn;

use super::SimilarError;
use super::ann::{AnnIndex, AnnOptions};
use super::metrics::SimilarMetrics;
use super::persist::IndexDir;
use super::worker::{Event, Worker};
use crate::inference::model::SharedModel;
use crate::storage::FeatureStore;
use crate::storage::features::FeatureHook;

/// Settings of a node's index.
#[derive(Debug, Clone)]
pub(crate) struct IndexSettings {
    /// Where the index is saved.
    pub(crate) dir: PathBuf,
    /// How often a changed index is saved (and at stop).
    pub(crate) save_interval: Duration,
    /// The graph's parameters.
    pub(crate) options: AnnOptions,
}

/// The graph the node answers from.
pub(super) struct Live {
    /// The backbone whose features it holds.
    pub(super) backbone: String,
    pub(super) ann: AnnIndex,
    /// Whether photos with features are still being added (an open, rebuild or switch).
    pub(super) building: bool,
    /// Whether it changed since it was saved.
    pub(super) dirty: bool,
}

/// What the worker and the queries share.
pub(super) struct Shared {
    /// `None` before the worker opened the active backbone's index. Queries and saves read;
    /// the worker writes one photo at a time.
    pub(super) live: RwLock<Option<Live>>,
    /// One query at a time: the graph keeps one search context.
    pub(super) searching: Mutex<()>,
    pub(super) features: Arc<FeatureStore>,
    pub(super) model: SharedModel,
    pub(super) dir: IndexDir,
    pub(super) settings: IndexSettings,
    pub(super) metrics: SimilarMetrics,
}

/// One node's answer to a batch of queries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeHits {
    /// The backbone the index holds.
    pub(crate) backbone: String,
    /// Whether the index was still being built (its answer may miss photos).
    pub(crate) building: bool,
    /// Per query, up to k (photo id, cosine similarity), most similar first.
    pub(crate) hits: Vec<Vec<(u64, f32)>>,
}

/// A batch of query vectors, as a node searches them.
#[derive(Debug, Clone)]
pub(crate) struct Queries<'a> {
    /// The backbone that computed them; a node serving another answers an error.
    pub(crate) backbone: &'a str,
    /// Row-major, `dim` values per query.
    pub(crate) vectors: &'a [f32],
    pub(crate) dim: usize,
    /// Hits per query, at most.
    pub(crate) k: usize,
    /// Hits below this cosine similarity are left out.
    pub(crate) min_score: f32,
    /// Empty, or one photo id per query left out of that query's hits (the query photo).
    pub(crate) exclude: &'a [u64],
}

/// A photo's id and its stored features under a backbone (`None`: it has none).
pub(crate) type StoredFeatures = (u64, Option<Vec<f32>>);

/// A node's similarity index and its worker.
pub(crate) struct SimilarIndex {
    shared: Arc<Shared>,
    tx: Mutex<Option<Sender<Event>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The hook the feature store calls: it only queues the change for the worker.
struct Hook(Mutex<Sender<Event>>);

impl FeatureHook for Hook {
    fn changed(&self, backbone: Option<&str>, ids: &[u64]) {
        let _ = lock(&self.0).send(Event::Changed {
            backbone: backbone.map(str::to_string),
            ids: ids.to_vec(),
        });
    }
}

impl SimilarIndex {
    /// Starts the index of `features` under `model`'s backbone: its worker opens the saved
    /// index in the background (the answer says `building` meanwhile) and is told of every
    /// later change of `features`.
    pub(crate) fn start(
        features: Arc<FeatureStore>,
        model: SharedModel,
        settings: IndexSettings,
        metrics: SimilarMetrics,
    ) -> Result<Arc<Self>, SimilarError> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            live: RwLock::new(None),
            searching: Mutex::new(()),
            dir: IndexDir::new(settings.dir.clone()),
            features: features.clone(),
            model,
            settings,
            metrics,
        });
        if !features.set_hook(Arc::new(Hook(Mutex::new(tx.clone())))) {
            return Err(SimilarError::HookTaken);
        }
        let worker = Worker::new(shared.clone());
        let thread = std::thread::Builder::new()
            .name("ndpipe-similar".into())
            .spawn(move || worker.run(rx))
            .map_err(|source| SimilarError::Io {
                what: "start the index thread",
                path: PathBuf::new(),
                source,
            })?;
        Ok(Arc::new(SimilarIndex {
            shared,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The backbone the node runs now.
    pub(crate) fn active_backbone(&self) -> String {
        self.shared.model.get().info().backbone_version.clone()
    }

    /// The stored features of photo `id` under the active backbone (`None`: not labelled yet,
    /// or not held here). Blocks.
    pub(crate) fn features_of(&self, id: u64) -> Result<Option<(String, Vec<f32>)>, SimilarError> {
        let backbone = self.active_backbone();
        Ok(self
            .shared
            .features
            .get(&backbone, id)?
            .map(|f| (backbone, f)))
    }

    /// The photos with stored features under the active backbone (the index's photos once it is
    /// built), ascending. Blocks.
    pub(crate) fn stored_ids(&self) -> Result<Vec<u64>, SimilarError> {
        Ok(self.shared.features.ids(&self.active_backbone())?)
    }

    /// The active backbone and, for each of `ids`, its stored features under it (`None`: not
    /// labelled yet, or not held here); one backbone for all, even if it changes meanwhile.
    /// Blocks.
    pub(crate) fn features_of_many(
        &self,
        ids: &[u64],
    ) -> Result<(String, Vec<StoredFeatures>), SimilarError> {
        let backbone = self.active_backbone();
        let found = ids
            .iter()
            .map(|&id| Ok((id, self.shared.features.get(&backbone, id)?)))
            .collect::<Result<Vec<_>, SimilarError>>()?;
        Ok((backbone, found))
    }

    /// Searches `queries`. An index of another backbone than the queries' answers
    /// [`SimilarError::OtherBackbone`], unless the node has switched to theirs and is building
    /// its index (then no hits, `building`).
    pub(crate) fn search(&self, queries: &Queries<'_>) -> Result<NodeHits, SimilarError> {
        check(queries)?;
        let n = queries.vectors.len() / queries.dim;
        let live = read(&self.shared.live);
        let _one = lock(&self.shared.searching);
        let ready = live.as_ref().filter(|l| l.backbone == queries.backbone);
        let Some(live) = ready else {
            let serving = self.active_backbone();
            if serving == queries.backbone {
                return Ok(NodeHits {
                    backbone: serving,
                    building: true,
                    hits: vec![Vec::new(); n],
                });
            }
            return Err(SimilarError::OtherBackbone {
                asked: queries.backbone.into(),
                serving,
            });
        };
        if live.ann.dim() != queries.dim {
            return Err(SimilarError::BadQuery(format!(
                "{}-d queries for {}-d features",
                queries.dim,
                live.ann.dim()
            )));
        }
        let mut hits = Vec::with_capacity(n);
        for (i, q) in queries.vectors.chunks_exact(queries.dim).enumerate() {
            let left_out = queries.exclude.get(i).copied();
            let wanted = queries.k + usize::from(left_out.is_some());
            let found = live
                .ann
                .search(q, wanted)
                .map_err(|source| SimilarError::Index {
                    backbone: live.backbone.clone(),
                    source,
                })?;
            hits.push(
                found
                    .into_iter()
                    .filter(|(id, score)| Some(*id) != left_out && *score >= queries.min_score)
                    .take(queries.k)
                    .collect(),
            );
        }
        Ok(NodeHits {
            backbone: live.backbone.clone(),
            building: live.building,
            hits,
        })
    }

    /// Waits until every change told so far is applied and no build runs (tests).
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        let (tx, rx) = channel();
        if let Some(s) = lock(&self.tx).as_ref() {
            let _ = s.send(Event::Settle(tx));
        }
        let _ = rx.recv();
    }

    /// Photos in the index now (tests).
    #[cfg(test)]
    pub(crate) fn indexed(&self) -> Vec<u64> {
        let live = read(&self.shared.live);
        let mut ids: Vec<u64> = live
            .as_ref()
            .map(|l| l.ann.keys().iter().copied().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// Stops the worker without saving, as a crash would (tests).
    #[cfg(test)]
    pub(crate) fn crash(&self) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Event::Crash);
        }
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// Stops the worker after it saved a changed index. Blocks: call it off the async runtime.
    pub(crate) fn stop(&self) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Event::Stop);
        }
        if let Some(t) = lock(&self.thread).take()
            && t.join().is_err()
        {
            warn!("the similarity index thread panicked");
        }
    }
}

impl Drop for SimilarIndex {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Refuses a batch whose shape does not add up.
fn check(q: &Queries<'_>) -> Result<(), SimilarError> {
    if q.dim == 0 || q.vectors.is_empty() || !q.vectors.len().is_multiple_of(q.dim) {
        return Err(SimilarError::BadQuery(format!(
            "{} values are no whole number of {}-d queries",
            q.vectors.len(),
            q.dim
        )));
    }
    let n = q.vectors.len() / q.dim;
    if !q.exclude.is_empty() && q.exclude.len() != n {
        return Err(SimilarError::BadQuery(format!(
            "{} ids to leave out for {n} queries",
            q.exclude.len()
        )));
    }
    if !q.min_score.is_finite() {
        return Err(SimilarError::BadQuery("min_score is not a number".into()));
    }
    Ok(())
}
