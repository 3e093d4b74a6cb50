//! Trace replay: one training run's per-batch (ids, labels, losses,
//! embeddings) recorded to a file, then played through every policy for
//! hit-ratio studies without training.
//!
//! Each replayed policy draws its own epoch order and is fed, for every id it
//! asks for, the loss and embedding that id had in the same epoch of the
//! recorded run (or its latest earlier one). For policies that do not steer
//! sampling the request stream does not depend on the model, so the replayed
//! hit ratio is the one a real run gets. Policies that steer sampling
//! (SHADE, iCache, Quiver, SpiderCache) would have trained a different model
//! on different samples: for them replay is an approximation.
//!
//! File layout, little-endian: the magic `CBTRACE1`; `num_samples`,
//! `batch_size`, `seed` (u64); `dim` (u32); per sample its payload size and
//! label (u32 each); then records: tag 1, a batch (`n` u32, `n` ids u64, `n`
//! labels u32, `n` losses f32, `n * dim` embeddings f32); tag 2, the end of
//! an epoch (validation accuracy f64).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use spidercache::{
    Answer, BatchReport, Capacity, Label, MemorySource, Sample, SampleId, SampleSource,
    TrainingSpec, build_policy,
};

use crate::bench::PolicySpec;
use crate::error::{BenchError, Result};

const MAGIC: &[u8; 8] = b"CBTRACE1";
const TAG_BATCH: u8 = 1;
const TAG_EPOCH: u8 = 2;

/// One recorded minibatch.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceBatch {
    /// Ids trained.
    pub ids: Vec<SampleId>,
    /// Labels trained.
    pub labels: Vec<Label>,
    /// Per-sample losses.
    pub losses: Vec<f32>,
    /// Row-major embeddings, `ids.len() x dim`.
    pub embeddings: Vec<f32>,
}

/// One recorded epoch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceEpoch {
    /// Its batches, in training order.
    pub batches: Vec<TraceBatch>,
    /// Validation accuracy after it.
    pub val_accuracy: f64,
}

/// A whole recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Dataset size, batch size and seed of the run.
    pub spec: TrainingSpec,
    /// Embedding width.
    pub dim: usize,
    /// Payload size of every sample.
    pub sizes: Vec<u32>,
    /// Label of every sample.
    pub labels: Vec<Label>,
    /// The epochs.
    pub epochs: Vec<TraceEpoch>,
}

/// Writes a trace as the run goes.
pub struct TraceWriter {
    out: BufWriter<File>,
    dim: usize,
}

impl TraceWriter {
    /// Starts a trace at `path` for a run of `spec` over samples with these
    /// payload `sizes` and `labels`.
    pub fn create(
        path: &Path,
        spec: TrainingSpec,
        dim: usize,
        sizes: &[u32],
        labels: &[Label],
    ) -> Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(MAGIC)?;
        for v in [spec.num_samples as u64, spec.batch_size as u64, spec.seed] {
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(&(dim as u32).to_le_bytes())?;
        for (&s, &l) in sizes.iter().zip(labels) {
            out.write_all(&s.to_le_bytes())?;
            out.write_all(&l.to_le_bytes())?;
        }
        Ok(Self { out, dim })
    }

    /// Records one trained batch.
    pub fn batch(
        &mut self,
        ids: &[SampleId],
        labels: &[Label],
        losses: &[f32],
        embeddings: &[f32],
    ) -> Result<()> {
        if labels.len() != ids.len()
            || losses.len() != ids.len()
            || embeddings.len() != ids.len() * self.dim
        {
            return Err(BenchError::Trace("batch slices disagree in length".into()));
        }
        let o = &mut self.out;
        o.write_all(&[TAG_BATCH])?;
        o.write_all(&(ids.len() as u32).to_le_bytes())?;
        ids.iter().try_for_each(|v| o.write_all(&v.to_le_bytes()))?;
        labels
            .iter()
            .try_for_each(|v| o.write_all(&v.to_le_bytes()))?;
        losses
            .iter()
            .try_for_each(|v| o.write_all(&v.to_le_bytes()))?;
        embeddings
            .iter()
            .try_for_each(|v| o.write_all(&v.to_le_bytes()))?;
        Ok(())
    }

    /// Records the end of an epoch and flushes.
    pub fn end_epoch(&mut self, val_accuracy: f64) -> Result<()> {
        self.out.write_all(&[TAG_EPOCH])?;
        self.out.write_all(&val_accuracy.to_le_bytes())?;
        Ok(self.out.flush()?)
    }
}

