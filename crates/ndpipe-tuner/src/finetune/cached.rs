//! Head training through a training-data cache, for jobs whose features exceed the Tuner's
//! memory budget (SpiderCache or one of its peers, from the `spidercache` crate).
//!
//! The Tuner then keeps only (node, photo, label) per training sample. Each epoch the policy
//! draws the sample order; hits come from the cache, misses are fetched from the PipeStore that
//! owns the photo (`GetFeatures`, batched per node) and offered to the cache. After every step
//! the policy hears the per-sample losses and the features (the linear head's input, used as the
//! embedding).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use ndpipe_proto::pb::GetFeaturesRequest;
use ndpipe_proto::{Features, decode_chunk};
use serde::{Deserialize, Serialize};
use spidercache::{
    Answer, BatchReport, CacheError, CachePolicy as Policy, Capacity, Sample, SampleId,
    SampleSource, TrainingSpec, build_policy,
};

use super::request::CachePolicy;
use super::trainer::{RunScore, validate};
use crate::nodes::{Node, node_error};
use crate::{Head, TunerError};

/// One training sample kept by reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteRow {
    /// Index of the node that owns the photo (in the job's node list).
    pub(crate) node: usize,
    /// The photo.
    pub(crate) photo: u64,
    /// Its class index.
    pub(crate) label: u32,
}

/// The cache's figures over a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheReport {
    /// The policy.
    pub policy: CachePolicy,
    /// Feature rows the cache holds at most.
    pub capacity_items: usize,
    /// Requests for training samples.
    pub requests: u64,
    /// Served from the cache, exactly.
    pub exact_hits: u64,
    /// Served by a substitute.
    pub substitutes: u64,
    /// Fetched from a PipeStore.
    pub misses: u64,
    /// `(exact_hits + substitutes) / requests`.
    pub hit_ratio: f64,
    /// Feature bytes fetched from PipeStores after misses (and by the policy itself).
    pub fetched_bytes: u64,
}

/// How to train through a cache.
#[derive(Clone)]
pub(crate) struct CacheSetup {
    pub(crate) policy: CachePolicy,
    /// Bytes of features the Tuner may hold.
    pub(crate) budget_bytes: u64,
    /// The job's nodes; [`RemoteRow::node`] indexes them.
    pub(crate) nodes: Vec<Node>,
    /// The runtime the gRPC calls run on (training runs on a plain thread).
    pub(crate) handle: tokio::runtime::Handle,
    /// Feature dimension.
    pub(crate) dim: usize,
    /// Batch size of the sampler.
    pub(crate) batch: usize,
    /// Seed of the sampler (plus the run index).
    pub(crate) seed: u64,
}

/// Training runs of one job through a cache, adding up the cache's figures.
pub(crate) struct CachedTraining {
    setup: CacheSetup,
    epochs: usize,
    runs: usize,
    report: CacheReport,
}

impl CachedTraining {
    pub(crate) fn new(setup: CacheSetup, epochs: usize, runs: usize) -> Self {
        let report = CacheReport {
            policy: setup.policy,
            ..CacheReport::default()
        };
        CachedTraining {
            setup,
            epochs,
            runs,
            report,
        }
    }

    /// The figures of the runs trained.
    pub(crate) fn into_report(self) -> CacheReport {
        self.report
    }

    /// Trains run `run` on `rows` through a fresh cache; how the head scores after it.
    pub(crate) fn train_run(
        &mut self,
        head: &mut Head,
        run: usize,
        rows: Vec<RemoteRow>,
        val: &Features,
    ) -> Result<RunScore, TunerError> {
        if rows.is_empty() {
            return RunScore::untrained(head, val);
        }
        let setup = &self.setup;
        let dim = setup.dim;
        let items = (setup.budget_bytes / (dim as u64 * 2)).max(1) as usize;
        let fetcher = Arc::new(Fetcher {
            rows,
            setup: setup.clone(),
            fetched: AtomicU64::new(0),
        });
        let spec = TrainingSpec {
            num_samples: fetcher.rows.len(),
            batch_size: setup.batch.min(fetcher.rows.len()).max(1),
            seed: setup.seed + run as u64,
        };
        let policy = build_policy(
            setup.policy.kind(),
            spec,
            Capacity::new(items, setup.budget_bytes),
            fetcher.clone(),
        )
        .map_err(cache)?;
        self.report.capacity_items = items;
        let mut score = RunScore::default();
        let mut training = head.streaming(run, self.runs, self.epochs)?;
        for epoch in 0..self.epochs {
            training.begin_epoch(epoch);
            policy.begin_epoch(epoch as u32).map_err(cache)?;
            while let Some(batch) = policy.next_batch() {
                let (x, labels) = resolve(&*policy, &fetcher, &batch)?;
                let losses = training.step(&x, &labels)?;
                policy
                    .report_batch(&BatchReport {
                        ids: &batch,
                        labels: &labels,
                        embeddings: &x,
                        dim,
                        losses: &losses,
                    })
                    .map_err(cache)?;
            }
            score = RunScore {
                val_top1: validate(training.head(), val)?,
                train_loss: training.epoch_loss(),
            };
            let stats = (policy.end_epoch(Some(f64::from(score.val_top1)))).map_err(cache)?;
            self.report.exact_hits += stats.exact_hits;
            self.report.substitutes += stats.substitutes;
            self.report.misses += stats.misses;
        }
        let report = &mut self.report;
        report.requests = report.exact_hits + report.substitutes + report.misses;
        report.hit_ratio = if report.requests == 0 {
            0.0
        } else {
            (report.exact_hits + report.substitutes) as f64 / report.requests as f64
        };
        report.fetched_bytes += fetcher.fetched.load(Ordering::Relaxed);
        Ok(score)
    }
}

