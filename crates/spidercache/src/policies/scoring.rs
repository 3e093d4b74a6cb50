//! SpiderCache's scoring round (index update, kNN query, radius update,
//! neighbourhood scan, score) and the worker thread that runs rounds beside
//! training.

use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::ann::{AnnConfig, AnnIndex};
use crate::api::{Label, SampleId};
use crate::error::CacheError;
use crate::radius::{Radius, RadiusTracker};
use crate::score::{ScoreVariant, scan_neighbours};

/// The embeddings of one reported batch, queued for a scoring round, under
/// the ids actually trained (a substitute's row under the served sample).
pub(crate) struct Job {
    pub(crate) ids: Vec<SampleId>,
    pub(crate) labels: Vec<Label>,
    pub(crate) embeddings: Vec<f32>,
    pub(crate) dim: usize,
    /// Query and score after indexing (false in epoch 0: index only).
    pub(crate) score: bool,
}

/// The scan's constants.
pub(crate) struct ScanParams {
    pub(crate) ann: AnnConfig,
    pub(crate) k: usize,
    pub(crate) normalize: bool,
    pub(crate) variant: ScoreVariant,
    pub(crate) norm: f64,
    pub(crate) propagate: bool,
    /// Same-label neighbours kept per homophily candidate (nearest first).
    pub(crate) max_neighbours: usize,
}

/// What a round produced, to be applied to the policy state.
#[derive(Default)]
pub(crate) struct Outcome {
    /// New weights of the queried samples.
    pub(crate) scores: Vec<(SampleId, f64)>,
    /// (same, other) neighbour counts of each queried sample, in `scores` order.
    pub(crate) counts: Vec<(usize, usize)>,
    /// (neighbour, score of the sample whose radius it is in), when propagating.
    pub(crate) propagated: Vec<(SampleId, f64)>,
    /// Every queried sample with its nearest same-label neighbours (at most
    /// `max_neighbours`; empty when it has none): homophily candidates.
    pub(crate) candidates: Vec<(SampleId, Vec<SampleId>)>,
    /// The squared radius the round used.
    pub(crate) radius_d2: f64,
}

/// The index, the labels of the samples in it and the radius in force.
pub(crate) struct Scorer {
    index: Option<AnnIndex>,
    labels: Vec<Option<Label>>,
    radius: RadiusTracker,
}

/// Scales `row` to unit length (a zero row stays zero).
fn normalized(row: &[f32]) -> Vec<f32> {
    let len = row.iter().map(|v| v * v).sum::<f32>().sqrt();
    if len > 0.0 {
        row.iter().map(|v| v / len).collect()
    } else {
        row.to_vec()
    }
}

impl Scorer {
    pub(crate) fn new(num_samples: usize, radius: Radius) -> Self {
        Self {
            index: None,
            labels: vec![None; num_samples],
            radius: RadiusTracker::new(radius),
        }
    }

    pub(crate) fn index_len(&self) -> usize {
        self.index.as_ref().map_or(0, AnnIndex::len)
    }

    pub(crate) fn index_memory(&self) -> usize {
        self.index.as_ref().map_or(0, AnnIndex::memory_bytes)
    }

    /// Indexes the job's embeddings (replacing older ones), then, if asked,
    /// queries each, updates the radius from their nearest neighbours, scans
    /// each radius and scores.
    pub(crate) fn run(&mut self, job: &Job, p: &ScanParams) -> Result<Outcome, CacheError> {
        let index = match &mut self.index {
            Some(index) => index,
            slot => slot.insert(AnnIndex::new(job.dim, p.ann)?),
        };
        let rows: Vec<Vec<f32>> = job
            .embeddings
            .chunks(job.dim.max(1))
            .map(|r| {
                if p.normalize {
                    normalized(r)
                } else {
                    r.to_vec()
                }
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            self.labels[job.ids[r] as usize] = Some(job.labels[r]);
            index.upsert(job.ids[r], row)?;
        }
        let mut out = Outcome::default();
        if !job.score {
            return Ok(out);
        }
        let found = rows
            .iter()
            .map(|row| index.search(row, p.k))
            .collect::<Result<Vec<_>, _>>()?;
        for (r, hits) in found.iter().enumerate() {
            if let Some(&(_, d2)) = hits.iter().find(|&&(n, _)| n != job.ids[r]) {
                self.radius.observe(d2);
            }
        }
        out.radius_d2 = self.radius.squared();
        let labels = &self.labels;
        for (r, hits) in found.iter().enumerate() {
            let (id, label) = (job.ids[r], job.labels[r]);
            let hood = scan_neighbours(
                id,
                label,
                hits,
                |n| labels.get(n as usize).copied().flatten(),
                out.radius_d2,
            );
            let score = p.variant.score(hood.same.len(), hood.other.len(), p.norm);
            out.scores.push((id, score));
            out.counts.push((hood.same.len(), hood.other.len()));
            if p.propagate {
                out.propagated
                    .extend(hood.same.iter().chain(&hood.other).map(|&n| (n, score)));
            }
            let mut same = hood.same;
            same.truncate(p.max_neighbours);
            out.candidates.push((id, same));
        }
        Ok(out)
    }
}

enum Msg {
    Run(Job),
    Flush(SyncSender<()>),
}

/// A thread that runs scoring rounds in report order. At most `max_lag`
/// rounds wait in its queue; a further report blocks until one is taken.
pub(crate) struct Worker {
    tx: Option<SyncSender<Msg>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread; `run` handles each job.
    pub(crate) fn spawn(max_lag: usize, run: impl Fn(Job) + Send + 'static) -> Self {
        let (tx, rx) = sync_channel::<Msg>(max_lag);
        let handle = std::thread::Builder::new()
            .name("spidercache-scoring".into())
            .spawn(move || {
                for msg in rx {
                    match msg {
                        Msg::Run(job) => run(job),
                        Msg::Flush(done) => {
                            // The flusher may have given up waiting; nothing to do then.
                            let _ = done.send(());
                        }
                    }
                }
            })
            .expect("spawning the scoring thread");
        Self {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    fn sender(&self) -> Result<&SyncSender<Msg>, CacheError> {
        self.tx.as_ref().ok_or(CacheError::WorkerGone)
    }

    pub(crate) fn submit(&self, job: Job) -> Result<(), CacheError> {
        self.sender()?
            .send(Msg::Run(job))
            .map_err(|_| CacheError::WorkerGone)
    }

    /// Waits until every job submitted so far has been applied.
    pub(crate) fn flush(&self) -> Result<(), CacheError> {
        let (done_tx, done_rx) = sync_channel(1);
        self.sender()?
            .send(Msg::Flush(done_tx))
            .map_err(|_| CacheError::WorkerGone)?;
        done_rx.recv().map_err(|_| CacheError::WorkerGone)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(handle) = self.handle.take() {
            // A panicked worker has already lost its jobs; dropping must not panic too.
            let _ = handle.join();
        }
    }
}
