//! The trainer-facing contract: sample types, answers, batch reports and the
//! [`CachePolicy`] trait every policy implements.

use bytes::Bytes;

use crate::error::CacheError;
use crate::stats::EpochStats;

/// A sample's id. Ids are dense: every policy is built for a dataset of
/// `num_samples` samples with ids `0..num_samples`.
pub type SampleId = u64;

/// A class label.
pub type Label = u32;

/// One sample as the storage holds it: its label and its opaque encoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The sample's own class label.
    pub label: Label,
    /// The encoded payload (an image file, a feature vector...), opaque to the cache.
    pub data: Bytes,
}

/// Where a policy can read samples by itself, for work that happens off the
/// training path: SpiderCache loads homophily representatives, iCache streams
/// its substitution buffer and Quiver loads its packages through it.
pub trait SampleSource: Send + Sync {
    /// Reads one sample from storage.
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError>;
}

/// A [`SampleSource`] over samples held in memory, indexed by id. Useful for
/// trace replay and tests.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    samples: Vec<Sample>,
}

impl MemorySource {
    /// Wraps samples; sample `i` has id `i`.
    pub fn new(samples: Vec<Sample>) -> Self {
        Self { samples }
    }
}

impl SampleSource for MemorySource {
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.samples.get(i))
            .cloned()
            .ok_or(CacheError::Source {
                id,
                reason: "no such sample in memory".into(),
            })
    }
}

/// A size budget, in items and in bytes. A cache never holds more of either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Maximum number of cached samples.
    pub items: usize,
    /// Maximum total payload bytes.
    pub bytes: u64,
}

impl Capacity {
    /// A budget of `items` samples and `bytes` payload bytes.
    pub fn new(items: usize, bytes: u64) -> Self {
        Self { items, bytes }
    }

    /// This budget scaled by `fraction` (clamped to `0..=1`), rounded down.
    pub fn scaled(self, fraction: f64) -> Self {
        let f = fraction.clamp(0.0, 1.0);
        Self {
            items: (self.items as f64 * f).floor() as usize,
            bytes: (self.bytes as f64 * f).floor() as u64,
        }
    }

    /// What is left of this budget after `used` is taken out.
    pub fn minus(self, used: Capacity) -> Self {
        Self {
            items: self.items.saturating_sub(used.items),
            bytes: self.bytes.saturating_sub(used.bytes),
        }
    }

    /// Whether `self` fits inside `limit` in both dimensions.
    pub fn within(self, limit: Capacity) -> bool {
        self.items <= limit.items && self.bytes <= limit.bytes
    }
}

/// Which label the trainer must use for a substituted sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelSource {
    /// The requested sample's label (SpiderCache's homophily substitute: the
    /// served sample is a same-label near-duplicate).
    Requested,
    /// The served sample's own label (iCache's and Quiver's substitutes: the
    /// served sample is arbitrary).
    Served,
}

/// The cache's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The requested sample's own bytes.
    Hit(Bytes),
    /// Another sample's bytes, served in place of the requested one.
    Substitute {
        /// The id whose bytes are served.
        served: SampleId,
        /// The label to train with.
        label: Label,
        /// Whether `label` is the requested or the served sample's label.
        label_source: LabelSource,
        /// The served bytes.
        data: Bytes,
    },
    /// Not cached: the caller reads it from storage and offers it back with
    /// [`CachePolicy::admit`].
    Miss,
}

/// What the trainer reports after each optimizer step, one row per requested
/// id in request order. A row answered by a substitute holds the served
/// sample's embedding and loss; the policy that substituted files it under
/// the served id (it remembers what it served since the last report).
#[derive(Debug, Clone, Copy)]
pub struct BatchReport<'a> {
    /// The ids trained, one per row.
    pub ids: &'a [SampleId],
    /// Their labels, as trained.
    pub labels: &'a [Label],
    /// Row-major `ids.len() x dim` penultimate-layer embeddings; may be empty
    /// (with `dim == 0`) for policies that do not use them.
    pub embeddings: &'a [f32],
    /// Embedding width.
    pub dim: usize,
    /// Per-sample training losses.
    pub losses: &'a [f32],
}

