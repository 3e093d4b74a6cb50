//! A PipeStore's similarity parts, built from its [`Config`]: the index over its features
//! (with a model), the embedder of query photos, and its front door's queries.

use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::ReplicaCatalog;
use ndpipe_model::Preprocessor;
use ndpipe_proto::transport::{ClusterSecret, Tls};

use super::ann::{AnnOptions, Scalar};
use super::front::{ClusterAccess, Local};
use super::metrics::SimilarMetrics;
use super::{Embedder, FrontSettings, IndexSettings, SimilarError, SimilarFront, SimilarIndex};
use crate::config::Config;
use crate::inference::model::SharedModel;
use crate::storage::{FeatureStore, PhotoStore};

/// How vectors are kept in a node's graph: f32. f16 found the same neighbours (recall@10
/// 0.998 both) at half the memory, but usearch built without SIMD kernels (no `simsimd`)
/// converts f16 in software: its graph built 4x and its queries ran 2x slower
/// (`ndpipe-bench similar`, `docs/benchmarks.md`).
pub(crate) const NODE_SCALAR: Scalar = Scalar::F32;

/// Room beside a query photo in a message between nodes.
const MESSAGE_SLACK: usize = 1 << 20;

/// What a PipeStore has for similar photos.
pub(crate) struct NodeSimilar {
    /// The index over the node's features (`None` without a model).
    pub(crate) index: Option<Arc<SimilarIndex>>,
    /// Computes query photos' features (`None` without a model).
    pub(crate) embedder: Option<Embedder>,
    /// The node's front door (`None`: neither a model nor a cluster to ask).
    pub(crate) front: Option<Arc<SimilarFront>>,
    /// Largest message of the `Similar` service: a query photo and some room.
    pub(crate) max_message: usize,
}

/// The cluster a replicated node asks: its replica map, secret and TLS.
pub(crate) type ClusterParts = (Arc<dyn ReplicaCatalog>, Option<ClusterSecret>, Option<Tls>);

impl NodeSimilar {
    /// Starts node `name`'s index of `features` under `model`'s backbone (when a model is
    /// loaded) and its front door, which asks `cluster`'s nodes too on a replicated cluster.
    pub(crate) fn open(
        config: &Config,
        name: &str,
        (store, features): (Arc<PhotoStore>, Arc<FeatureStore>),
        model: Option<SharedModel>,
        metrics: SimilarMetrics,
        cluster: Option<ClusterParts>,
    ) -> Result<NodeSimilar, SimilarError> {
        let settings = index_settings(config)?;
        let front_settings = front_settings(
            config.similar_timeout_ms,
            config.similar_default_k,
            config.similar_max_k,
        )?;
        let max_message = config.max_upload_bytes.saturating_add(MESSAGE_SLACK);
        let (index, embedder) = match model {
            Some(model) => {
                let preprocessor = Preprocessor::new(ndpipe_model::PreprocessConfig {
                    max_pixels: config.max_pixels,
                    ..ndpipe_model::PreprocessConfig::default()
                });
                let index =
                    SimilarIndex::start(features, model.clone(), settings, metrics.clone())?;
                (Some(index), Some(Embedder::new(model, preprocessor)))
            }
            None => (None, None),
        };
        let local = index
            .clone()
            .zip(embedder.clone())
            .map(|(index, embedder)| Local {
                name: name.into(),
                index,
                embedder,
                store,
            });
        let front = (local.is_some() || cluster.is_some()).then(|| {
            Arc::new(SimilarFront::new(
                front_settings,
                metrics,
                local,
                cluster.map(|(catalog, secret, tls)| ClusterAccess {
                    catalog,
                    secret,
                    tls,
                    max_message,
                }),
            ))
        });
        Ok(NodeSimilar {
            index,
            embedder,
            front,
            max_message,
        })
    }

    /// Saves a changed index and stops its worker. Blocks.
    pub(crate) fn stop(&self) {
        if let Some(index) = &self.index {
            index.stop();
        }
    }
}

/// The index settings of `config`, checked.
fn index_settings(config: &Config) -> Result<IndexSettings, SimilarError> {
    for (name, value) in [
        ("similar_connectivity", config.similar_connectivity),
        ("similar_expansion_add", config.similar_expansion_add),
        ("similar_expansion_search", config.similar_expansion_search),
    ] {
        if value < 2 {
            return Err(SimilarError::Config {
                setting: name,
                reason: format!("{value} is too small: give 2 or more"),
            });
        }
    }
    Ok(IndexSettings {
        dir: config
            .similar_index_dir
            .clone()
            .unwrap_or_else(|| config.data.join("index")),
        save_interval: Duration::from_millis(config.similar_save_interval_ms.max(1)),
        options: AnnOptions {
            connectivity: config.similar_connectivity,
            expansion_add: config.similar_expansion_add,
            expansion_search: config.similar_expansion_search,
            scalar: NODE_SCALAR,
        },
    })
}

/// A front door's query settings, checked: a deadline of at least 1 ms, `1 <= default_k <=
/// max_k`.
pub(crate) fn front_settings(
    timeout_ms: u64,
    default_k: usize,
    max_k: usize,
) -> Result<FrontSettings, SimilarError> {
    if timeout_ms == 0 {
        return Err(SimilarError::Config {
            setting: "similar_timeout_ms",
            reason: "0 would answer no query: give 1 or more".into(),
        });
    }
    if default_k == 0 || default_k > max_k {
        return Err(SimilarError::Config {
            setting: "similar_default_k",
            reason: format!("{default_k} is not in 1..=similar_max_k ({max_k})"),
        });
    }
    Ok(FrontSettings {
        timeout: Duration::from_millis(timeout_ms),
        default_k,
        max_k,
    })
}
