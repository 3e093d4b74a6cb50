//! The training loop every policy runs: batches come from the policy, every
//! sample goes through the cache, misses are read from remote storage, the
//! model trains, and the step's losses and embeddings go back to the policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use spidercache::{Answer, BatchReport, Capacity, Label, PolicyKind, TrainingSpec, build_policy};

use crate::data::{Dataset, PIXELS, decode_into};
use crate::error::Result;
use crate::model::{EMBEDDING_DIM, Mlp, ModelConfig};
use crate::replay::TraceWriter;
use crate::storage::RemoteStore;

/// Everything a run shares with every other run of the comparison.
pub struct TrainSetup<'a> {
    /// The photos and their labels.
    pub dataset: &'a Dataset,
    /// The remote storage every miss reads.
    pub store: &'a Arc<RemoteStore>,
    /// Decoded test pixels, row-major.
    pub test_pixels: &'a [f32],
    /// Test labels.
    pub test_labels: &'a [Label],
    /// Model initialisation and optimiser.
    pub model: ModelConfig,
    /// Dataset size, batch size and the policies' seed.
    pub spec: TrainingSpec,
    /// Epoch budget.
    pub epochs: u32,
    /// Validation accuracy whose first crossing is timed.
    pub target_accuracy: f64,
    /// Rescale reported embeddings to this L2 norm (see
    /// [`BenchConfig::embedding_norm`](crate::bench::BenchConfig::embedding_norm)).
    pub embedding_norm: Option<f32>,
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
    /// Read from remote storage.
    pub misses: u64,
    /// Distinct sample ids trained.
    pub unique_trained: u64,
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
    /// Reads the policy made through its sample source (off the request path).
    pub background_fetches: u64,
    /// Vectors in the ANN index.
    pub index_len: usize,
    /// Memory of the ANN index, bytes.
    pub index_memory_bytes: usize,
    /// Importance share of the capacity, for split caches.
    pub importance_share: Option<f64>,
    /// Validation top-1 after the epoch.
    pub val_accuracy: f64,
}

impl EpochResult {
    /// (exact + substitute) / requests.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.exact_hits + self.substitutes, self.requests)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// One policy at one cache size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Policy label.
    pub policy: String,
    /// Cache size as a fraction of the training set (items and bytes).
    pub cache_fraction: f64,
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

    /// Hit ratio over all epochs.
    pub fn hit_ratio(&self) -> f64 {
        let hits = self.epochs.iter().map(|e| e.exact_hits + e.substitutes);
        ratio(hits.sum(), self.epochs.iter().map(|e| e.requests).sum())
    }

    /// Mean epoch wall time, seconds.
    pub fn mean_epoch_time(&self) -> f64 {
        mean(self.epochs.iter().map(|e| e.epoch_time_s))
    }

    /// Mean data-stall time per epoch, seconds.
    pub fn mean_stall(&self) -> f64 {
        mean(self.epochs.iter().map(|e| e.data_stall_s))
    }
}

fn mean(xs: impl ExactSizeIterator<Item = f64>) -> f64 {
    let n = xs.len().max(1) as f64;
    xs.sum::<f64>() / n
}

/// Scales every `dim`-wide row of `values` to L2 norm `norm` (zero rows stay zero).
fn rescale_rows(values: &mut [f32], dim: usize, norm: f32) {
    for row in values.chunks_mut(dim) {
        let len = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        if len > 0.0 {
            row.iter_mut().for_each(|v| *v *= norm / len);
        }
    }
}

