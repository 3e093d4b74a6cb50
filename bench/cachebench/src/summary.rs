//! Every policy's figures over its seeds (mean and spread): what the tables,
//! the plots and `--json` show.

use serde::{Deserialize, Serialize};

use crate::metrics::RunResult;
use crate::model::ModelKind;

/// Mean and sample standard deviation of one figure over seeds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The mean.
    pub mean: f64,
    /// The sample standard deviation (0 for a single value).
    pub sd: f64,
}

impl Spread {
    /// The spread of `values` (0, 0 when empty).
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Self {
            mean,
            sd: var.sqrt(),
        }
    }
}

/// Means over seeds of one epoch, for the plots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochMeans {
    /// Storage reads per request.
    pub reads_per_request: f64,
    /// Exact hits and substitutes per request.
    pub hit_ratio: f64,
    /// Validation top-1.
    pub val_accuracy: f64,
}

/// One policy at one cache size over its seeds. The flat `*_sd` fields are
/// sample standard deviations over the seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySummary {
    /// Policy label.
    pub policy: String,
    /// The network trained.
    #[serde(default)]
    pub model: ModelKind,
    /// Cache size as a fraction of the training set.
    pub cache_fraction: f64,
    /// Seeds run.
    pub seeds: usize,
    /// Whether the policy changes what is trained.
    pub steers_sampling: bool,
    /// Storage reads (the loop's misses and the policy's own) per request.
    pub reads_per_request: f64,
    /// Its spread.
    pub reads_per_request_sd: f64,
    /// Exact hits per request.
    pub exact_ratio: f64,
    /// Substitutes per request.
    pub substitute_ratio: f64,
    /// Its spread.
    pub substitute_ratio_sd: f64,
    /// Mean share of the training set trained per epoch (distinct samples, a
    /// substitute counted as the sample served).
    pub distinct_per_epoch: f64,
    /// Optimiser steps per run.
    pub steps: f64,
    /// Mean epoch wall time, seconds.
    pub epoch_time_s: f64,
    /// Its spread.
    pub epoch_time_sd: f64,
    /// Final validation top-1.
    pub top1_mean: f64,
    /// Its spread.
    pub top1_sd: f64,
    /// Final top-1 minus no-cache's on the same seed, mean in points.
    pub top1_gap_pp: Option<f64>,
    /// Its spread, in points.
    pub top1_gap_sd_pp: Option<f64>,
    /// Seeds that reached the target accuracy.
    pub reached_target: usize,
    /// Mean measured training time to the target over those seeds, seconds.
    pub time_to_target_s: Option<f64>,
    /// Mean time to the target under the latency model (reads times the mean
    /// read time, plus compute and policy time) over the seeds that reached it.
    pub modelled_time_to_target_s: Option<f64>,
    /// SpiderCache: same-label share of the neighbours inside the radius.
    pub neighbour_purity: Option<f64>,
    /// Per-epoch means over seeds.
    pub per_epoch: Vec<EpochMeans>,
}

/// The runs grouped by (model, policy, cache size), in the order they first
/// ran, with each model's time to `target(model)` accuracy.
pub fn summarize(
    runs: &[RunResult],
    target: impl Fn(ModelKind) -> f64,
    read_s: f64,
) -> Vec<PolicySummary> {
    let mut keys: Vec<(ModelKind, &str, f64)> = Vec::new();
    for r in runs {
        let key = (r.model, r.policy.as_str(), r.cache_fraction);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(model, policy, fraction)| {
            let group: Vec<&RunResult> = runs
                .iter()
                .filter(|r| r.model == model && r.policy == policy && r.cache_fraction == fraction)
                .collect();
            summary_of(
                (model, policy, fraction),
                &group,
                runs,
                target(model),
                read_s,
            )
        })
        .collect()
}

