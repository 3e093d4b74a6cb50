//! iCache: its settings and the policy.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;

use crate::api::{
    Answer, BatchReport, CachePolicy, Capacity, Label, LabelSource, Sample, SampleId, SampleSource,
    TrainingSpec, check_id,
};
use crate::error::CacheError;
use crate::importance_cache::Priority;
use crate::sampler::{EpochCursor, rng_for, stream, uniform_order};
use crate::stats::EpochStats;
use crate::store::Store;

/// iCache's constants.
#[derive(Debug, Clone, PartialEq)]
pub struct ICacheConfig {
    /// Epochs before selection starts; all of them train every sample (5).
    pub warm_up: u32,
    /// Every `reuse_factor`-th epoch is also a full epoch (3).
    pub reuse_factor: u32,
    /// A sample is kept with probability percentile(loss)^beta (0.33, the
    /// artifact's command-line default).
    pub beta: f64,
    /// Losses in the percentile history (1024); selection starts once full.
    pub history: usize,
    /// Share of each kept batch, by loss, flagged important (0.7).
    pub important_fraction: f64,
    /// Share of the capacity for the H-cache; the L-cache gets the rest (0.9).
    pub h_fraction: f64,
}

impl Default for ICacheConfig {
    fn default() -> Self {
        Self {
            warm_up: 5,
            reuse_factor: 3,
            beta: 0.33,
            history: 1024,
            important_fraction: 0.7,
            h_fraction: 0.9,
        }
    }
}

impl ICacheConfig {
    /// Whether `epoch` trains every sample.
    pub fn is_full_epoch(&self, epoch: u32) -> bool {
        epoch < self.warm_up || self.reuse_factor == 0 || epoch.is_multiple_of(self.reuse_factor)
    }
}

struct LBuffer {
    fifo: VecDeque<(SampleId, Sample)>,
    limit: Capacity,
    bytes: u64,
    stream: Vec<SampleId>,
    next: usize,
    passes: u32,
}

struct State {
    h: Store,
    heap: BTreeSet<(Priority, SampleId)>,
    iv: Vec<f64>,
    new_iv: Vec<f64>,
    last_loss: Vec<f64>,
    history: VecDeque<f64>,
    important: Vec<bool>,
    full_epoch: bool,
    l: LBuffer,
    /// Served ids of the substitutes answered since the last report, per requested id.
    substituted: HashMap<SampleId, VecDeque<SampleId>>,
    cursor: EpochCursor,
    rng: Pcg64Mcg,
    stats: EpochStats,
}

/// iCache (HPCA'23): loss-valued importance refreshed at epoch boundaries,
/// selective-backprop epochs, an H-cache min-heap for important samples and an
/// L-cache FIFO of streamed samples that substitute, with their own labels,
/// for any unimportant request.
pub struct ICache {
    config: ICacheConfig,
    spec: TrainingSpec,
    capacity: Capacity,
    source: Arc<dyn SampleSource>,
    state: Mutex<State>,
}

fn key(iv: f64, id: SampleId) -> (Priority, SampleId) {
    (Priority { score: iv, freq: 0 }, id)
}

impl ICache {
    /// An iCache of `capacity` for `spec`'s run; `source` feeds the L-cache stream.
    pub fn new(
        config: ICacheConfig,
        spec: TrainingSpec,
        capacity: Capacity,
        source: Arc<dyn SampleSource>,
    ) -> Result<Self, CacheError> {
        spec.validate()?;
        if !(0.0..=1.0).contains(&config.h_fraction)
            || !(0.0..=1.0).contains(&config.important_fraction)
        {
            return Err(CacheError::InvalidConfig(
                "iCache fractions must be within 0..=1".into(),
            ));
        }
        let n = spec.num_samples;
        let h_limit = capacity.scaled(config.h_fraction);
        let state = State {
            h: Store::new(h_limit),
            heap: BTreeSet::new(),
            iv: vec![0.0; n],
            new_iv: vec![0.0; n],
            last_loss: vec![0.0; n],
            history: VecDeque::with_capacity(config.history),
            important: vec![true; n],
            full_epoch: true,
            l: LBuffer {
                fifo: VecDeque::new(),
                limit: capacity.minus(h_limit),
                bytes: 0,
                stream: Vec::new(),
                next: 0,
                passes: 0,
            },
            substituted: HashMap::new(),
            cursor: EpochCursor::default(),
            rng: rng_for(spec.seed, 0, stream::SELECTION),
            stats: EpochStats::default(),
        };
        Ok(Self {
            config,
            spec,
            capacity,
            source,
            state: Mutex::new(state),
        })
    }

