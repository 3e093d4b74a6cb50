//! Epoch orders: the uniform shuffle of the plain baselines and the
//! importance sampler SHADE and SpiderCache share (multinomial draws, PADS,
//! rank partition, replication of cached samples).

use rand::SeedableRng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;

use crate::api::{SampleId, TrainingSpec};
use crate::error::CacheError;

/// The random stream for one (seed, epoch, purpose): the same inputs always
/// give the same stream, and different purposes never share one.
pub(crate) fn rng_for(seed: u64, epoch: u32, purpose: u64) -> Pcg64Mcg {
    let mut x = seed ^ (u64::from(epoch) << 32) ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64 finaliser, so nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    Pcg64Mcg::seed_from_u64(x ^ (x >> 31))
}

/// Purposes of the random streams, so no two uses share one.
pub(crate) mod stream {
    pub(crate) const ORDER: u64 = 1;
    pub(crate) const PREPARE_HITS: u64 = 2;
    pub(crate) const POLICY: u64 = 3;
    pub(crate) const SELECTION: u64 = 4;
    pub(crate) const PACKAGES: u64 = 5;
    pub(crate) const L_STREAM: u64 = 6;
}

/// A uniform random permutation of `0..num_samples` per epoch.
pub fn uniform_order(spec: &TrainingSpec, epoch: u32) -> Vec<SampleId> {
    let mut order: Vec<SampleId> = (0..spec.num_samples as SampleId).collect();
    order.shuffle(&mut rng_for(spec.seed, epoch, stream::ORDER));
    order
}

/// Hands out an epoch order one minibatch at a time.
#[derive(Debug, Default)]
pub(crate) struct EpochCursor {
    order: Vec<SampleId>,
    pos: usize,
    batch_size: usize,
}

impl EpochCursor {
    pub(crate) fn new(order: Vec<SampleId>, batch_size: usize) -> Self {
        Self {
            order,
            pos: 0,
            batch_size,
        }
    }

    pub(crate) fn next_batch(&mut self) -> Option<Vec<SampleId>> {
        if self.pos >= self.order.len() {
            return None;
        }
        let end = (self.pos + self.batch_size).min(self.order.len());
        let batch = self.order[self.pos..end].to_vec();
        self.pos = end;
        Some(batch)
    }
}

/// Whether the mean change of validation accuracy over the last `window`
/// epochs is positive (SHADE's gate for PADS ordering). False until two
/// accuracies exist.
pub fn accuracy_gate(history: &[f64], window: usize) -> bool {
    let tail = &history[history.len().saturating_sub(window + 1)..];
    if tail.len() < 2 {
        return false;
    }
    let deltas: f64 = tail.windows(2).map(|w| w[1] - w[0]).sum();
    deltas / (tail.len() - 1) as f64 > 0.0
}

/// Settings of the importance sampler.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportanceSamplerConfig {
    /// How many times each drawn, cached sample is repeated; a multiple of 0.5, at least 1.
    pub rep_factor: f64,
    /// Number of data-parallel ranks.
    pub world_size: usize,
    /// This process's rank.
    pub rank: usize,
    /// Epochs of validation accuracy the PADS gate averages over.
    pub gate_window: usize,
    /// Shuffle hits and misses together instead of hits first.
    pub interleave_hits: bool,
}

impl Default for ImportanceSamplerConfig {
    fn default() -> Self {
        Self {
            rep_factor: 3.0,
            world_size: 1,
            rank: 0,
            gate_window: 3,
            interleave_hits: false,
        }
    }
}

impl ImportanceSamplerConfig {
    /// Checks the replication factor and the rank layout.
    pub fn validate(&self) -> Result<(), CacheError> {
        if self.rep_factor < 1.0 || (self.rep_factor * 2.0).fract() != 0.0 {
            return Err(CacheError::InvalidConfig(format!(
                "rep_factor {} must be a multiple of 0.5 and at least 1",
                self.rep_factor
            )));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(CacheError::InvalidConfig(format!(
                "rank {} outside world of {}",
                self.rank, self.world_size
            )));
        }
        Ok(())
    }
}

