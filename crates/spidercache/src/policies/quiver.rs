//! Quiver: its settings and the policy.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;

use crate::api::{
    Answer, CachePolicy, Capacity, Label, LabelSource, Sample, SampleId, SampleSource,
    TrainingSpec, check_id,
};
use crate::error::CacheError;
use crate::sampler::{rng_for, stream, uniform_order};
use crate::stats::EpochStats;
use crate::store::Store;

/// Quiver's knobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuiverConfig {
    /// Candidates probed per batch, as a multiple of the batch size. `None`
    /// uses 1 / cache_ratio (items cached / dataset size), as iCache does.
    pub probe_multiple: Option<f64>,
}

/// One loaded package: its bytes and a dense list for random picks.
struct Package {
    store: Store,
    ids: Vec<SampleId>,
    pos: HashMap<SampleId, usize>,
}

impl Package {
    fn empty(limit: Capacity) -> Self {
        Self {
            store: Store::new(limit),
            ids: Vec::new(),
            pos: HashMap::new(),
        }
    }

    fn take(&mut self, id: SampleId) -> Option<Sample> {
        let at = self.pos.remove(&id)?;
        self.ids.swap_remove(at);
        if let Some(&moved) = self.ids.get(at) {
            self.pos.insert(moved, at);
        }
        self.store.remove(id)
    }
}

struct State {
    packages: Vec<Vec<SampleId>>,
    next_package: usize,
    current: Package,
    loading: Package,
    queue: VecDeque<SampleId>,
    done: Vec<bool>,
    served: usize,
    rng: Pcg64Mcg,
    stats: EpochStats,
}

/// Quiver (FAST'20), as iCache re-implements it: the dataset is split into
/// shuffled packages of half the cache; one package is served while the next
/// is loaded; each cached item is consumed once; the client over-probes and
/// fills a shortfall with random cached items carrying their own labels.
pub struct Quiver {
    spec: TrainingSpec,
    capacity: Capacity,
    probe: usize,
    source: Arc<dyn SampleSource>,
    state: Mutex<State>,
}

impl Quiver {
    /// A Quiver cache of `capacity` for `spec`'s run; `source` loads packages.
    pub fn new(
        config: QuiverConfig,
        spec: TrainingSpec,
        capacity: Capacity,
        source: Arc<dyn SampleSource>,
    ) -> Result<Self, CacheError> {
        spec.validate()?;
        let n = spec.num_samples;
        let ratio = (capacity.items.min(n) as f64 / n as f64).max(f64::MIN_POSITIVE);
        let multiple = config.probe_multiple.unwrap_or(1.0 / ratio);
        if !(multiple >= 1.0 && multiple.is_finite()) {
            return Err(CacheError::InvalidConfig(format!(
                "probe multiple {multiple} must be finite and at least 1"
            )));
        }
        let probe = ((spec.batch_size as f64 * multiple).ceil() as usize).min(n);
        let package_items = capacity.items / 2;
        let mut order: Vec<SampleId> = (0..n as SampleId).collect();
        order.shuffle(&mut rng_for(spec.seed, 0, stream::PACKAGES));
        let packages = if package_items == 0 {
            Vec::new()
        } else {
            order
                .chunks(package_items)
                .map(<[SampleId]>::to_vec)
                .collect()
        };
        // Two buffers of half the budget each (rounded down) never exceed it.
        let half = capacity.scaled(0.5);
        Ok(Self {
            spec,
            capacity,
            probe,
            source,
            state: Mutex::new(State {
                packages,
                next_package: 0,
                current: Package::empty(half),
                loading: Package::empty(half),
                queue: VecDeque::new(),
                done: vec![false; n],
                served: 0,
                rng: rng_for(spec.seed, 0, stream::POLICY),
                stats: EpochStats::default(),
            }),
        })
    }

    /// Loads the next package into the loading buffer.
    fn load_next(&self, st: &mut State) -> Result<(), CacheError> {
        if st.packages.is_empty() {
            return Ok(());
        }
        let ids = st.packages[st.next_package].clone();
        st.next_package = (st.next_package + 1) % st.packages.len();
        for id in ids {
            let sample = self.source.fetch(id)?;
            st.stats.background_fetches += 1;
            if st.loading.store.insert(id, sample) {
                st.loading.pos.insert(id, st.loading.ids.len());
                st.loading.ids.push(id);
            }
        }
        Ok(())
    }

    /// Serves the loaded package once the current one is used up, and
    /// starts loading the one after it.
    fn rotate_if_drained(&self, st: &mut State) -> Result<(), CacheError> {
        if !st.current.ids.is_empty() || st.loading.ids.is_empty() {
            return Ok(());
        }
        std::mem::swap(&mut st.current, &mut st.loading);
        self.load_next(st)
    }
}

impl CachePolicy for Quiver {
    fn name(&self) -> &'static str {
        "quiver"
    }

    fn spec(&self) -> TrainingSpec {
        self.spec
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn usage(&self) -> Capacity {
        let st = self.state.lock();
        let (a, b) = (st.current.store.usage(), st.loading.store.usage());
        Capacity::new(a.items + b.items, a.bytes + b.bytes)
    }

    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.stats = EpochStats::start(epoch);
        st.queue = uniform_order(&self.spec, epoch).into();
        st.done.fill(false);
        st.served = 0;
        if st.current.ids.is_empty() && st.loading.ids.is_empty() {
            self.load_next(st)?;
            self.rotate_if_drained(st)?;
        }
        Ok(())
    }

    fn next_batch(&self) -> Option<Vec<SampleId>> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let want = self.spec.batch_size.min(self.spec.num_samples - st.served);
        if want == 0 {
            return None;
        }
        let mut probed = Vec::with_capacity(self.probe);
        while probed.len() < self.probe {
            match st.queue.pop_front() {
                Some(id) if !st.done[id as usize] => probed.push(id),
                Some(_) => {}
                None => break,
            }
        }
        let (mut batch, unused): (Vec<SampleId>, Vec<SampleId>) = probed
            .into_iter()
            .partition(|id| st.current.pos.contains_key(id));
        let unused: Vec<SampleId> = batch
            .split_off(batch.len().min(want))
            .into_iter()
            .chain(unused)
            .collect();
        // The shortfall goes out as requests for probed-but-absent ids; the
        // cache answers them with random cached items, and the ids stay queued.
        let shortfall = want - batch.len();
        batch.extend(unused.iter().take(shortfall));
        st.queue.extend(unused);
        st.served += batch.len();
        (!batch.is_empty()).then_some(batch)
    }

    fn lookup(&self, id: SampleId, _label: Label) -> Result<Answer, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        self.rotate_if_drained(st)?;
        let answer = if let Some(s) = st.current.take(id) {
            st.done[id as usize] = true;
            Answer::Hit(s.data)
        } else if st.current.ids.is_empty() {
            st.done[id as usize] = true;
            Answer::Miss
        } else {
            let served = st.current.ids[st.rng.random_range(0..st.current.ids.len())];
            let s = st.current.take(served).expect("picked from the package");
            Answer::Substitute {
                served,
                label: s.label,
                label_source: LabelSource::Served,
                data: s.data,
            }
        };
        st.stats.count(&answer);
        Ok(answer)
    }

    fn admit(&self, id: SampleId, _sample: Sample) -> Result<bool, CacheError> {
        check_id(id, self.spec.num_samples)?;
        Ok(false)
    }

    fn end_epoch(&self, _val_accuracy: Option<f64>) -> Result<EpochStats, CacheError> {
        let mut st = self.state.lock();
        Ok(st.stats.roll_over())
    }
}
