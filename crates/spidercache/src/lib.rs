//! `spidercache`: a training-data cache that knows what the model has learned.
//!
//! A training job whose dataset lives on remote storage spends its epochs
//! waiting for reads. This crate sits between the training loop and the
//! storage: for every sample the loop asks for, a [`CachePolicy`] answers with
//! the sample's bytes ([`Answer::Hit`]), another sample's bytes that can stand
//! in for it ([`Answer::Substitute`]), or [`Answer::Miss`], after which the
//! loop reads the sample itself and offers it back with
//! [`CachePolicy::admit`]. The policy also orders each epoch
//! ([`CachePolicy::next_batch`]), because the caches that win (SHADE, iCache,
//! SpiderCache) do so by changing what is trained when.
//!
//! # Design
//!
//! - [`api`]: the contract. Samples are opaque [`bytes::Bytes`] with a label;
//!   ids are dense (`0..num_samples`); budgets ([`Capacity`]) count items
//!   and bytes, and no policy ever exceeds either. After each step the loop
//!   reports a [`BatchReport`] (ids, labels, embeddings, losses).
//!   Policies that read storage on their own (homophily representatives,
//!   iCache's stream, Quiver's packages) do it through a [`SampleSource`].
//! - [`SpiderCache`]: an HNSW index ([`usearch`]) over the penultimate-layer
//!   embeddings scores each sample by its neighbourhood ([`score`]): many
//!   same-label near-duplicates make it redundant, other-label neighbours
//!   make it important. "Near" is a [`Radius`]: by default relative to the
//!   embeddings' own scale (twice the running median of squared
//!   nearest-neighbour distances in the index), or the artifact's absolute one
//!   ([`SpiderConfig::artifact`]), which on embeddings with large norms
//!   gives every sample the same score. Scores drive an importance sampler
//!   ([`sampler`]) and the priority of an importance cache; the capacity is
//!   split ([`split`], by default all importance as in the artifact, or
//!   moved each epoch toward the part that saved more reads per slot) with
//!   a homophily cache. Its representatives are chosen by greedy set cover
//!   with a cap on neighbours each ([`HomophilyConfig`]), read only when
//!   there is room, outside the policy's lock, and served under the
//!   requested sample's own label to their same-label neighbours; a
//!   substitute's reported step is filed under the served sample. Every
//!   epoch reports the distribution of scores, neighbour counts and radius
//!   ([`NeighbourhoodStats`]) and what the homophily cache held
//!   ([`HomophilyStats`]). Scoring runs inline or on a worker thread with a
//!   bounded lag.
//! - Peers, as their papers' artifacts implement them: [`NoCache`],
//!   [`LruCache`], [`LfuCache`], [`StaticCache`] (CoorDL), [`Shade`],
//!   [`ICache`] and [`Quiver`]. [`build_policy`] makes any of them from a
//!   [`PolicyKind`], so a harness runs each on the same loop.
//! - Every policy is `Send + Sync` (a mutex inside) and counts, per epoch,
//!   exact hits, substitutes, misses, its own storage reads and scoring time
//!   ([`EpochStats`]).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use spidercache::{
//!     Answer, BatchReport, CachePolicy, Capacity, MemorySource, Sample, ScoringMode,
//!     SpiderCache, SpiderConfig, TrainingSpec,
//! };
//!
//! let samples: Vec<Sample> = (0..64)
//!     .map(|i| Sample { label: i % 4, data: Bytes::from(vec![i as u8; 32]) })
//!     .collect();
//! let storage = Arc::new(MemorySource::new(samples));
//! let spec = TrainingSpec { num_samples: 64, batch_size: 16, seed: 7 };
//! let config = SpiderConfig { scoring: ScoringMode::Inline, ..SpiderConfig::default() };
//! let cache = SpiderCache::new(config, spec, Capacity::new(8, 8 * 32), storage.clone())?;
//!
//! for epoch in 0..2 {
//!     cache.begin_epoch(epoch)?;
//!     while let Some(ids) = cache.next_batch() {
//!         let mut labels = Vec::new();
//!         for &id in &ids {
//!             let wanted = storage.fetch(id)?; // stands in for the dataset's label table
//!             let label = match cache.lookup(id, wanted.label)? {
//!                 Answer::Hit(_bytes) => wanted.label,
//!                 Answer::Substitute { label, .. } => label,
//!                 Answer::Miss => {
//!                     cache.admit(id, wanted.clone())?;
//!                     wanted.label
//!                 }
//!             };
//!             labels.push(label);
//!         }
//!         // ... train on the batch; then report embeddings and losses:
//!         let embeddings: Vec<f32> = ids.iter().flat_map(|&id| [id as f32, 0.0]).collect();
//!         let losses = vec![1.0; ids.len()];
//!         cache.report_batch(&BatchReport {
//!             ids: &ids, labels: &labels, embeddings: &embeddings, dim: 2, losses: &losses,
//!         })?;
//!     }
//!     let stats = cache.end_epoch(Some(0.5))?;
//!     assert!(cache.usage().within(cache.capacity()));
//!     println!("epoch {epoch}: hit ratio {:.2}", stats.hit_ratio());
//! }
//! # use spidercache::SampleSource;
//! # Ok::<(), spidercache::CacheError>(())
//! ```
#![deny(missing_docs)]

