//! A small synthetic dataset and a training-loop driver shared by the tests.

use std::sync::Arc;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use spidercache::{
    Answer, BatchReport, CachePolicy, EpochStats, LabelSource, MemorySource, Sample, SampleId,
    SampleSource,
};

/// Samples with labels, payloads of varied size, and embeddings in which
/// every label forms a few tight clusters of near-duplicates.
pub(crate) struct Dataset {
    pub(crate) samples: Vec<Sample>,
    pub(crate) embeddings: Vec<Vec<f32>>,
    pub(crate) source: Arc<MemorySource>,
}

pub(crate) const DIM: usize = 8;

impl Dataset {
    pub(crate) fn clustered(n: usize, labels: u32, seed: u64) -> Self {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let centres: Vec<Vec<f32>> = (0..labels * 3)
            .map(|_| (0..DIM).map(|_| rng.random_range(-20.0..20.0)).collect())
            .collect();
        let mut samples = Vec::new();
        let mut embeddings = Vec::new();
        for i in 0..n {
            let label = (i as u32) % labels;
            let len = rng.random_range(10..200);
            samples.push(Sample {
                label,
                data: Bytes::from(vec![i as u8; len]),
            });
            let centre = &centres[(label * 3 + rng.random_range(0..3)) as usize];
            embeddings.push(
                centre
                    .iter()
                    .map(|c| c + rng.random_range(-0.2..0.2))
                    .collect(),
            );
        }
        let source = Arc::new(MemorySource::new(samples.clone()));
        Self {
            samples,
            embeddings,
            source,
        }
    }

    pub(crate) fn source(&self) -> Arc<dyn SampleSource> {
        self.source.clone()
    }

    /// Reports `ids` as trained, with their embeddings and a loss per id.
    pub(crate) fn report(
        &self,
        policy: &dyn CachePolicy,
        ids: &[SampleId],
        loss: impl Fn(SampleId) -> f32,
    ) {
        let labels: Vec<u32> = ids
            .iter()
            .map(|&id| self.samples[id as usize].label)
            .collect();
        let embeddings: Vec<f32> = ids
            .iter()
            .flat_map(|&id| self.embeddings[id as usize].clone())
            .collect();
        let losses: Vec<f32> = ids.iter().map(|&id| loss(id)).collect();
        policy
            .report_batch(&BatchReport {
                ids,
                labels: &labels,
                embeddings: &embeddings,
                dim: DIM,
                losses: &losses,
            })
            .unwrap();
    }

    /// Runs one epoch the way a trainer would, checking after every call that
    /// the budget holds and that every substitute's label is the right one.
    /// Returns the stats and every batch served.
    pub(crate) fn run_epoch(
        &self,
        policy: &dyn CachePolicy,
        epoch: u32,
        accuracy: f64,
    ) -> (EpochStats, Vec<Vec<SampleId>>) {
        policy.begin_epoch(epoch).unwrap();
        let mut batches = Vec::new();
        while let Some(ids) = policy.next_batch() {
            for &id in &ids {
                let wanted = &self.samples[id as usize];
                match policy.lookup(id, wanted.label).unwrap() {
                    Answer::Hit(data) => {
                        assert_eq!(data, wanted.data, "{}: hit bytes", policy.name())
                    }
                    Answer::Substitute {
                        served,
                        label,
                        label_source,
                        data,
                    } => {
                        let real = &self.samples[served as usize];
                        assert_eq!(data, real.data, "{}: served bytes", policy.name());
                        match label_source {
                            LabelSource::Requested => {
                                assert_eq!(label, wanted.label, "{}: label kept", policy.name());
                                assert_eq!(
                                    real.label,
                                    wanted.label,
                                    "{}: same-label rep",
                                    policy.name()
                                );
                            }
                            LabelSource::Served => {
                                assert_eq!(label, real.label, "{}", policy.name())
                            }
                        }
                    }
                    Answer::Miss => {
                        policy.admit(id, wanted.clone()).unwrap();
                    }
                }
                assert!(
                    policy.usage().within(policy.capacity()),
                    "{}: usage {:?} over {:?}",
                    policy.name(),
                    policy.usage(),
                    policy.capacity()
                );
            }
            self.report(policy, &ids, |id| {
                ((id * 7919) % 101) as f32 / 10.0 + 1.0 / (epoch + 1) as f32
            });
            batches.push(ids);
        }
        let stats = policy.end_epoch(Some(accuracy)).unwrap();
        assert!(policy.usage().within(policy.capacity()));
        (stats, batches)
    }
}
