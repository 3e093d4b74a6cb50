//! Per-epoch counters every policy reports.

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