impl BatchReport<'_> {
    /// Checks that the slices agree in length and every id is in range.
    pub fn validate(&self, num_samples: usize) -> Result<(), CacheError> {
        let n = self.ids.len();
        if self.labels.len() != n || self.losses.len() != n {
            return Err(CacheError::MalformedBatch(format!(
                "{n} ids but {} labels and {} losses",
                self.labels.len(),
                self.losses.len()
            )));
        }
        if self.embeddings.len() != n * self.dim {
            return Err(CacheError::MalformedBatch(format!(
                "{} embedding values for {n} ids of dim {}",
                self.embeddings.len(),
                self.dim
            )));
        }
        self.ids
            .iter()
            .try_for_each(|&id| check_id(id, num_samples))
    }

    /// The embedding row of the `row`-th sample.
    pub fn embedding(&self, row: usize) -> &[f32] {
        &self.embeddings[row * self.dim..(row + 1) * self.dim]
    }
}

/// Fails unless `id` is in `0..num_samples`.
pub(crate) fn check_id(id: SampleId, num_samples: usize) -> Result<(), CacheError> {
    if (id as u128) < num_samples as u128 {
        Ok(())
    } else {
        Err(CacheError::UnknownSample { id, num_samples })
    }
}

/// The training run a policy serves: the same for every policy in a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainingSpec {
    /// Dataset size; sample ids are `0..num_samples`.
    pub num_samples: usize,
    /// Samples per minibatch.
    pub batch_size: usize,
    /// Seed of every random choice the policy makes.
    pub seed: u64,
}

impl TrainingSpec {
    /// Checks that the spec can drive a sampler.
    pub fn validate(&self) -> Result<(), CacheError> {
        if self.num_samples == 0 || self.batch_size == 0 {
            return Err(CacheError::InvalidConfig(
                "num_samples and batch_size must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// A caching policy together with the sampler that orders its epochs.
///
/// One epoch goes: [`begin_epoch`](Self::begin_epoch); then, until
/// [`next_batch`](Self::next_batch) returns `None`, look every id of the batch
/// up, fetch each [`Answer::Miss`] from storage and [`admit`](Self::admit) it,
/// train, and [`report_batch`](Self::report_batch); finally
/// [`end_epoch`](Self::end_epoch) with the validation accuracy.
///
/// Every method takes `&self`: policies lock internally and are `Send + Sync`.
pub trait CachePolicy: Send + Sync {
    /// A short name for tables and plots.
    fn name(&self) -> &'static str;
    /// The training run the policy was built for.
    fn spec(&self) -> TrainingSpec;
    /// The total budget the policy was built with.
    fn capacity(&self) -> Capacity;
    /// What the policy holds right now; always within [`capacity`](Self::capacity).
    fn usage(&self) -> Capacity;
    /// Prepares epoch `epoch` (counted from 0): draws its sample order.
    fn begin_epoch(&self, epoch: u32) -> Result<(), CacheError>;
    /// The ids of the next minibatch, or `None` when the epoch is over.
    fn next_batch(&self) -> Option<Vec<SampleId>>;
    /// Answers one request for sample `id`, whose label is `label`.
    fn lookup(&self, id: SampleId, label: Label) -> Result<Answer, CacheError>;
    /// Offers a sample fetched after a miss; returns whether it was cached.
    fn admit(&self, id: SampleId, sample: Sample) -> Result<bool, CacheError>;
    /// Feeds back what was trained in the last step. The default only
    /// validates the report; policies that learn from it override this and
    /// validate first.
    fn report_batch(&self, batch: &BatchReport<'_>) -> Result<(), CacheError> {
        batch.validate(self.spec().num_samples)
    }
    /// Closes the epoch; `val_accuracy` (0..=1) drives accuracy-gated policies.
    fn end_epoch(&self, val_accuracy: Option<f64>) -> Result<EpochStats, CacheError>;
}
