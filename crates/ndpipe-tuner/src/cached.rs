//! Head training through a training-data cache, for jobs whose features exceed the Tuner's
//! memory budget (SpiderCache or one of its peers, from the `spidercache` crate).
//!
//! The Tuner then keeps only (node, photo, label) per training sample. Each epoch the policy
//! draws the sample order; hits come from the cache, misses are fetched from the PipeStore that
//! owns the photo (`GetFeatures`, batched per node) and offered to the cache. After every step
//! the policy hears the per-sample losses and the features (the linear head's input, used as the
//! embedding).

use std::sync::Arc;

use bytes::Bytes;
use half::f16;
use ndpipe_proto::pb::GetFeaturesRequest;
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::{Features, decode_chunk};
use serde::{Deserialize, Serialize};
use spidercache::{
    Answer, BatchReport, CacheError, Capacity, PolicyKind, Sample, SampleId, SampleSource,
    TrainingSpec, build_policy,
};
use tonic::transport::Channel;

use crate::{Head, TunerError};

/// One training sample kept by reference.
#[derive(Debug, Clone, Copy)]
pub struct RemoteRow {
    /// Index of the node that owns the photo.
    pub node: usize,
    /// The photo.
    pub photo: u64,
    /// Its class index.
    pub label: u32,
}

/// The cache's figures over a job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CacheReport {
    /// The policy.
    pub policy: String,
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
pub struct CacheSetup {
    /// Policy name: spidercache, shade, icache, quiver, lru, lfu, static or nocache.
    pub policy: String,
    /// Bytes of features the Tuner may hold.
    pub budget_bytes: u64,
    /// Clients of the nodes, by index.
    pub clients: Vec<PipeStoreClient<Channel>>,
    /// The runtime the gRPC calls run on (training runs on a plain thread).
    pub handle: tokio::runtime::Handle,
    /// Feature dimension.
    pub dim: usize,
    /// Batch size and seed of the sampler.
    pub batch: usize,
    /// Seed.
    pub seed: u64,
}

/// The policy for a name.
pub fn policy_kind(name: &str) -> Result<PolicyKind, TunerError> {
    Ok(match name {
        "spidercache" => PolicyKind::Spider(Default::default()),
        "shade" => PolicyKind::Shade(Default::default()),
        "icache" => PolicyKind::ICache(Default::default()),
        "quiver" => PolicyKind::Quiver(Default::default()),
        "lru" => PolicyKind::Lru,
        "lfu" => PolicyKind::Lfu,
        "static" => PolicyKind::Static,
        "nocache" => PolicyKind::NoCache,
        other => {
            return Err(TunerError::InvalidArgument(format!(
                "unknown cache policy {other:?}"
            )));
        }
    })
}

struct Fetcher {
    rows: Arc<Vec<RemoteRow>>,
    setup: CacheSetup,
    fetched: std::sync::atomic::AtomicU64,
}

