//! SpiderCache: its settings and the policy.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::homophily::{HomophilyCache, HomophilyConfig, Planned};
use super::scoring::{Job, Outcome, ScanParams, Scorer, Worker};
use crate::ann::AnnConfig;
use crate::api::{
    Answer, BatchReport, CachePolicy, Capacity, Label, LabelSource, Sample, SampleId, SampleSource,
    TrainingSpec, check_id,
};
use crate::error::CacheError;
use crate::importance_cache::ImportanceCache;
use crate::radius::Radius;
use crate::sampler::{EpochCursor, ImportanceSampler, ImportanceSamplerConfig, accuracy_gate};
use crate::score::ScoreVariant;
use crate::split::{PartGains, SplitPolicy, SplitSignals};
use crate::stats::{EpochStats, HomophilyStats, NeighbourhoodStats, Summary};

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

/// Every SpiderCache constant. The defaults are the artifact's, except the
/// radius, which is relative to the embeddings' scale (see
/// [`SpiderConfig::artifact`] for the authors' absolute one).
#[derive(Debug, Clone, PartialEq)]
pub struct SpiderConfig {
    /// The importance sampler (multinomial, PADS gate, rep_factor 3.0).
    pub sampler: ImportanceSamplerConfig,
    /// HNSW parameters (M 8, ef_construction 100).
    pub ann: AnnConfig,
    /// Neighbours fetched per query (500, self included).
    pub k: usize,
    /// How near a neighbour must be to count (twice the median squared
    /// nearest-neighbour distance in the index).
    pub radius: Radius,
    /// Index unit-length embeddings, so that squared distance is
    /// `2 * (1 - cos)` and the radius a cosine one (off, as in the artifact).
    pub normalize: bool,
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
    /// Importance/homophily split of the capacity (all importance, as the artifact runs).
    pub split: SplitPolicy,
    /// How homophily representatives are chosen.
    pub homophily: HomophilyConfig,
    /// Inline or background scoring.
    pub scoring: ScoringMode,
}

impl Default for SpiderConfig {
    fn default() -> Self {
        Self {
            sampler: ImportanceSamplerConfig::default(),
            ann: AnnConfig::default(),
            k: 500,
            radius: Radius::default(),
            normalize: false,
            score: ScoreVariant::default(),
            score_norm: 500.0,
            initial_weight: 0.1,
            score_from_epoch: 1,
            scoring_interval: 2,
            index_every_batch: false,
            propagate: None,
            split: SplitPolicy::default(),
            homophily: HomophilyConfig::default(),
            scoring: ScoringMode::Background { max_lag: 1 },
        }
    }
}

impl SpiderConfig {
    /// The artifact's settings, its absolute radius (`exp(-0.01 * d2) >= 0.98`) included.
    pub fn artifact() -> Self {
        Self {
            radius: Radius::artifact(),
            ..Self::default()
        }
    }

    /// Checks every field that could make the policy misbehave.
    pub fn validate(&self) -> Result<(), CacheError> {
        self.sampler.validate()?;
        self.split.validate()?;
        self.radius.validate()?;
        self.homophily.validate()?;
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
            normalize: self.normalize,
            variant: self.score,
            norm: self.score_norm,
            propagate: self.propagate.is_some(),
            max_neighbours: self.homophily.max_neighbours,
        }
    }
}

/// One epoch's record of the scan and of what each part of the capacity earned.
#[derive(Default)]
struct Ledger {
    scores: Vec<f64>,
    same: Vec<f64>,
    other: Vec<f64>,
    radii: Vec<f64>,
    importance_hits: u64,
    homophily_hits: u64,
    homophily_reads: u64,
    held: (f64, f64),
    held_samples: u64,
    homophily: HomophilyStats,
}

impl Ledger {
    /// Reads saved per slot held, per part.
    fn gains(&self) -> PartGains {
        let n = self.held_samples.max(1) as f64;
        let (imp, hom) = (self.held.0 / n, self.held.1 / n);
        PartGains {
            importance: (imp > 0.0).then(|| self.importance_hits as f64 / imp),
            homophily: (hom > 0.0)
                .then(|| (self.homophily_hits as f64 - self.homophily_reads as f64) / hom),
        }
    }

