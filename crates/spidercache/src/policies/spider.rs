//! SpiderCache: its settings and the policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand_pcg::Pcg64Mcg;

use super::homophily::HomophilyCache;
use super::scoring::{Job, Outcome, ScanParams, Scorer, Worker};
use crate::ann::AnnConfig;
use crate::api::{
    Answer, BatchReport, CachePolicy, Capacity, Label, LabelSource, Sample, SampleId, SampleSource,
    TrainingSpec, check_id,
};
use crate::error::CacheError;
use crate::importance_cache::ImportanceCache;
use crate::sampler::{
    EpochCursor, ImportanceSampler, ImportanceSamplerConfig, accuracy_gate, rng_for, stream,
};
use crate::score::ScoreVariant;
use crate::split::SplitPolicy;
use crate::stats::EpochStats;

/// Where scoring rounds run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoringMode {
    /// Inside [`CachePolicy::report_batch`]: deterministic, adds to the step time.
    Inline,
    /// On a worker thread, at most `max_lag` rounds behind the reports
    /// (the artifact overlaps one round with training).
    Background {
        /// Rounds that may wait before a report blocks.
        max_lag: usize,
    },
}

/// Every SpiderCache constant, with the artifact's values as defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SpiderConfig {
    /// The importance sampler (multinomial, PADS gate, rep_factor 3.0).
    pub sampler: ImportanceSamplerConfig,
    /// HNSW parameters (M 8, ef_construction 100).
    pub ann: AnnConfig,
    /// Neighbours fetched per query (500, self included).
    pub k: usize,
    /// Similarity is `exp(-decay * squared_l2)` (0.01).
    pub similarity_decay: f64,
    /// Neighbours count while similarity stays at or above this (0.98).
    pub similarity_threshold: f64,
    /// The score formula.
    pub score: ScoreVariant,
    /// The `500` dividing the other-label count in the formula.
    pub score_norm: f64,
    /// Weight of a sample not scored yet (0.1).
    pub initial_weight: f64,
    /// First epoch that scores; earlier ones only build the index (1).
    pub score_from_epoch: u32,
    /// A round runs on every `scoring_interval`-th reported batch (2).
    pub scoring_interval: usize,
    /// Also index (not score) the batches between rounds. The artifact does not.
    pub index_every_batch: bool,
    /// Ablation, off in the artifact: each in-radius neighbour's weight moves
    /// to `(1 - a) * w + a * score` of the sample queried.
    pub propagate: Option<f64>,
    /// Importance/homophily split of the capacity.
    pub split: SplitPolicy,
    /// Homophily candidates promoted per round (the artifact's 0.5 s daemon,
    /// made deterministic).
    pub promotions_per_round: usize,
    /// Inline or background scoring.
    pub scoring: ScoringMode,
}

impl Default for SpiderConfig {
    fn default() -> Self {
        Self {
            sampler: ImportanceSamplerConfig::default(),
            ann: AnnConfig::default(),
            k: 500,
            similarity_decay: 0.01,
            similarity_threshold: 0.98,
            score: ScoreVariant::default(),
            score_norm: 500.0,
            initial_weight: 0.1,
            score_from_epoch: 1,
            scoring_interval: 2,
            index_every_batch: false,
            propagate: None,
            split: SplitPolicy::default(),
            promotions_per_round: 1,
            scoring: ScoringMode::Background { max_lag: 1 },
        }
    }
}

impl SpiderConfig {
    /// Checks every field that could make the policy misbehave.
    pub fn validate(&self) -> Result<(), CacheError> {
        self.sampler.validate()?;
        self.split.validate()?;
        let bad = |what: &str| Err(CacheError::InvalidConfig(what.into()));
        if self.k == 0 || self.scoring_interval == 0 {
            return bad("k and scoring_interval must be positive");
        }
        if !(self.initial_weight.is_finite() && self.initial_weight >= 0.0) {
            return bad("initial_weight must be finite and non-negative");
        }
        if self.propagate.is_some_and(|a| !(0.0..=1.0).contains(&a)) {
            return bad("propagate must be within 0..=1");
        }
        if matches!(self.scoring, ScoringMode::Background { max_lag: 0 }) {
            return bad("background scoring needs max_lag >= 1");
        }
        Ok(())
    }

    fn scan_params(&self) -> ScanParams {
        ScanParams {
            ann: self.ann,
            k: self.k,
            decay: self.similarity_decay,
            threshold: self.similarity_threshold,
            variant: self.score,
            norm: self.score_norm,
            propagate: self.propagate.is_some(),
        }
    }
}