/// SHADE's sampler, shared by SpiderCache: multinomial draws with replacement
/// over per-sample weights, then PADS or a rank partition, then cached
/// samples replicated and placed before misses.
#[derive(Debug, Clone)]
pub struct ImportanceSampler {
    config: ImportanceSamplerConfig,
    spec: TrainingSpec,
}

impl ImportanceSampler {
    /// A sampler for `spec`'s dataset.
    pub fn new(config: ImportanceSamplerConfig, spec: TrainingSpec) -> Result<Self, CacheError> {
        config.validate()?;
        spec.validate()?;
        Ok(Self { config, spec })
    }

    /// Samples per rank per epoch: ceil(N / world).
    pub fn samples_per_rank(&self) -> usize {
        self.spec.num_samples.div_ceil(self.config.world_size)
    }

    /// The order of `epoch`. `weights[id]` is the sampling weight of `id`;
    /// `pads` is the accuracy gate's verdict; `is_cached` says which drawn
    /// ids are hits.
    pub fn epoch_order(
        &self,
        epoch: u32,
        weights: &[f64],
        pads: bool,
        is_cached: impl Fn(SampleId) -> bool,
    ) -> Vec<SampleId> {
        let n = self.spec.num_samples;
        let mut rng = rng_for(self.spec.seed, epoch, stream::ORDER);
        let drawn: Vec<SampleId> = match WeightedIndex::new(weights) {
            Ok(dist) if epoch > 0 => (0..n).map(|_| dist.sample(&mut rng) as SampleId).collect(),
            _ => {
                let mut all: Vec<SampleId> = (0..n as SampleId).collect();
                all.shuffle(&mut rng);
                all
            }
        };
        let mine = if pads && epoch > 0 {
            let mut picked = pads_sort(&drawn, n);
            picked.truncate(self.samples_per_rank());
            picked.shuffle(&mut rng);
            picked
        } else {
            drawn
                .into_iter()
                .skip(self.config.rank)
                .step_by(self.config.world_size)
                .collect()
        };
        self.prepare_hits(epoch, mine, is_cached)
    }

    /// Replicates the cached ids `rep_factor` times (a trailing 0.5 adds the
    /// first half of them once more), shuffles, puts hits before misses and
    /// truncates to [`samples_per_rank`](Self::samples_per_rank).
    fn prepare_hits(
        &self,
        epoch: u32,
        ids: Vec<SampleId>,
        is_cached: impl Fn(SampleId) -> bool,
    ) -> Vec<SampleId> {
        let mut rng = rng_for(self.spec.seed, epoch, stream::PREPARE_HITS);
        let (hits, mut misses): (Vec<SampleId>, Vec<SampleId>) =
            ids.into_iter().partition(|&id| is_cached(id));
        let whole = self.config.rep_factor.floor() as usize;
        let mut replicated = Vec::with_capacity(hits.len() * (whole + 1));
        for _ in 0..whole {
            replicated.extend_from_slice(&hits);
        }
        if self.config.rep_factor.fract() > 0.0 {
            replicated.extend_from_slice(&hits[..hits.len() / 2]);
        }
        replicated.shuffle(&mut rng);
        misses.shuffle(&mut rng);
        replicated.append(&mut misses);
        if self.config.interleave_hits {
            replicated.shuffle(&mut rng);
        }
        replicated.truncate(self.samples_per_rank());
        replicated
    }
}