struct Reader<R>(R);

impl<R: Read> Reader<R> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0; N];
        self.0
            .read_exact(&mut buf)
            .map_err(|e| BenchError::Trace(format!("truncated: {e}")))?;
        Ok(buf)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn f32(&mut self) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    fn many<T>(&mut self, n: usize, mut f: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        (0..n).map(|_| f(self)).collect()
    }
}

fn too_big(what: &str) -> BenchError {
    BenchError::Trace(format!("{what} does not fit in memory"))
}

impl Trace {
    /// Reads a trace written by [`TraceWriter`].
    pub fn read(path: &Path) -> Result<Self> {
        let mut r = Reader(BufReader::new(File::open(path)?));
        if &r.array::<8>()? != MAGIC {
            return Err(BenchError::Trace(format!(
                "{} is not a cachebench trace",
                path.display()
            )));
        }
        let num_samples = usize::try_from(r.u64()?).map_err(|_| too_big("num_samples"))?;
        let batch_size = usize::try_from(r.u64()?).map_err(|_| too_big("batch_size"))?;
        let seed = r.u64()?;
        let dim = r.u32()? as usize;
        let (mut sizes, mut labels) = (Vec::new(), Vec::new());
        for _ in 0..num_samples {
            sizes.push(r.u32()?);
            labels.push(r.u32()?);
        }
        let mut epochs = Vec::new();
        let mut current = TraceEpoch::default();
        let mut tag = [0u8; 1];
        while r.0.read(&mut tag)? == 1 {
            match tag[0] {
                TAG_BATCH => {
                    let n = r.u32()? as usize;
                    let ids = r.many(n, Reader::u64)?;
                    if let Some(&bad) = ids.iter().find(|&&id| id >= num_samples as u64) {
                        return Err(BenchError::Trace(format!("sample id {bad} out of range")));
                    }
                    current.batches.push(TraceBatch {
                        ids,
                        labels: r.many(n, Reader::u32)?,
                        losses: r.many(n, Reader::f32)?,
                        embeddings: r.many(n * dim, Reader::f32)?,
                    });
                }
                TAG_EPOCH => {
                    current.val_accuracy = f64::from_le_bytes(r.array()?);
                    epochs.push(std::mem::take(&mut current));
                }
                other => return Err(BenchError::Trace(format!("unknown record tag {other}"))),
            }
        }
        Ok(Self {
            spec: TrainingSpec {
                num_samples,
                batch_size,
                seed,
            },
            dim,
            sizes,
            labels,
            epochs,
        })
    }
}

/// Hit counts of one epoch of a replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayEpoch {
    /// Exact hits.
    pub exact_hits: u64,
    /// Substitutes.
    pub substitutes: u64,
    /// Misses.
    pub misses: u64,
}

/// One policy at one cache size, replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayResult {
    /// Policy label.
    pub policy: String,
    /// Cache size as a fraction of the dataset.
    pub cache_fraction: f64,
    /// Whether the policy steers sampling (replay is then approximate).
    pub steers_sampling: bool,
    /// Per-epoch counts.
    pub epochs: Vec<ReplayEpoch>,
}

impl ReplayResult {
    /// Hit ratio over all epochs.
    pub fn hit_ratio(&self) -> f64 {
        let hits: u64 = self
            .epochs
            .iter()
            .map(|e| e.exact_hits + e.substitutes)
            .sum();
        let all: u64 = self
            .epochs
            .iter()
            .map(|e| e.exact_hits + e.substitutes + e.misses)
            .sum();
        if all == 0 {
            0.0
        } else {
            hits as f64 / all as f64
        }
    }
}