struct State {
    weights: Vec<f64>,
    imp: ImportanceCache,
    homophily: HomophilyCache,
    cursor: EpochCursor,
    batches_reported: usize,
    epoch: u32,
    val_history: Vec<f64>,
    std_history: Vec<f64>,
    share: f64,
    rng: Pcg64Mcg,
    stats: EpochStats,
    failure: Option<CacheError>,
}

struct Shared {
    config: SpiderConfig,
    params: ScanParams,
    spec: TrainingSpec,
    source: Arc<dyn SampleSource>,
    state: Mutex<State>,
    scorer: Mutex<Scorer>,
}

impl Shared {
    /// One scoring round: the index work under the scorer lock, then the
    /// results applied under the state lock.
    fn run(&self, job: &Job) -> Result<(), CacheError> {
        let started = Instant::now();
        let outcome = self.scorer.lock().run(job, &self.params)?;
        let elapsed = started.elapsed();
        let mut st = self.state.lock();
        self.apply(&mut st, outcome, elapsed, job.score)
    }

    fn apply(
        &self,
        st: &mut State,
        out: Outcome,
        elapsed: Duration,
        scored: bool,
    ) -> Result<(), CacheError> {
        st.stats.scoring_time += elapsed;
        if !scored {
            return Ok(());
        }
        st.stats.scoring_rounds += 1;
        for &(id, s) in &out.scores {
            st.weights[id as usize] = s;
        }
        if let Some(a) = self.config.propagate {
            for &(id, s) in &out.propagated {
                let w = &mut st.weights[id as usize];
                *w = (1.0 - a) * *w + a * s;
            }
        }
        let n = st.weights.len() as f64;
        let mean = st.weights.iter().sum::<f64>() / n;
        let var = st.weights.iter().map(|w| (w - mean).powi(2)).sum::<f64>() / n;
        st.std_history.push(var.sqrt());
        if let Some((rep, neighbours)) = out.candidate {
            st.homophily.propose(rep, neighbours);
        }
        for _ in 0..self.config.promotions_per_round {
            let done = st.homophily.promote_one(&mut st.rng, &*self.source)?;
            st.stats.background_fetches += done.fetched;
            st.stats.evictions += done.evicted;
        }
        Ok(())
    }
}

/// SpiderCache (ICPP'25): neighbourhood importance from an ANN index over the
/// model's embeddings, importance sampling, and a capacity split between an
/// importance cache and a homophily cache that serves near-duplicates.
pub struct SpiderCache {
    shared: Arc<Shared>,
    capacity: Capacity,
    sampler: ImportanceSampler,
    worker: Option<Worker>,
}

impl SpiderCache {
    /// A SpiderCache of `capacity` for `spec`'s run; `source` supplies the
    /// bytes of homophily representatives.
    pub fn new(
        config: SpiderConfig,
        spec: TrainingSpec,
        capacity: Capacity,
        source: Arc<dyn SampleSource>,
    ) -> Result<Self, CacheError> {
        config.validate()?;
        let sampler = ImportanceSampler::new(config.sampler.clone(), spec)?;
        let n = spec.num_samples;
        let share = config.split.importance_share(0, &[]);
        let imp_limit = capacity.scaled(share);
        let state = State {
            weights: vec![config.initial_weight; n],
            imp: ImportanceCache::new(imp_limit, n, config.initial_weight),
            homophily: HomophilyCache::new(capacity.minus(imp_limit)),
            cursor: EpochCursor::default(),
            batches_reported: 0,
            epoch: 0,
            val_history: Vec::new(),
            std_history: Vec::new(),
            share,
            rng: rng_for(spec.seed, 0, stream::POLICY),
            stats: EpochStats::default(),
            failure: None,
        };
        let shared = Arc::new(Shared {
            params: config.scan_params(),
            config,
            spec,
            source,
            state: Mutex::new(state),
            scorer: Mutex::new(Scorer::new(n)),
        });
        let worker = match shared.config.scoring {
            ScoringMode::Inline => None,
            ScoringMode::Background { max_lag } => {
                let bg = Arc::clone(&shared);
                Some(Worker::spawn(max_lag, move |job| {
                    if let Err(e) = bg.run(&job) {
                        bg.state.lock().failure.get_or_insert(e);
                    }
                }))
            }
        };
        Ok(Self {
            shared,
            capacity,
            sampler,
            worker,
        })
    }

    /// A copy of every sample's current importance weight.
    pub fn weights(&self) -> Vec<f64> {
        self.shared.state.lock().weights.clone()
    }