/// PADS: the draws, repetitions kept, sorted by how often their id was
/// drawn (most first, ties by id), as SHADE's `pads_sort` does.
fn pads_sort(drawn: &[SampleId], n: usize) -> Vec<SampleId> {
    let mut counts = vec![0u32; n];
    for &id in drawn {
        counts[id as usize] += 1;
    }
    let mut sorted = drawn.to_vec();
    sorted.sort_by(|a, b| counts[*b as usize].cmp(&counts[*a as usize]).then(a.cmp(b)));
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize, seed: u64) -> TrainingSpec {
        TrainingSpec {
            num_samples: n,
            batch_size: 4,
            seed,
        }
    }

    #[test]
    fn same_seed_same_uniform_order() {
        assert_eq!(
            uniform_order(&spec(100, 7), 3),
            uniform_order(&spec(100, 7), 3)
        );
        assert_ne!(
            uniform_order(&spec(100, 7), 3),
            uniform_order(&spec(100, 8), 3)
        );
        assert_ne!(
            uniform_order(&spec(100, 7), 3),
            uniform_order(&spec(100, 7), 4)
        );
        let mut sorted = uniform_order(&spec(100, 7), 3);
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn same_seed_same_importance_order() {
        let s = ImportanceSampler::new(ImportanceSamplerConfig::default(), spec(50, 3)).unwrap();
        let w: Vec<f64> = (0..50).map(|i| 0.1 + i as f64).collect();
        let cached = |id: SampleId| id.is_multiple_of(5);
        assert_eq!(
            s.epoch_order(2, &w, false, cached),
            s.epoch_order(2, &w, false, cached)
        );
        assert_eq!(
            s.epoch_order(2, &w, true, cached),
            s.epoch_order(2, &w, true, cached)
        );
    }

    #[test]
    fn hits_are_replicated_and_come_first() {
        let cfg = ImportanceSamplerConfig {
            rep_factor: 2.5,
            ..Default::default()
        };
        let s = ImportanceSampler::new(cfg, spec(40, 1)).unwrap();
        // Epoch 0 is a plain shuffle, so every id is drawn once; 4 are cached.
        let cached = |id: SampleId| id < 4;
        let order = s.epoch_order(0, &[1.0; 40], false, cached);
        assert_eq!(order.len(), 40);
        // 4 hits x 2 + first half (2) once more = 10 hit slots, all at the front.
        assert!(order[..10].iter().all(|&id| id < 4));
        assert!(order[10..].iter().all(|&id| id >= 4));
        let copies = |x| order[..10].iter().filter(|&&id| id == x).count();
        assert_eq!((0..4).map(copies).sum::<usize>(), 10);
    }

    #[test]
    fn multinomial_follows_weights() {
        let s = ImportanceSampler::new(
            ImportanceSamplerConfig {
                rep_factor: 1.0,
                ..Default::default()
            },
            spec(10, 5),
        )
        .unwrap();
        let mut w = vec![0.0; 10];
        w[3] = 1.0;
        let order = s.epoch_order(1, &w, false, |_| false);
        assert!(order.iter().all(|&id| id == 3));
        assert_eq!(s.epoch_order(1, &w, true, |_| false), vec![3; 10]);
    }

    #[test]
    fn pads_groups_draws_by_multiplicity() {
        assert_eq!(pads_sort(&[4, 1, 2, 1, 4, 4], 5), vec![4, 4, 4, 1, 1, 2]);
    }

    #[test]
    fn rank_partition_takes_every_world_th_draw() {
        let cfg = ImportanceSamplerConfig {
            world_size: 2,
            rank: 1,
            rep_factor: 1.0,
            ..Default::default()
        };
        let s = ImportanceSampler::new(cfg, spec(11, 5)).unwrap();
        assert_eq!(s.epoch_order(1, &[1.0; 11], false, |_| false).len(), 5);
        assert_eq!(s.samples_per_rank(), 6);
    }

    #[test]
    fn gate_needs_rising_accuracy() {
        assert!(!accuracy_gate(&[0.5], 3));
        assert!(accuracy_gate(&[0.5, 0.6], 3));
        assert!(!accuracy_gate(&[0.1, 0.6, 0.5, 0.5, 0.4], 3));
        assert!(accuracy_gate(&[0.9, 0.4, 0.5, 0.5, 0.6], 3));
    }

    #[test]
    fn rejects_bad_rep_factor() {
        let cfg = ImportanceSamplerConfig {
            rep_factor: 2.3,
            ..Default::default()
        };
        assert!(ImportanceSampler::new(cfg, spec(4, 0)).is_err());
    }
}
