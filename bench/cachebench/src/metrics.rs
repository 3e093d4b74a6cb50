//! What one training run measured, epoch by epoch: requests and how they
//! were answered, storage reads (the trainer's and the policy's own), distinct
//! samples trained, times, and SpiderCache's scan and homophily figures.

use serde::{Deserialize, Serialize};
use spidercache::EpochStats;

use crate::model::ModelKind;

/// SpiderCache's neighbourhood scan in one epoch (from [`spidercache::NeighbourhoodStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScanFigures {
    /// 10th, 50th and 90th percentile of the scores given; equal when the score collapsed.
    pub score_p10: f64,
    /// Median score.
    pub score_p50: f64,
    /// 90th percentile score.
    pub score_p90: f64,
    /// Standard deviation of the scores.
    pub score_std: f64,
    /// Share of scored samples with a same-label neighbour in the radius.
    pub with_same: f64,
    /// Mean same-label neighbours in the radius.
    pub same_mean: f64,
    /// Mean other-label neighbours in the radius.
    pub other_mean: f64,
    /// Median squared radius of the epoch's rounds.
    pub radius_p50: f64,
}

/// SpiderCache's homophily cache in one epoch (from [`spidercache::HomophilyStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HomophilyFigures {
    /// Representatives held at the end of the epoch.
    pub representatives: usize,
    /// Samples they stand in for.
    pub covered: usize,
    /// Promotions during the epoch.
    pub promoted: u64,
}

/// One epoch of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochResult {
    /// Epoch, from 0.
    pub epoch: u32,
    /// Samples the loop asked the cache for.
    pub requests: u64,
    /// Answered with the sample's own bytes.
    pub exact_hits: u64,
    /// Answered with a substitute's bytes.
    pub substitutes: u64,
    /// Read from remote storage by the loop.
    pub misses: u64,
    /// Reads the policy made through its sample source (representatives,
    /// iCache's stream, Quiver's packages).
    pub background_fetches: u64,
    /// Distinct samples whose bytes were trained on (a substitute counts as
    /// the served sample).
    pub distinct_trained: u64,
    /// Optimiser steps.
    pub steps: u64,
    /// Wall time of the epoch's training (validation excluded), seconds.
    pub epoch_time_s: f64,
    /// Time the loop waited for data (sampling, lookups, reads, decoding), seconds.
    pub data_stall_s: f64,
    /// Time in forward, backward and optimiser steps, seconds.
    pub compute_s: f64,
    /// Time the loop spent handing reports to the policy, seconds.
    pub report_s: f64,
    /// The policy's own index, query and scoring time, seconds.
    pub scoring_s: f64,
    /// Vectors in the ANN index.
    pub index_len: usize,
    /// Memory of the ANN index, bytes.
    pub index_memory_bytes: usize,
    /// Importance share of the capacity, for split caches.
    pub importance_share: Option<f64>,
    /// SpiderCache's scan, in epochs that score.
    pub scan: Option<ScanFigures>,
    /// SpiderCache's homophily cache.
    pub homophily: Option<HomophilyFigures>,
    /// Validation top-1 after the epoch.
    pub val_accuracy: f64,
}

impl EpochResult {
    /// Fills the policy's side of an epoch from its [`EpochStats`].
    pub fn from_stats(stats: &EpochStats) -> Self {
        Self {
            epoch: stats.epoch,
            requests: stats.requests(),
            exact_hits: stats.exact_hits,
            substitutes: stats.substitutes,
            misses: stats.misses,
            background_fetches: stats.background_fetches,
            distinct_trained: 0,
            steps: 0,
            epoch_time_s: 0.0,
            data_stall_s: 0.0,
            compute_s: 0.0,
            report_s: 0.0,
            scoring_s: stats.scoring_time.as_secs_f64(),
            index_len: stats.index_len,
            index_memory_bytes: stats.index_memory_bytes,
            importance_share: stats.importance_share,
            scan: stats.neighbourhood.as_ref().map(|n| ScanFigures {
                score_p10: n.scores.p10,
                score_p50: n.scores.p50,
                score_p90: n.scores.p90,
                score_std: n.scores.std,
                with_same: n.with_same,
                same_mean: n.same.mean,
                other_mean: n.other.mean,
                radius_p50: n.radius.p50,
            }),
            homophily: stats.homophily.map(|h| HomophilyFigures {
                representatives: h.representatives,
                covered: h.covered,
                promoted: h.promoted,
            }),
            val_accuracy: 0.0,
        }
    }

    /// (exact + substitute) / requests.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.exact_hits + self.substitutes, self.requests)
    }

    /// Storage reads (the loop's misses and the policy's own) per request.
    pub fn reads_per_request(&self) -> f64 {
        ratio(self.misses + self.background_fetches, self.requests)
    }
}

pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// One policy at one cache size and one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Policy label.
    pub policy: String,
    /// The network trained (results written before there were two read as the MLP).
    #[serde(default)]
    pub model: ModelKind,
    /// Cache size as a fraction of the training set (items and bytes).
    pub cache_fraction: f64,
    /// Seed of the policy's sampler and of the model's initialisation.
    pub seed: u64,
    /// Training samples (the denominator of the distinct share).
    pub num_samples: usize,
    /// Whether the policy changes what is trained (so its hit ratio only
    /// means something next to its accuracy).
    pub steers_sampling: bool,
    /// Per-epoch results.
    pub epochs: Vec<EpochResult>,
    /// Training time until validation first reached the target, seconds.
    pub time_to_target_s: Option<f64>,
}

impl RunResult {
    /// Validation accuracy after the last epoch.
    pub fn final_accuracy(&self) -> f64 {
        self.epochs.last().map_or(0.0, |e| e.val_accuracy)
    }

    fn total(&self, f: impl Fn(&EpochResult) -> u64) -> u64 {
        self.epochs.iter().map(f).sum()
    }

    /// Requests over all epochs.
    pub fn requests(&self) -> u64 {
        self.total(|e| e.requests)
    }

    /// Hit ratio over all epochs.
    pub fn hit_ratio(&self) -> f64 {
        ratio(
            self.total(|e| e.exact_hits + e.substitutes),
            self.requests(),
        )
    }

    /// Exact hits per request over all epochs.
    pub fn exact_ratio(&self) -> f64 {
        ratio(self.total(|e| e.exact_hits), self.requests())
    }

    /// Substitutes per request over all epochs.
    pub fn substitute_ratio(&self) -> f64 {
        ratio(self.total(|e| e.substitutes), self.requests())
    }

    /// Storage reads per request over all epochs, the policy's own included.
    pub fn reads_per_request(&self) -> f64 {
        ratio(
            self.total(|e| e.misses + e.background_fetches),
            self.requests(),
        )
    }

    /// Mean share of the training set trained per epoch (distinct samples).
    pub fn distinct_share(&self) -> f64 {
        let n = self.num_samples.max(1) as f64;
        mean(self.epochs.iter().map(|e| e.distinct_trained as f64 / n))
    }

    /// Optimiser steps over all epochs.
    pub fn steps(&self) -> u64 {
        self.total(|e| e.steps)
    }

    /// Mean epoch wall time, seconds.
    pub fn mean_epoch_time(&self) -> f64 {
        mean(self.epochs.iter().map(|e| e.epoch_time_s))
    }

    /// Mean data-stall time per epoch, seconds.
    pub fn mean_stall(&self) -> f64 {
        mean(self.epochs.iter().map(|e| e.data_stall_s))
    }

    /// Measured training time (the epochs' wall times) until validation
    /// first reached `target`; `None` if it never did.
    pub fn time_to(&self, target: f64) -> Option<f64> {
        let mut t = 0.0;
        for e in &self.epochs {
            t += e.epoch_time_s;
            if e.val_accuracy >= target {
                return Some(t);
            }
        }
        None
    }

    /// Time to `target` accuracy under the latency model: every storage read
    /// costs `read_s`, plus the measured compute and policy time; `None` if
    /// the run never reached it.
    pub fn modelled_time_to(&self, target: f64, read_s: f64) -> Option<f64> {
        let mut t = 0.0;
        for e in &self.epochs {
            t += (e.misses + e.background_fetches) as f64 * read_s + e.compute_s + e.report_s;
            if e.val_accuracy >= target {
                return Some(t);
            }
        }
        None
    }
}

pub(crate) fn mean(xs: impl ExactSizeIterator<Item = f64>) -> f64 {
    let n = xs.len().max(1) as f64;
    xs.sum::<f64>() / n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_a_target_adds_epochs_until_it_is_reached() {
        let epoch = |acc: f64, wall: f64, misses: u64| EpochResult {
            requests: 10,
            misses,
            background_fetches: 1,
            epoch_time_s: wall,
            compute_s: 0.5,
            val_accuracy: acc,
            ..EpochResult::from_stats(&EpochStats::default())
        };
        let run = RunResult {
            policy: "p".into(),
            model: ModelKind::Cnn,
            cache_fraction: 0.1,
            seed: 7,
            num_samples: 10,
            steers_sampling: true,
            epochs: vec![epoch(0.5, 1.0, 9), epoch(0.85, 2.0, 4)],
            time_to_target_s: None,
        };
        assert_eq!(run.time_to(0.8), Some(3.0));
        assert_eq!(run.time_to(0.9), None);
        // (9 + 1) and (4 + 1) reads at 0.1 s, plus 0.5 s of compute per epoch.
        let modelled = run.modelled_time_to(0.8, 0.1).unwrap();
        assert!((modelled - 2.5).abs() < 1e-9, "{modelled}");
        assert!((run.reads_per_request() - 0.75).abs() < 1e-9);
    }
}