/// Trains a fresh model for `setup.epochs` epochs through `kind` with a cache
/// of `fraction` of the training set; records the run into `trace` if given.
pub fn train_policy(
    setup: &TrainSetup<'_>,
    label: &str,
    kind: PolicyKind,
    fraction: f64,
    mut trace: Option<&mut TraceWriter>,
    bar: &ProgressBar,
) -> Result<RunResult> {
    let ds = setup.dataset;
    let full = Capacity::new(ds.train.len(), ds.train_bytes());
    let steers = crate::bench::steers_sampling(&kind);
    let source: Arc<dyn spidercache::SampleSource> = setup.store.clone();
    let policy = build_policy(kind, setup.spec, full.scaled(fraction), source)?;
    let mut model = Mlp::new(&setup.model)?;
    let mut epochs = Vec::new();
    let mut trained_time = 0.0;
    let mut time_to_target = None;
    for epoch in 0..setup.epochs {
        let (bg_before, _, _) = setup.store.policy.snapshot();
        let mut seen = vec![false; ds.train.len()];
        let (mut stall, mut compute, mut report) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut requests = 0u64;
        let started = Instant::now();
        policy.begin_epoch(epoch)?;
        stall += started.elapsed();
        loop {
            let data_started = Instant::now();
            let Some(ids) = policy.next_batch() else {
                stall += data_started.elapsed();
                break;
            };
            let mut pixels = Vec::with_capacity(ids.len() * PIXELS);
            let mut labels = Vec::with_capacity(ids.len());
            for &id in &ids {
                let item = ds.train[id as usize];
                requests += 1;
                seen[id as usize] = true;
                let (label, photo) = match policy.lookup(id, item.label)? {
                    Answer::Hit(data) => (item.label, data),
                    Answer::Substitute { label, data, .. } => (label, data),
                    Answer::Miss => {
                        let sample = setup.store.fetch_for_trainer(id)?;
                        let data = sample.data.clone();
                        policy.admit(id, sample)?;
                        (item.label, data)
                    }
                };
                decode_into(item.photo_id, &photo, &mut pixels)?;
                labels.push(label);
            }
            stall += data_started.elapsed();
            let step_started = Instant::now();
            let mut out = model.train_step(&pixels, &labels)?;
            compute += step_started.elapsed();
            if let Some(norm) = setup.embedding_norm {
                rescale_rows(&mut out.embeddings, EMBEDDING_DIM, norm);
            }
            let report_started = Instant::now();
            policy.report_batch(&BatchReport {
                ids: &ids,
                labels: &labels,
                embeddings: &out.embeddings,
                dim: EMBEDDING_DIM,
                losses: &out.losses,
            })?;
            report += report_started.elapsed();
            if let Some(t) = trace.as_deref_mut() {
                t.batch(&ids, &labels, &out.losses, &out.embeddings)?;
            }
        }
        let training = started.elapsed();
        let val_accuracy = model.accuracy(setup.test_pixels, setup.test_labels)?;
        let closing = Instant::now();
        let stats = policy.end_epoch(Some(val_accuracy))?;
        let epoch_time = training + closing.elapsed();
        if let Some(t) = trace.as_deref_mut() {
            t.end_epoch(val_accuracy)?;
        }
        trained_time += epoch_time.as_secs_f64();
        if time_to_target.is_none() && val_accuracy >= setup.target_accuracy {
            time_to_target = Some(trained_time);
        }
        let (bg_after, _, _) = setup.store.policy.snapshot();
        epochs.push(EpochResult {
            epoch,
            requests,
            exact_hits: stats.exact_hits,
            substitutes: stats.substitutes,
            misses: stats.misses,
            unique_trained: seen.iter().filter(|&&s| s).count() as u64,
            epoch_time_s: epoch_time.as_secs_f64(),
            data_stall_s: stall.as_secs_f64(),
            compute_s: compute.as_secs_f64(),
            report_s: report.as_secs_f64(),
            scoring_s: stats.scoring_time.as_secs_f64(),
            background_fetches: bg_after - bg_before,
            index_len: stats.index_len,
            index_memory_bytes: stats.index_memory_bytes,
            importance_share: stats.importance_share,
            val_accuracy,
        });
        bar.set_message(format!(
            "{label} @{:.0}%: epoch {epoch} hit {:.2} acc {:.3}",
            fraction * 100.0,
            epochs.last().map_or(0.0, EpochResult::hit_ratio),
            val_accuracy
        ));
        bar.inc(1);
    }
    Ok(RunResult {
        policy: label.to_owned(),
        cache_fraction: fraction,
        steers_sampling: steers,
        epochs,
        time_to_target_s: time_to_target,
    })
}