    /// Whether `id` was flagged important for the current epoch.
    pub fn is_important(&self, id: SampleId) -> bool {
        self.state
            .lock()
            .important
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Tops the L-cache FIFO up from the shuffled full-dataset stream.
    fn refill(&self, st: &mut State) -> Result<(), CacheError> {
        let l = &mut st.l;
        // One full pass without a sample that fits means none ever will: stop, do not spin.
        let mut skipped = 0usize;
        while l.fifo.len() < l.limit.items && skipped < self.spec.num_samples {
            if l.next >= l.stream.len() {
                l.stream = (0..self.spec.num_samples as SampleId).collect();
                l.stream
                    .shuffle(&mut rng_for(self.spec.seed, l.passes, stream::L_STREAM));
                l.passes += 1;
                l.next = 0;
            }
            let id = l.stream[l.next];
            let sample = self.source.fetch(id)?;
            st.stats.background_fetches += 1;
            let len = sample.data.len() as u64;
            if len > l.limit.bytes {
                l.next += 1;
                skipped += 1;
                continue;
            }
            if l.bytes + len > l.limit.bytes {
                break;
            }
            l.next += 1;
            l.bytes += len;
            l.fifo.push_back((id, sample));
        }
        Ok(())
    }

    /// SBP selection over `order`, using each sample's loss from its last
    /// forward pass; then per kept batch the top share by loss is important.
    fn select(&self, st: &mut State, order: Vec<SampleId>) -> Vec<SampleId> {
        let mut kept = Vec::with_capacity(order.len());
        for id in order {
            let loss = st.last_loss[id as usize];
            let keep = if st.history.len() >= self.config.history {
                let below = st.history.iter().filter(|&&h| h <= loss).count();
                let p = (below as f64 / st.history.len() as f64).powf(self.config.beta);
                st.rng.random::<f64>() < p
            } else {
                true
            };
            if st.history.len() == self.config.history {
                st.history.pop_front();
            }
            st.history.push_back(loss);
            if keep {
                kept.push(id);
            }
        }
        for chunk in kept.chunks_mut(self.spec.batch_size) {
            let losses = &st.last_loss;
            chunk.sort_by(|a, b| {
                losses[*b as usize]
                    .total_cmp(&losses[*a as usize])
                    .then(a.cmp(b))
            });
            let top = (chunk.len() as f64 * self.config.important_fraction).ceil() as usize;
            for (i, &id) in chunk.iter().enumerate() {
                st.important[id as usize] = i < top;
            }
        }
        kept
    }
}

impl CachePolicy for ICache {
    fn name(&self) -> &'static str {
        "icache"
    }

    fn spec(&self) -> TrainingSpec {
        self.spec
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn usage(&self) -> Capacity {
        let st = self.state.lock();
        Capacity::new(
            st.h.len() + st.l.fifo.len(),
            st.h.usage().bytes + st.l.bytes,
        )
    }

    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.stats = EpochStats::start(epoch);
        st.substituted.clear();
        st.rng = rng_for(self.spec.seed, epoch, stream::SELECTION);
        let mut order = uniform_order(&self.spec, epoch);
        st.full_epoch = self.config.is_full_epoch(epoch);
        if st.full_epoch {
            st.important.fill(true);
        } else {
            st.important.fill(false);
            order = self.select(st, order);
        }
        st.cursor = EpochCursor::new(order, self.spec.batch_size);
        self.refill(st)
    }

    fn next_batch(&self) -> Option<Vec<SampleId>> {
        self.state.lock().cursor.next_batch()
    }

    fn lookup(&self, id: SampleId, _label: Label) -> Result<Answer, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let answer = if let Some(s) = st.h.get(id) {
            Answer::Hit(s.data.clone())
        } else if !st.important[id as usize] {
            match st.l.fifo.pop_front() {
                Some((served, s)) => {
                    st.l.bytes -= s.data.len() as u64;
                    st.substituted.entry(id).or_default().push_back(served);
                    Answer::Substitute {
                        served,
                        label: s.label,
                        label_source: LabelSource::Served,
                        data: s.data,
                    }
                }
                None => Answer::Miss,
            }
        } else {
            Answer::Miss
        };
        st.stats.count(&answer);
        Ok(answer)
    }

    fn admit(&self, id: SampleId, sample: Sample) -> Result<bool, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let len = sample.data.len();
        if !st.important[id as usize] || st.h.contains(id) || !st.h.could_hold(len) {
            return Ok(false);
        }
        if !st.h.fits(len) {
            // Full epochs only fill; selective ones displace lower importance.
            if st.full_epoch {
                return Ok(false);
            }
            let mine = st.iv[id as usize];
            let mut victims = Vec::new();
            let mut freed = Capacity::default();
            for &(prio, victim) in &st.heap {
                if st.h.fits_after_freeing(len, freed) {
                    break;
                }
                if prio.score >= mine {
                    return Ok(false);
                }
                victims.push(victim);
                let f = st.h.footprint(victim);
                freed = Capacity::new(freed.items + f.items, freed.bytes + f.bytes);
            }
            if !st.h.fits_after_freeing(len, freed) {
                return Ok(false);
            }
            for victim in victims {
                st.h.remove(victim);
                st.heap.remove(&key(st.iv[victim as usize], victim));
                st.stats.evictions += 1;
            }
        }
        st.h.insert(id, sample);
        st.heap.insert(key(st.iv[id as usize], id));
        st.stats.admitted += 1;
        Ok(true)
    }

    fn report_batch(&self, batch: &BatchReport<'_>) -> Result<(), CacheError> {
        batch.validate(self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for (&requested, &loss) in batch.ids.iter().zip(batch.losses) {
            // A substitute's loss is the served sample's, as iCache's client records it.
            let id = st
                .substituted
                .get_mut(&requested)
                .and_then(VecDeque::pop_front)
                .unwrap_or(requested);
            st.new_iv[id as usize] = f64::from(loss);
            st.last_loss[id as usize] = f64::from(loss);
        }
        self.refill(st)
    }

    fn end_epoch(&self, _val_accuracy: Option<f64>) -> Result<EpochStats, CacheError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.iv.copy_from_slice(&st.new_iv);
        let iv = &st.iv;
        st.heap = st
            .heap
            .iter()
            .map(|&(_, id)| key(iv[id as usize], id))
            .collect();
        Ok(st.stats.roll_over())
    }
}