/// Replays `trace` through `policy` with a cache of `fraction` of the dataset.
pub fn replay(trace: &Trace, policy: &PolicySpec, fraction: f64) -> Result<ReplayResult> {
    let n = trace.spec.num_samples;
    let samples = trace
        .sizes
        .iter()
        .zip(&trace.labels)
        .map(|(&size, &label)| Sample {
            label,
            data: Bytes::from(vec![0; size as usize]),
        })
        .collect();
    let source = Arc::new(MemorySource::new(samples));
    let total: u64 = trace.sizes.iter().map(|&s| u64::from(s)).sum();
    let capacity = Capacity::new(n, total).scaled(fraction);
    let cache = build_policy(policy.kind.clone(), trace.spec, capacity, source.clone())?;
    let dim = trace.dim;
    let mut losses = vec![f32::ln(10.0); n];
    let mut embeddings = vec![0.0f32; n * dim];
    let mut epochs = Vec::new();
    for (e, recorded) in trace.epochs.iter().enumerate() {
        for b in &recorded.batches {
            for (row, &id) in b.ids.iter().enumerate() {
                let id = id as usize;
                losses[id] = b.losses[row];
                embeddings[id * dim..(id + 1) * dim]
                    .copy_from_slice(&b.embeddings[row * dim..(row + 1) * dim]);
            }
        }
        cache.begin_epoch(e as u32)?;
        while let Some(ids) = cache.next_batch() {
            let mut labels = Vec::with_capacity(ids.len());
            for &id in &ids {
                let own = trace.labels[id as usize];
                labels.push(match cache.lookup(id, own)? {
                    Answer::Hit(_) => own,
                    Answer::Substitute { label, .. } => label,
                    Answer::Miss => {
                        cache.admit(id, source.fetch(id)?)?;
                        own
                    }
                });
            }
            let batch_losses: Vec<f32> = ids.iter().map(|&id| losses[id as usize]).collect();
            let batch_embeddings: Vec<f32> = ids
                .iter()
                .flat_map(|&id| &embeddings[id as usize * dim..(id as usize + 1) * dim])
                .copied()
                .collect();
            cache.report_batch(&BatchReport {
                ids: &ids,
                labels: &labels,
                embeddings: &batch_embeddings,
                dim,
                losses: &batch_losses,
            })?;
        }
        let stats = cache.end_epoch(Some(recorded.val_accuracy))?;
        epochs.push(ReplayEpoch {
            exact_hits: stats.exact_hits,
            substitutes: stats.substitutes,
            misses: stats.misses,
        });
    }
    Ok(ReplayResult {
        policy: policy.label.clone(),
        cache_fraction: fraction,
        steers_sampling: crate::bench::steers_sampling(&policy.kind),
        epochs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TrainingSpec {
        TrainingSpec {
            num_samples: 20,
            batch_size: 5,
            seed: 9,
        }
    }

    /// Two epochs over 20 samples of 10 bytes, two labels.
    fn write_sample(path: &Path) -> Trace {
        let dim = 2;
        let sizes = vec![10; 20];
        let labels: Vec<Label> = (0..20).map(|i| i % 2).collect();
        let mut w = TraceWriter::create(path, spec(), dim, &sizes, &labels).unwrap();
        let mut epochs = Vec::new();
        for e in 0..2u32 {
            let mut epoch = TraceEpoch::default();
            for chunk in (0..20u64).collect::<Vec<_>>().chunks(5) {
                let b = TraceBatch {
                    ids: chunk.to_vec(),
                    labels: chunk.iter().map(|&i| labels[i as usize]).collect(),
                    losses: chunk.iter().map(|&i| i as f32 + e as f32).collect(),
                    embeddings: chunk
                        .iter()
                        .flat_map(|&i| [i as f32, -(e as f32)])
                        .collect(),
                };
                w.batch(&b.ids, &b.labels, &b.losses, &b.embeddings)
                    .unwrap();
                epoch.batches.push(b);
            }
            epoch.val_accuracy = 0.25 * f64::from(e + 1);
            w.end_epoch(epoch.val_accuracy).unwrap();
            epochs.push(epoch);
        }
        Trace {
            spec: spec(),
            dim,
            sizes,
            labels,
            epochs,
        }
    }

    #[test]
    fn trace_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        let written = write_sample(&path);
        assert_eq!(Trace::read(&path).unwrap(), written);
    }

    #[test]
    fn truncated_or_foreign_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        write_sample(&path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(Trace::read(&path), Err(BenchError::Trace(_))));
        std::fs::write(&path, b"not a trace at all").unwrap();
        assert!(matches!(Trace::read(&path), Err(BenchError::Trace(_))));
    }

    #[test]
    fn every_policy_replays_with_consistent_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        let trace = write_sample(&path);
        for policy in crate::bench::policy_specs(2) {
            let r = replay(&trace, &policy, 0.5).unwrap();
            assert_eq!(r.epochs.len(), 2, "{}", policy.label);
            assert!((0.0..=1.0).contains(&r.hit_ratio()), "{}", policy.label);
        }
    }
}
