//! Per-epoch counters every policy reports, and the distributions behind
//! SpiderCache's scores and homophily cache.

use std::time::Duration;

/// What one epoch looked like from the cache's side.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochStats {
    /// The epoch these counters cover.
    pub epoch: u32,
    /// Requests answered with the requested sample's own bytes.
    pub exact_hits: u64,
    /// Requests answered with another sample's bytes.
    pub substitutes: u64,
    /// Requests the caller had to fetch from storage.
    pub misses: u64,
    /// Samples cached by [`admit`](crate::CachePolicy::admit).
    pub admitted: u64,
    /// Samples dropped to make room (or after a capacity change).
    pub evictions: u64,
    /// Samples the policy read through its [`SampleSource`](crate::SampleSource).
    pub background_fetches: u64,
    /// Scoring rounds run (SpiderCache).
    pub scoring_rounds: u64,
    /// Time spent updating the index, querying it and scoring.
    pub scoring_time: Duration,
    /// Vectors in the ANN index at the end of the epoch.
    pub index_len: usize,
    /// Memory the ANN index reports, in bytes.
    pub index_memory_bytes: usize,
    /// The importance share of the capacity in force during the epoch, for
    /// policies that split it.
    pub importance_share: Option<f64>,
    /// What the neighbourhood scan found (SpiderCache, epochs that score).
    pub neighbourhood: Option<NeighbourhoodStats>,
    /// What the homophily cache did (SpiderCache).
    pub homophily: Option<HomophilyStats>,
}

/// The distribution of a series of values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Their mean.
    pub mean: f64,
    /// Their (population) standard deviation.
    pub std: f64,
    /// Smallest.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// The summary of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let at = |q: f64| sorted[((n - 1) as f64 * q).round() as usize];
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        Some(Self {
            count: n,
            mean,
            std: var.sqrt(),
            min: sorted[0],
            p10: at(0.1),
            p50: at(0.5),
            p90: at(0.9),
            max: sorted[n - 1],
        })
    }
}

/// One epoch of SpiderCache's neighbourhood scan. A score that has collapsed
/// to a constant shows as `scores.p10 == scores.p90`, and a radius too small
/// for the embeddings as `with_same` near 0.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NeighbourhoodStats {
    /// The scores given.
    pub scores: Summary,
    /// Same-label neighbours inside the radius, per scored sample.
    pub same: Summary,
    /// Other-label neighbours inside the radius, per scored sample.
    pub other: Summary,
    /// Share of scored samples with at least one same-label neighbour.
    pub with_same: f64,
    /// The squared radius of each round.
    pub radius: Summary,
    /// Every sample's sampling weight at the end of the epoch.
    pub weights: Summary,
}

/// One epoch of SpiderCache's homophily cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HomophilyStats {
    /// Representatives held at the end of the epoch.
    pub representatives: usize,
    /// Samples a representative stands in for at the end of the epoch.
    pub covered: usize,
    /// Representatives promoted during the epoch.
    pub promoted: u64,
    /// Promotions whose bytes were copied from the importance cache (no read).
    pub copied: u64,
    /// Requests for a representative itself, answered exactly from this cache.
    pub own_hits: u64,
}

impl EpochStats {
    /// All requests answered.
    pub fn requests(&self) -> u64 {
        self.exact_hits + self.substitutes + self.misses
    }

    /// (exact hits + substitutes) / requests; 0 when there were none.
    pub fn hit_ratio(&self) -> f64 {
        match self.requests() {
            0 => 0.0,
            n => (self.exact_hits + self.substitutes) as f64 / n as f64,
        }
    }

    /// Records one answer.
    pub(crate) fn count(&mut self, answer: &crate::Answer) {
        match answer {
            crate::Answer::Hit(_) => self.exact_hits += 1,
            crate::Answer::Substitute { .. } => self.substitutes += 1,
            crate::Answer::Miss => self.misses += 1,
        }
    }

    /// Fresh counters for `epoch`.
    pub(crate) fn start(epoch: u32) -> Self {
        Self {
            epoch,
            ..Self::default()
        }
    }

    /// Closes the epoch: returns its counters and leaves fresh ones for the
    /// next epoch in their place (what `end_epoch` hands out).
    pub(crate) fn roll_over(&mut self) -> Self {
        let next = Self::start(self.epoch + 1);
        std::mem::replace(self, next)
    }
}