impl Fetcher {
    /// Features (f16 bytes) of samples, fetched with one call per owning node.
    fn fetch_many(&self, ids: &[SampleId]) -> Result<Vec<Bytes>, TunerError> {
        let mut out = vec![Bytes::new(); ids.len()];
        let mut by_node: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (k, id) in ids.iter().enumerate() {
            by_node
                .entry(self.rows[*id as usize].node)
                .or_default()
                .push(k);
        }
        for (node, ks) in by_node {
            let photos: Vec<u64> = ks
                .iter()
                .map(|k| self.rows[ids[*k] as usize].photo)
                .collect();
            let mut client = self.setup.clients[node].clone();
            let chunk = self
                .setup
                .handle
                .block_on(client.get_features(GetFeaturesRequest { ids: photos }))
                .map_err(|e| TunerError::Node {
                    node: format!("node #{node}"),
                    message: format!("fetching features: {}", e.message()),
                })?
                .into_inner();
            let features: Features = decode_chunk(&chunk, u32::MAX as usize)?;
            let row = self.setup.dim * 2;
            self.fetched.fetch_add(
                chunk.features.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            for (j, k) in ks.iter().enumerate() {
                out[*k] = Bytes::copy_from_slice(&chunk.features[j * row..(j + 1) * row]);
            }
            debug_assert_eq!(features.len(), ks.len());
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

/// Trains run `run` of `runs` for `epochs` epochs through a cache; returns the validation top-1
/// after the run. Adds the cache's figures to `report`.
#[allow(clippy::too_many_arguments)]
pub fn train_run_cached(
    head: &mut Head,
    rows: Vec<RemoteRow>,
    run: usize,
    runs: usize,
    epochs: usize,
    val: &Features,
    setup: &CacheSetup,
    report: &mut CacheReport,
) -> Result<f32, TunerError> {
    if rows.is_empty() {
        return Ok(if val.is_empty() {
            0.0
        } else {
            head.evaluate(&val.values, &val.labels)?
        });
    }
    let dim = setup.dim;
    let items = (setup.budget_bytes / (dim as u64 * 2)).max(1) as usize;
    let fetcher = Arc::new(Fetcher {
        rows: Arc::new(rows),
        setup: setup.clone(),
        fetched: 0.into(),
    });
    let spec = TrainingSpec {
        num_samples: fetcher.rows.len(),
        batch_size: setup.batch.min(fetcher.rows.len()).max(1),
        seed: setup.seed + run as u64,
    };
    let policy = build_policy(
        policy_kind(&setup.policy)?,
        spec,
        Capacity::new(items, setup.budget_bytes),
        fetcher.clone(),
    )
    .map_err(|e| TunerError::InvalidArgument(e.to_string()))?;
    report.policy = setup.policy.clone();
    report.capacity_items = items;
    let cache = |e: CacheError| TunerError::InvalidArgument(format!("cache: {e}"));
    let mut top1 = 0.0;
    let mut training = head.streaming(run, runs, epochs)?;
    for epoch in 0..epochs {
        training.begin_epoch(epoch);
        policy.begin_epoch(epoch as u32).map_err(cache)?;
        while let Some(batch) = policy.next_batch() {
            let mut data: Vec<Option<Bytes>> = vec![None; batch.len()];
            let mut labels: Vec<u32> = Vec::with_capacity(batch.len());
            let mut missing = Vec::new();
            for (k, id) in batch.iter().enumerate() {
                let label = fetcher.rows[*id as usize].label;
                match policy.lookup(*id, label).map_err(cache)? {
                    Answer::Hit(bytes) => data[k] = Some(bytes),
                    Answer::Substitute {
                        data: bytes,
                        label: l,
                        ..
                    } => {
                        data[k] = Some(bytes);
                        labels.push(l);
                        continue;
                    }
                    Answer::Miss => missing.push(k),
                }
                labels.push(label);
            }
            let ids: Vec<SampleId> = missing.iter().map(|k| batch[*k]).collect();
            for (k, bytes) in missing.iter().zip(fetcher.fetch_many(&ids)?) {
                let id = batch[*k];
                policy
                    .admit(
                        id,
                        Sample {
                            label: fetcher.rows[id as usize].label,
                            data: bytes.clone(),
                        },
                    )
                    .map_err(cache)?;
                data[*k] = Some(bytes);
            }
            let mut x = Vec::with_capacity(batch.len() * dim);
            for d in &data {
                let d = d.as_ref().ok_or_else(|| {
                    TunerError::InvalidArgument("a sample was not resolved".into())
                })?;
                x.extend(
                    d.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
                );
            }
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
        top1 = if val.is_empty() {
            0.0
        } else {
            training.head().evaluate(&val.values, &val.labels)?
        };
        let stats = policy.end_epoch(Some(f64::from(top1))).map_err(cache)?;
        report.exact_hits += stats.exact_hits;
        report.substitutes += stats.substitutes;
        report.misses += stats.misses;
    }
    report.requests = report.exact_hits + report.substitutes + report.misses;
    report.hit_ratio = if report.requests == 0 {
        0.0
    } else {
        (report.exact_hits + report.substitutes) as f64 / report.requests as f64
    };
    report.fetched_bytes += fetcher.fetched.load(std::sync::atomic::Ordering::Relaxed);
    Ok(top1)
}
