//! SHADE: its settings and the policy.

use parking_lot::Mutex;

use crate::api::{
    Answer, BatchReport, CachePolicy, Capacity, Label, Sample, SampleId, TrainingSpec, check_id,
};
use crate::error::CacheError;
use crate::importance_cache::ImportanceCache;
use crate::sampler::{EpochCursor, ImportanceSampler, ImportanceSamplerConfig, accuracy_gate};
use crate::stats::EpochStats;

/// SHADE's constants.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadeConfig {
    /// The shared importance sampler's settings.
    pub sampler: ImportanceSamplerConfig,
    /// Weight of a sample never trained (SHADE's init_fac).
    pub initial_weight: f64,
    /// The k-th smallest loss of a batch (from 0) gets weight ln(k + rank_offset).
    pub rank_offset: f64,
    /// ls_param starts at this fraction of epoch 0's mean loss.
    pub ls_factor: f64,
}

impl Default for ShadeConfig {
    fn default() -> Self {
        Self {
            sampler: ImportanceSamplerConfig::default(),
            initial_weight: 1.0,
            rank_offset: 10.0,
            ls_factor: 0.01,
        }
    }
}

/// The weights SHADE gives one batch: ascending loss rank k gets ln(k + offset).
pub(crate) fn rank_weights(losses: &[f32], offset: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..losses.len()).collect();
    order.sort_by(|&a, &b| losses[a].total_cmp(&losses[b]));
    let mut weights = vec![0.0; losses.len()];
    for (rank, &row) in order.iter().enumerate() {
        weights[row] = (rank as f64 + offset).ln();
    }
    weights
}

struct State {
    weights: Vec<f64>,
    cache: ImportanceCache,
    cursor: EpochCursor,
    val_history: Vec<f64>,
    ls_param: f64,
    loss_sum: f64,
    loss_count: u64,
    previous_mean_loss: Option<f64>,
    stats: EpochStats,
}

/// SHADE (FAST'23): loss-rank importance, the importance sampler and the
/// (score, frequency) priority cache with a ghost table. No substitution.
pub struct Shade {
    config: ShadeConfig,
    spec: TrainingSpec,
    capacity: Capacity,
    sampler: ImportanceSampler,
    state: Mutex<State>,
}

impl Shade {
    /// A SHADE cache of `capacity` for `spec`'s run.
    pub fn new(
        config: ShadeConfig,
        spec: TrainingSpec,
        capacity: Capacity,
    ) -> Result<Self, CacheError> {
        let sampler = ImportanceSampler::new(config.sampler.clone(), spec)?;
        let n = spec.num_samples;
        Ok(Self {
            state: Mutex::new(State {
                weights: vec![config.initial_weight; n],
                cache: ImportanceCache::new(capacity, n, config.initial_weight),
                cursor: EpochCursor::default(),
                val_history: Vec::new(),
                ls_param: 0.0,
                loss_sum: 0.0,
                loss_count: 0,
                previous_mean_loss: None,
                stats: EpochStats::default(),
            }),
            config,
            spec,
            capacity,
            sampler,
        })
    }

    /// The current importance weight of `id` (without ls_param).
    pub fn weight(&self, id: SampleId) -> Option<f64> {
        self.state.lock().weights.get(id as usize).copied()
    }

    /// The current loss-smoothing term added to every weight when sampling.
    pub fn ls_param(&self) -> f64 {
        self.state.lock().ls_param
    }
}

