//! The plain baselines' shared shape: a uniform shuffle every epoch, exact
//! hits only, and a [`Replacement`] rule that picks eviction victims.

use parking_lot::Mutex;

use crate::api::{Answer, CachePolicy, Capacity, Label, Sample, SampleId, TrainingSpec, check_id};
use crate::error::CacheError;
use crate::sampler::{EpochCursor, uniform_order};
use crate::stats::EpochStats;
use crate::store::Store;

/// The bookkeeping of a classic replacement rule (LRU, LFU, static fill...).
pub trait Replacement: Send + Default + 'static {
    /// The policy's name.
    const NAME: &'static str;
    /// Whether misses are offered to the cache at all.
    const ADMITS: bool = true;
    /// A cached id was hit.
    fn on_hit(&mut self, id: SampleId);
    /// An id was inserted.
    fn on_insert(&mut self, id: SampleId);
    /// Picks the next victim and forgets it; `None` means "never evict".
    fn pop_victim(&mut self) -> Option<SampleId>;
}

struct State<R> {
    store: Store,
    rule: R,
    cursor: EpochCursor,
    stats: EpochStats,
}

/// A uniformly-sampled cache with replacement rule `R`.
pub struct UniformPolicy<R: Replacement> {
    spec: TrainingSpec,
    capacity: Capacity,
    state: Mutex<State<R>>,
}

impl<R: Replacement> UniformPolicy<R> {
    /// A cache of `capacity` for `spec`'s training run.
    pub fn new(spec: TrainingSpec, capacity: Capacity) -> Result<Self, CacheError> {
        spec.validate()?;
        Ok(Self {
            spec,
            capacity,
            state: Mutex::new(State {
                store: Store::new(capacity),
                rule: R::default(),
                cursor: EpochCursor::default(),
                stats: EpochStats::default(),
            }),
        })
    }

    /// Whether `id` is cached right now.
    pub fn contains(&self, id: SampleId) -> bool {
        self.state.lock().store.contains(id)
    }
}

impl<R: Replacement> CachePolicy for UniformPolicy<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }

    fn spec(&self) -> TrainingSpec {
        self.spec
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn usage(&self) -> Capacity {
        self.state.lock().store.usage()
    }

    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError> {
        let mut st = self.state.lock();
        st.cursor = EpochCursor::new(uniform_order(&self.spec, epoch), self.spec.batch_size);
        st.stats = EpochStats::start(epoch);
        Ok(())
    }

    fn next_batch(&self) -> Option<Vec<SampleId>> {
        self.state.lock().cursor.next_batch()
    }

    fn lookup(&self, id: SampleId, _label: Label) -> Result<Answer, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let answer = match st.store.get(id) {
            Some(s) => {
                st.rule.on_hit(id);
                Answer::Hit(s.data.clone())
            }
            None => Answer::Miss,
        };
        st.stats.count(&answer);
        Ok(answer)
    }

    fn admit(&self, id: SampleId, sample: Sample) -> Result<bool, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let len = sample.data.len();
        if !R::ADMITS || st.store.contains(id) || !st.store.could_hold(len) {
            return Ok(false);
        }
        while !st.store.fits(len) {
            let Some(victim) = st.rule.pop_victim() else {
                return Ok(false);
            };
            st.store.remove(victim);
            st.stats.evictions += 1;
        }
        st.store.insert(id, sample);
        st.rule.on_insert(id);
        st.stats.admitted += 1;
        Ok(true)
    }

    fn end_epoch(&self, _val_accuracy: Option<f64>) -> Result<EpochStats, CacheError> {
        let mut st = self.state.lock();
        Ok(st.stats.roll_over())
    }
}
