//! The training loop every policy runs: batches come from the policy, every
//! sample goes through the cache, misses are read from remote storage, the
//! model trains, and the step's losses and embeddings go back to the policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use spidercache::{Answer, BatchReport, Capacity, Label, PolicyKind, TrainingSpec, build_policy};

use crate::data::{Dataset, PIXELS, decode_into};
use crate::error::Result;
use crate::metrics::{EpochResult, RunResult};
use crate::model::{ModelConfig, ModelKind, Net};
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
    /// The network trained.
    pub model_kind: ModelKind,
    /// Model initialisation and optimiser.
    pub model: ModelConfig,
    /// Dataset size, batch size and the policies' seed (the model's is `model.seed`).
    pub spec: TrainingSpec,
    /// Epoch budget.
    pub epochs: u32,
    /// Validation accuracy whose first crossing is timed.
    pub target_accuracy: f64,
    /// Rescale reported embeddings to this L2 norm (see
    /// [`BenchConfig::embedding_norm`](crate::bench::BenchConfig::embedding_norm)).
    pub embedding_norm: Option<f32>,
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
    let mut model = Net::new(setup.model_kind, &setup.model)?;
    let dim = setup.model_kind.embedding_dim();
    let mut epochs = Vec::new();
    let mut trained_time = 0.0;
    let mut time_to_target = None;
    for epoch in 0..setup.epochs {
        let (bg_before, _, _) = setup.store.policy.snapshot();
        let mut trained = vec![false; ds.train.len()];
        let (mut stall, mut compute, mut report) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let (mut steps, mut requests) = (0u64, 0u64);
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
                let (label, photo, served) = match policy.lookup(id, item.label)? {
                    Answer::Hit(data) => (item.label, data, id),
                    Answer::Substitute {
                        served,
                        label,
                        data,
                        ..
                    } => (label, data, served),
                    Answer::Miss => {
                        let sample = setup.store.fetch_for_trainer(id)?;
                        let data = sample.data.clone();
                        policy.admit(id, sample)?;
                        (item.label, data, id)
                    }
                };
                trained[served as usize] = true;
                decode_into(ds.train[served as usize].photo_id, &photo, &mut pixels)?;
                labels.push(label);
            }
            stall += data_started.elapsed();
            let step_started = Instant::now();
            let mut out = model.train_step(&pixels, &labels)?;
            compute += step_started.elapsed();
            steps += 1;
            if let Some(norm) = setup.embedding_norm {
                rescale_rows(&mut out.embeddings, dim, norm);
            }
            let report_started = Instant::now();
            policy.report_batch(&BatchReport {
                ids: &ids,
                labels: &labels,
                embeddings: &out.embeddings,
                dim,
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
        let result = EpochResult {
            requests,
            // The store's count covers every read a policy made, its own tally or not.
            background_fetches: bg_after - bg_before,
            distinct_trained: trained.iter().filter(|&&t| t).count() as u64,
            steps,
            epoch_time_s: epoch_time.as_secs_f64(),
            data_stall_s: stall.as_secs_f64(),
            compute_s: compute.as_secs_f64(),
            report_s: report.as_secs_f64(),
            val_accuracy,
            ..EpochResult::from_stats(&stats)
        };
        bar.set_message(format!(
            "{} {label} @{:.0}% seed {}: epoch {epoch} reads/req {:.2} acc {:.3}",
            setup.model_kind,
            fraction * 100.0,
            setup.spec.seed,
            result.reads_per_request(),
            val_accuracy
        ));
        bar.inc(1);
        epochs.push(result);
    }
    Ok(RunResult {
        policy: label.to_owned(),
        model: setup.model_kind,
        cache_fraction: fraction,
        seed: setup.spec.seed,
        num_samples: ds.train.len(),
        steers_sampling: steers,
        epochs,
        time_to_target_s: time_to_target,
    })
}