/// A cache failure inside training: the Tuner's fault, not the request's.
fn cache(e: CacheError) -> TunerError {
    TunerError::Internal(format!("cache: {e}"))
}

/// The features (f32, row-major) and labels of one batch: hits and substitutes from the cache,
/// misses fetched from their nodes and offered to the cache.
fn resolve(
    policy: &dyn Policy,
    fetcher: &Fetcher,
    batch: &[SampleId],
) -> Result<(Vec<f32>, Vec<u32>), TunerError> {
    let mut data: Vec<Option<Bytes>> = vec![None; batch.len()];
    let mut labels: Vec<u32> = Vec::with_capacity(batch.len());
    let mut missing = Vec::new();
    for (k, id) in batch.iter().enumerate() {
        let label = fetcher.rows[*id as usize].label;
        match policy.lookup(*id, label).map_err(cache)? {
            Answer::Hit(bytes) => {
                data[k] = Some(bytes);
                labels.push(label);
            }
            Answer::Substitute {
                data: bytes,
                label: substitute,
                ..
            } => {
                data[k] = Some(bytes);
                labels.push(substitute);
            }
            Answer::Miss => {
                missing.push(k);
                labels.push(label);
            }
        }
    }
    let ids: Vec<SampleId> = missing.iter().map(|k| batch[*k]).collect();
    for (k, bytes) in missing.iter().zip(fetcher.fetch_many(&ids)?) {
        let id = batch[*k];
        let sample = Sample {
            label: fetcher.rows[id as usize].label,
            data: bytes.clone(),
        };
        policy.admit(id, sample).map_err(cache)?;
        data[*k] = Some(bytes);
    }
    let mut x = Vec::with_capacity(batch.len() * fetcher.setup.dim);
    for d in &data {
        let d = d
            .as_ref()
            .ok_or_else(|| TunerError::Internal("a sample was not resolved".into()))?;
        x.extend(ndpipe_util::f16::decode(d));
    }
    Ok((x, labels))
}

/// Reads samples' features from the nodes that own them.
struct Fetcher {
    rows: Vec<RemoteRow>,
    setup: CacheSetup,
    fetched: AtomicU64,
}

impl Fetcher {
    /// Features (f16 bytes) of samples, fetched with one call per owning node.
    fn fetch_many(&self, ids: &[SampleId]) -> Result<Vec<Bytes>, TunerError> {
        let mut out = vec![Bytes::new(); ids.len()];
        let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (k, id) in ids.iter().enumerate() {
            by_node
                .entry(self.rows[*id as usize].node)
                .or_default()
                .push(k);
        }
        for (node, ks) in by_node {
            let node = &self.setup.nodes[node];
            let photos: Vec<u64> = ks
                .iter()
                .map(|k| self.rows[ids[*k] as usize].photo)
                .collect();
            let request = GetFeaturesRequest {
                ids: photos,
                stored_only: false,
            };
            let chunk = self
                .setup
                .handle
                .block_on(node.unary(request, |mut c, r| async move { c.get_features(r).await }))
                .map_err(|e| node_error(node, format!("fetching features: {}", e.message())))?;
            let features = decode_chunk(&chunk, u32::MAX as usize)
                .map_err(|e| node_error(node, format!("fetching features: {e}")))?;
            if features.len() != ks.len() || features.dim != self.setup.dim {
                return Err(node_error(
                    node,
                    format!(
                        "asked for {} features of {}, sent {} of {}",
                        ks.len(),
                        self.setup.dim,
                        features.len(),
                        features.dim
                    ),
                ));
            }
            self.fetched
                .fetch_add(chunk.features.len() as u64, Ordering::Relaxed);
            let row = self.setup.dim * 2;
            for (j, k) in ks.iter().enumerate() {
                out[*k] = Bytes::copy_from_slice(&chunk.features[j * row..(j + 1) * row]);
            }
        }
        Ok(out)
    }
}

impl SampleSource for Fetcher {
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError> {
        let data = self
            .fetch_many(&[id])
            .map_err(|e| CacheError::Source {
                id,
                reason: e.to_string(),
            })?
            .remove(0);
        Ok(Sample {
            label: self.rows[id as usize].label,
            data,
        })
    }
}