mod ann;
pub mod api;
mod error;
mod importance_cache;
mod policies;
mod radius;
pub mod sampler;
pub mod score;
pub mod split;
mod stats;
mod store;

use std::sync::Arc;

pub use ann::AnnConfig;
pub use api::{
    Answer, BatchReport, CachePolicy, Capacity, Label, LabelSource, MemorySource, Sample, SampleId,
    SampleSource, TrainingSpec,
};
pub use error::CacheError;
pub use policies::{
    HomophilyConfig, ICache, ICacheConfig, LfuCache, LruCache, NoCache, Quiver, QuiverConfig,
    Replacement, ScoringMode, Shade, ShadeConfig, SpiderCache, SpiderConfig, StaticCache,
    UniformPolicy,
};
pub use radius::Radius;
pub use sampler::ImportanceSamplerConfig;
pub use score::ScoreVariant;
pub use split::{AdaptiveSplit, MeasuredSplit, PartGains, SplitPolicy, SplitSignals};
pub use stats::{EpochStats, HomophilyStats, NeighbourhoodStats, Summary};

/// Which policy to build, with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyKind {
    /// Uniform sampling, no cache.
    NoCache,
    /// Uniform sampling, LRU.
    Lru,
    /// Uniform sampling, LFU.
    Lfu,
    /// Uniform sampling, fill once and never evict (CoorDL).
    Static,
    /// SHADE.
    Shade(ShadeConfig),
    /// iCache.
    ICache(ICacheConfig),
    /// Quiver.
    Quiver(QuiverConfig),
    /// SpiderCache.
    Spider(SpiderConfig),
}

impl PolicyKind {
    /// Every policy with its default settings, in table order.
    pub fn all_defaults() -> Vec<PolicyKind> {
        vec![
            PolicyKind::NoCache,
            PolicyKind::Lru,
            PolicyKind::Lfu,
            PolicyKind::Static,
            PolicyKind::Shade(ShadeConfig::default()),
            PolicyKind::ICache(ICacheConfig::default()),
            PolicyKind::Quiver(QuiverConfig::default()),
            PolicyKind::Spider(SpiderConfig::default()),
        ]
    }
}

/// Builds the policy `kind` with budget `capacity` for `spec`'s run.
pub fn build_policy(
    kind: PolicyKind,
    spec: TrainingSpec,
    capacity: Capacity,
    source: Arc<dyn SampleSource>,
) -> Result<Box<dyn CachePolicy>, CacheError> {
    Ok(match kind {
        PolicyKind::NoCache => Box::new(NoCache::new(spec, capacity)?),
        PolicyKind::Lru => Box::new(LruCache::new(spec, capacity)?),
        PolicyKind::Lfu => Box::new(LfuCache::new(spec, capacity)?),
        PolicyKind::Static => Box::new(StaticCache::new(spec, capacity)?),
        PolicyKind::Shade(c) => Box::new(Shade::new(c, spec, capacity)?),
        PolicyKind::ICache(c) => Box::new(ICache::new(c, spec, capacity, source)?),
        PolicyKind::Quiver(c) => Box::new(Quiver::new(c, spec, capacity, source)?),
        PolicyKind::Spider(c) => Box::new(SpiderCache::new(c, spec, capacity, source)?),
    })
}