    fn neighbourhood(&self, weights: &[f64]) -> Option<NeighbourhoodStats> {
        let scores = Summary::of(&self.scores)?;
        let with_same = self.same.iter().filter(|&&s| s > 0.0).count() as f64;
        Some(NeighbourhoodStats {
            scores,
            same: Summary::of(&self.same).unwrap_or_default(),
            other: Summary::of(&self.other).unwrap_or_default(),
            with_same: with_same / self.same.len().max(1) as f64,
            radius: Summary::of(&self.radii).unwrap_or_default(),
            weights: Summary::of(weights).unwrap_or_default(),
        })
    }
}

struct State {
    weights: Vec<f64>,
    imp: ImportanceCache,
    homophily: HomophilyCache,
    cursor: EpochCursor,
    /// Served ids of the substitutes answered since the last report, per requested id.
    substituted: HashMap<SampleId, VecDeque<SampleId>>,
    batches_reported: usize,
    epoch: u32,
    val_history: Vec<f64>,
    std_history: Vec<f64>,
    share: f64,
    gains: PartGains,
    ledger: Ledger,
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
    /// One scoring round: the index work under the scorer lock; the results
    /// applied and representatives chosen under the state lock; their bytes
    /// read with no lock held; then installed.
    fn run(&self, job: &Job) -> Result<(), CacheError> {
        let started = Instant::now();
        let outcome = self.scorer.lock().run(job, &self.params)?;
        let elapsed = started.elapsed();
        let planned = {
            let mut st = self.state.lock();
            self.apply(&mut st, outcome, elapsed, job.score)
        };
        let mut failure = None;
        let mut ready = Vec::with_capacity(planned.len());
        for (plan, copy) in planned {
            match copy.map_or_else(
                || self.source.fetch(plan.rep).map(|s| (s, true)),
                |s| Ok((s, false)),
            ) {
                Ok(got) => ready.push((plan, Some(got))),
                Err(e) => {
                    failure.get_or_insert(e);
                    ready.push((plan, None));
                }
            }
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for (plan, got) in ready {
            let Some((sample, read)) = got else {
                st.homophily.abandon(&plan);
                continue;
            };
            let (evicted, installed) = st.homophily.install(plan, sample);
            st.stats.evictions += evicted;
            if read {
                st.stats.background_fetches += 1;
                st.ledger.homophily_reads += 1;
            }
            if installed {
                st.ledger.homophily.promoted += 1;
                st.ledger.homophily.copied += u64::from(!read);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Applies a round's scores and candidates; returns the representatives
    /// to promote, with their bytes when the importance cache holds them.
    fn apply(
        &self,
        st: &mut State,
        out: Outcome,
        elapsed: Duration,
        scored: bool,
    ) -> Vec<(Planned, Option<Sample>)> {
        st.stats.scoring_time += elapsed;
        if !scored {
            return Vec::new();
        }
        st.stats.scoring_rounds += 1;
        for (&(id, s), &(same, other)) in out.scores.iter().zip(&out.counts) {
            st.weights[id as usize] = s;
            st.ledger.scores.push(s);
            st.ledger.same.push(same as f64);
            st.ledger.other.push(other as f64);
        }
        st.ledger.radii.push(out.radius_d2);
        if let Some(a) = self.config.propagate {
            for &(id, s) in &out.propagated {
                let w = &mut st.weights[id as usize];
                *w = (1.0 - a) * *w + a * s;
            }
        }
        let n = st.weights.len() as f64;
        let total = st.weights.iter().sum::<f64>();
        let mean = total / n;
        let var = st.weights.iter().map(|w| (w - mean).powi(2)).sum::<f64>() / n;
        st.std_history.push(var.sqrt());
        for (id, neighbours) in out.candidates {
            st.homophily.offer(id, neighbours);
        }
        st.homophily.end_round();
        let (weights, imp) = (&st.weights, &st.imp);
        let per_epoch = if total > 0.0 { n / total } else { 0.0 };
        let plans = st.homophily.plan(
            self.config.homophily.promotions_per_round,
            |id| weights[id as usize] * per_epoch,
            |id| imp.contains(id),
        );
        plans
            .into_iter()
            .map(|p| {
                let copy = st.imp.get(p.rep).cloned();
                (p, copy)
            })
            .collect()
    }
}

/// SpiderCache (ICPP'25): neighbourhood importance from an ANN index over the
/// model's embeddings, importance sampling, and a capacity split between an
/// importance cache and a homophily cache that serves near-duplicates.
///
/// A substitute's row in a [`BatchReport`] is the served sample's training
/// step: its embedding and loss are filed under the served id, so the
/// requested sample never inherits its representative's embedding.
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
        let share = config.split.importance_share(0, &SplitSignals::default());
        let imp_limit = capacity.scaled(share);
        let state = State {
            weights: vec![config.initial_weight; n],
            imp: ImportanceCache::new(imp_limit, n, config.initial_weight),
            homophily: HomophilyCache::new(capacity.minus(imp_limit), config.homophily),
            cursor: EpochCursor::default(),
            substituted: HashMap::new(),
            batches_reported: 0,
            epoch: 0,
            val_history: Vec::new(),
            std_history: Vec::new(),
            share,
            gains: PartGains::default(),
            ledger: Ledger::default(),
            stats: EpochStats::default(),
            failure: None,
        };
        let shared = Arc::new(Shared {
            params: config.scan_params(),
            scorer: Mutex::new(Scorer::new(n, config.radius)),
            config,
            spec,
            source,
            state: Mutex::new(state),
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
        st.ledger = Ledger::default();
        st.substituted.clear();
        let previous = (epoch > 0).then_some(st.share);
        st.epoch = epoch;
        st.batches_reported = 0;
        st.share = config.split.importance_share(
            epoch,
            &SplitSignals {
                previous,
                std_history: &st.std_history,
                gains: st.gains,
            },
        );
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
            st.ledger.importance_hits += 1;
            Answer::Hit(s.data.clone())
        } else {
            match st.homophily.lookup(id) {
                Some((rep, s)) if rep == id => {
                    st.ledger.homophily_hits += 1;
                    st.ledger.homophily.own_hits += 1;
                    Answer::Hit(s.data.clone())
                }
                // Neighbours are same-label by construction; the check keeps a
                // relabelled sample from ever being served another class.
                Some((rep, s)) if s.label == label => {
                    st.ledger.homophily_hits += 1;
                    st.substituted.entry(id).or_default().push_back(rep);
                    Answer::Substitute {
                        served: rep,
                        label,
                        label_source: LabelSource::Requested,
                        data: s.data.clone(),
                    }
                }
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
            // A substitute's row is the served sample's step.
            let trained: Vec<SampleId> = batch
                .ids
                .iter()
                .map(|&id| {
                    st.substituted
                        .get_mut(&id)
                        .and_then(VecDeque::pop_front)
                        .unwrap_or(id)
                })
                .collect();
            let weights = &st.weights;
            st.imp.record_trained(&trained, |id| weights[id as usize]);
            let (imp, hom) = (st.imp.usage().items, st.homophily.usage().items);
            st.ledger.held.0 += imp as f64;
            st.ledger.held.1 += hom as f64;
            st.ledger.held_samples += 1;
            let round = st.batches_reported.is_multiple_of(config.scoring_interval);
            st.batches_reported += 1;
            (round || config.index_every_batch).then(|| Job {
                ids: trained,
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
        let mut guard = self.shared.state.lock();
        let st = &mut *guard;
        st.val_history.extend(val_accuracy);
        st.gains = st.ledger.gains();
        let next = st.epoch + 1;
        let mut stats = std::mem::replace(&mut st.stats, EpochStats::start(next));
        stats.index_len = len;
        stats.index_memory_bytes = memory;
        stats.importance_share = Some(st.share);
        stats.neighbourhood = st.ledger.neighbourhood(&st.weights);
        stats.homophily = Some(HomophilyStats {
            representatives: st.homophily.representatives(),
            covered: st.homophily.covered(),
            ..st.ledger.homophily
        });
        Ok(stats)
    }
}