impl CachePolicy for Shade {
    fn name(&self) -> &'static str {
        "shade"
    }

    fn spec(&self) -> TrainingSpec {
        self.spec
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn usage(&self) -> Capacity {
        self.state.lock().cache.usage()
    }

    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let sampling: Vec<f64> = st.weights.iter().map(|w| w + st.ls_param).collect();
        let pads = accuracy_gate(&st.val_history, self.config.sampler.gate_window);
        let order = self
            .sampler
            .epoch_order(epoch, &sampling, pads, |id| st.cache.contains(id));
        st.cursor = EpochCursor::new(order, self.spec.batch_size);
        st.stats = EpochStats::start(epoch);
        st.loss_sum = 0.0;
        st.loss_count = 0;
        Ok(())
    }

    fn next_batch(&self) -> Option<Vec<SampleId>> {
        self.state.lock().cursor.next_batch()
    }

    fn lookup(&self, id: SampleId, _label: Label) -> Result<Answer, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut st = self.state.lock();
        let answer = st
            .cache
            .get(id)
            .map_or(Answer::Miss, |s| Answer::Hit(s.data.clone()));
        st.stats.count(&answer);
        Ok(answer)
    }

    fn admit(&self, id: SampleId, sample: Sample) -> Result<bool, CacheError> {
        check_id(id, self.spec.num_samples)?;
        let mut st = self.state.lock();
        let (inserted, evicted) = st.cache.admit(id, sample);
        st.stats.admitted += u64::from(inserted);
        st.stats.evictions += evicted;
        Ok(inserted)
    }

    fn report_batch(&self, batch: &BatchReport<'_>) -> Result<(), CacheError> {
        batch.validate(self.spec.num_samples)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let ranked = rank_weights(batch.losses, self.config.rank_offset);
        for (&id, w) in batch.ids.iter().zip(ranked) {
            st.weights[id as usize] = w;
        }
        let weights = &st.weights;
        st.cache
            .record_trained(batch.ids, |id| weights[id as usize]);
        st.loss_sum += batch.losses.iter().map(|&l| f64::from(l)).sum::<f64>();
        st.loss_count += batch.losses.len() as u64;
        Ok(())
    }

    fn end_epoch(&self, val_accuracy: Option<f64>) -> Result<EpochStats, CacheError> {
        let mut st = self.state.lock();
        st.val_history.extend(val_accuracy);
        if st.loss_count > 0 {
            let mean = st.loss_sum / st.loss_count as f64;
            st.ls_param = match st.previous_mean_loss {
                None => self.config.ls_factor * mean,
                Some(prev) if prev > 0.0 => st.ls_param * ((mean - prev) / prev).exp(),
                Some(_) => st.ls_param,
            };
            st.previous_mean_loss = Some(mean);
        }
        Ok(st.stats.roll_over())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_weights_are_log_of_rank_plus_ten() {
        let w = rank_weights(&[0.5, 0.1, 2.0], 10.0);
        assert!((w[1] - 10f64.ln()).abs() < 1e-12);
        assert!((w[0] - 11f64.ln()).abs() < 1e-12);
        assert!((w[2] - 12f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn ls_param_starts_at_a_hundredth_of_the_mean_loss_and_tracks_it() {
        let spec = TrainingSpec {
            num_samples: 4,
            batch_size: 4,
            seed: 1,
        };
        let shade = Shade::new(ShadeConfig::default(), spec, Capacity::new(2, 100)).unwrap();
        let ids = [0, 1, 2, 3];
        fn report<'a>(ids: &'a [SampleId], losses: &'a [f32]) -> BatchReport<'a> {
            BatchReport {
                ids,
                labels: &[0; 4],
                embeddings: &[],
                dim: 0,
                losses,
            }
        }
        shade.begin_epoch(0).unwrap();
        shade.report_batch(&report(&ids, &[2.0; 4])).unwrap();
        shade.end_epoch(Some(0.1)).unwrap();
        assert!((shade.ls_param() - 0.02).abs() < 1e-12);
        shade.begin_epoch(1).unwrap();
        shade.report_batch(&report(&ids, &[1.0; 4])).unwrap();
        shade.end_epoch(Some(0.2)).unwrap();
        assert!((shade.ls_param() - 0.02 * (-0.5f64).exp()).abs() < 1e-12);
    }
}