fn summary_of(
    (model, policy, fraction): (ModelKind, &str, f64),
    group: &[&RunResult],
    all: &[RunResult],
    target: f64,
    read_s: f64,
) -> PolicySummary {
    let spread =
        |f: &dyn Fn(&RunResult) -> f64| Spread::of(&group.iter().map(|r| f(r)).collect::<Vec<_>>());
    let mean_of = |xs: Vec<f64>| (!xs.is_empty()).then(|| Spread::of(&xs).mean);
    let reads = spread(&|r| r.reads_per_request());
    let subs = spread(&|r| r.substitute_ratio());
    let epoch_time = spread(&|r| r.mean_epoch_time());
    let top1 = spread(&|r| r.final_accuracy());
    let gaps: Vec<f64> = group
        .iter()
        .filter_map(|r| {
            let base = all
                .iter()
                .find(|b| b.policy == "nocache" && b.model == model && b.seed == r.seed)?;
            Some((r.final_accuracy() - base.final_accuracy()) * 100.0)
        })
        .collect();
    let gap = (!gaps.is_empty()).then(|| Spread::of(&gaps));
    let measured: Vec<f64> = group.iter().filter_map(|r| r.time_to(target)).collect();
    let modelled: Vec<f64> = group
        .iter()
        .filter_map(|r| r.modelled_time_to(target, read_s))
        .collect();
    let (same, other): (f64, f64) = group
        .iter()
        .flat_map(|r| r.epochs.iter().filter_map(|e| e.scan))
        .fold((0.0, 0.0), |(s, o), scan| {
            (s + scan.same_mean, o + scan.other_mean)
        });
    let epochs = group.iter().map(|r| r.epochs.len()).min().unwrap_or(0);
    let per_epoch = (0..epochs)
        .map(|e| {
            let at = |f: &dyn Fn(&crate::metrics::EpochResult) -> f64| {
                Spread::of(&group.iter().map(|r| f(&r.epochs[e])).collect::<Vec<_>>()).mean
            };
            EpochMeans {
                reads_per_request: at(&|x| x.reads_per_request()),
                hit_ratio: at(&|x| x.hit_ratio()),
                val_accuracy: at(&|x| x.val_accuracy),
            }
        })
        .collect();
    PolicySummary {
        policy: policy.to_owned(),
        model,
        cache_fraction: fraction,
        seeds: group.len(),
        steers_sampling: group.iter().any(|r| r.steers_sampling),
        reads_per_request: reads.mean,
        reads_per_request_sd: reads.sd,
        exact_ratio: spread(&|r| r.exact_ratio()).mean,
        substitute_ratio: subs.mean,
        substitute_ratio_sd: subs.sd,
        distinct_per_epoch: spread(&|r| r.distinct_share()).mean,
        steps: spread(&|r| r.steps() as f64).mean,
        epoch_time_s: epoch_time.mean,
        epoch_time_sd: epoch_time.sd,
        top1_mean: top1.mean,
        top1_sd: top1.sd,
        top1_gap_pp: gap.map(|g| g.mean),
        top1_gap_sd_pp: gap.map(|g| g.sd),
        reached_target: measured.len(),
        time_to_target_s: mean_of(measured),
        modelled_time_to_target_s: mean_of(modelled),
        neighbour_purity: (same + other > 0.0).then(|| same / (same + other)),
        per_epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_sample_standard_deviation() {
        let s = Spread::of(&[0.797, 0.821, 0.824]);
        assert!((s.mean - 0.814).abs() < 1e-9);
        assert!((s.sd - 0.014_798_648).abs() < 1e-6, "{}", s.sd);
        assert_eq!(Spread::of(&[3.0]), Spread { mean: 3.0, sd: 0.0 });
        assert_eq!(Spread::of(&[]), Spread::default());
    }

    fn run(model: ModelKind, policy: &str, seed: u64, accuracy: f64) -> RunResult {
        let mut epoch =
            crate::metrics::EpochResult::from_stats(&spidercache::EpochStats::default());
        epoch.requests = 10;
        epoch.misses = 10;
        epoch.val_accuracy = accuracy;
        RunResult {
            policy: policy.into(),
            model,
            cache_fraction: if policy == "nocache" { 0.0 } else { 0.1 },
            seed,
            num_samples: 10,
            steers_sampling: false,
            epochs: vec![epoch],
            time_to_target_s: None,
        }
    }

    #[test]
    fn each_model_is_summarised_apart_and_gapped_against_its_own_nocache() {
        let runs = vec![
            run(ModelKind::Mlp, "nocache", 7, 0.80),
            run(ModelKind::Mlp, "shade", 7, 0.82),
            run(ModelKind::Cnn, "nocache", 7, 0.70),
            run(ModelKind::Cnn, "shade", 7, 0.75),
        ];
        let s = summarize(&runs, |_| 0.9, 0.001);
        assert_eq!(s.len(), 4);
        let shade: Vec<&PolicySummary> = s.iter().filter(|p| p.policy == "shade").collect();
        assert_eq!(shade[0].model, ModelKind::Mlp);
        assert_eq!(shade[0].seeds, 1);
        assert!((shade[0].top1_gap_pp.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(shade[1].model, ModelKind::Cnn);
        assert!((shade[1].top1_gap_pp.unwrap() - 5.0).abs() < 1e-9);
    }
}