    /// Waits for queued scoring rounds and reports any error one of them hit.
    pub fn flush(&self) -> Result<(), CacheError> {
        if let Some(worker) = &self.worker {
            worker.flush()?;
        }
        self.shared.state.lock().failure.take().map_or(Ok(()), Err)
    }
}

impl CachePolicy for SpiderCache {
    fn name(&self) -> &'static str {
        "spidercache"
    }

    fn spec(&self) -> TrainingSpec {
        self.shared.spec
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn usage(&self) -> Capacity {
        let st = self.shared.state.lock();
        let (a, b) = (st.imp.usage(), st.homophily.usage());
        Capacity::new(a.items + b.items, a.bytes + b.bytes)
    }

    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError> {
        self.flush()?;
        let config = &self.shared.config;
        let mut guard = self.shared.state.lock();
        let st = &mut *guard;
        st.stats = EpochStats::start(epoch);
        st.epoch = epoch;
        st.batches_reported = 0;
        st.share = config.split.importance_share(epoch, &st.std_history);
        let imp_limit = self.capacity.scaled(st.share);
        st.stats.evictions += st.imp.set_limit(imp_limit);
        st.stats.evictions += st.homophily.set_limit(self.capacity.minus(imp_limit));
        let pads = accuracy_gate(&st.val_history, config.sampler.gate_window);
        let imp = &st.imp;
        let order = self
            .sampler
            .epoch_order(epoch, &st.weights, pads, |id| imp.contains(id));
        st.cursor = EpochCursor::new(order, self.shared.spec.batch_size);
        Ok(())
    }

    fn next_batch(&self) -> Option<Vec<SampleId>> {
        self.shared.state.lock().cursor.next_batch()
    }

    fn lookup(&self, id: SampleId, label: Label) -> Result<Answer, CacheError> {
        check_id(id, self.shared.spec.num_samples)?;
        let mut guard = self.shared.state.lock();
        let st = &mut *guard;
        let answer = if let Some(s) = st.imp.get(id) {
            Answer::Hit(s.data.clone())
        } else {
            match st.homophily.lookup(id) {
                Some((rep, s)) if rep == id => Answer::Hit(s.data.clone()),
                // Neighbours are same-label by construction; the check keeps a
                // relabelled sample from ever being served another class.
                Some((rep, s)) if s.label == label => Answer::Substitute {
                    served: rep,
                    label,
                    label_source: LabelSource::Requested,
                    data: s.data.clone(),
                },
                _ => Answer::Miss,
            }
        };
        st.stats.count(&answer);
        Ok(answer)
    }

    fn admit(&self, id: SampleId, sample: Sample) -> Result<bool, CacheError> {
        check_id(id, self.shared.spec.num_samples)?;
        let mut st = self.shared.state.lock();
        let (inserted, evicted) = st.imp.admit(id, sample);
        st.stats.admitted += u64::from(inserted);
        st.stats.evictions += evicted;
        Ok(inserted)
    }

    fn report_batch(&self, batch: &BatchReport<'_>) -> Result<(), CacheError> {
        batch.validate(self.shared.spec.num_samples)?;
        let config = &self.shared.config;
        let job = {
            let mut guard = self.shared.state.lock();
            let st = &mut *guard;
            if let Some(e) = st.failure.take() {
                return Err(e);
            }
            let weights = &st.weights;
            st.imp.record_trained(batch.ids, |id| weights[id as usize]);
            let round = st.batches_reported.is_multiple_of(config.scoring_interval);
            st.batches_reported += 1;
            (round || config.index_every_batch).then(|| Job {
                ids: batch.ids.to_vec(),
                labels: batch.labels.to_vec(),
                embeddings: batch.embeddings.to_vec(),
                dim: batch.dim,
                score: round && st.epoch >= config.score_from_epoch,
            })
        };
        match (job, &self.worker) {
            (None, _) => Ok(()),
            (Some(job), Some(worker)) => worker.submit(job),
            (Some(job), None) => self.shared.run(&job),
        }
    }

    fn end_epoch(&self, val_accuracy: Option<f64>) -> Result<EpochStats, CacheError> {
        self.flush()?;
        let (len, memory) = {
            let scorer = self.shared.scorer.lock();
            (scorer.index_len(), scorer.index_memory())
        };
        let mut st = self.shared.state.lock();
        st.val_history.extend(val_accuracy);
        let next = st.epoch + 1;
        let mut stats = std::mem::replace(&mut st.stats, EpochStats::start(next));
        stats.index_len = len;
        stats.index_memory_bytes = memory;
        stats.importance_share = Some(st.share);
        Ok(stats)
    }
}
