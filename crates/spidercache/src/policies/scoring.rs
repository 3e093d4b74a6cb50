//! SpiderCache's scoring round (index update, kNN query, neighbourhood scan,
//! score) and the worker thread that runs rounds beside training.

use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::ann::{AnnConfig, AnnIndex};
use crate::api::{Label, SampleId};
use crate::error::CacheError;
use crate::score::{ScoreVariant, scan_neighbours};

/// The embeddings of one reported batch, queued for a scoring round.
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
    pub(crate) decay: f64,
    pub(crate) threshold: f64,
    pub(crate) variant: ScoreVariant,
    pub(crate) norm: f64,
    pub(crate) propagate: bool,
}

/// What a round produced, to be applied to the policy state.
#[derive(Default)]
pub(crate) struct Outcome {
    /// New weights of the queried samples.
    pub(crate) scores: Vec<(SampleId, f64)>,
    /// (neighbour, score of the sample whose radius it is in), when propagating.
    pub(crate) propagated: Vec<(SampleId, f64)>,
    /// The batch sample with the most same-label neighbours, and those neighbours.
    pub(crate) candidate: Option<(SampleId, Vec<SampleId>)>,
}

/// The index and the labels of the samples in it.
pub(crate) struct Scorer {
    index: Option<AnnIndex>,
    labels: Vec<Option<Label>>,
}

impl Scorer {
    pub(crate) fn new(num_samples: usize) -> Self {
        Self {
            index: None,
            labels: vec![None; num_samples],
        }
    }

    pub(crate) fn index_len(&self) -> usize {
        self.index.as_ref().map_or(0, AnnIndex::len)
    }

    pub(crate) fn index_memory(&self) -> usize {
        self.index.as_ref().map_or(0, AnnIndex::memory_bytes)
    }

    /// Indexes the job's embeddings (replacing older ones), then, if asked,
    /// queries each, scans its radius and scores it.
    pub(crate) fn run(&mut self, job: &Job, p: &ScanParams) -> Result<Outcome, CacheError> {
        let index = match &mut self.index {
            Some(index) => index,
            slot => slot.insert(AnnIndex::new(job.dim, p.ann)?),
        };
        let rows = job.ids.len();
        let row = |r: usize| &job.embeddings[r * job.dim..(r + 1) * job.dim];
        for r in 0..rows {
            self.labels[job.ids[r] as usize] = Some(job.labels[r]);
            index.upsert(job.ids[r], row(r))?;
        }
        let mut out = Outcome::default();
        if !job.score {
            return Ok(out);
        }
        let labels = &self.labels;
        for r in 0..rows {
            let (id, label) = (job.ids[r], job.labels[r]);
            let found = index.search(row(r), p.k)?;
            let hood = scan_neighbours(
                id,
                label,
                &found,
                |n| labels.get(n as usize).copied().flatten(),
                p.decay,
                p.threshold,
            );
            let score = p.variant.score(hood.same.len(), hood.other.len(), p.norm);
            out.scores.push((id, score));
            if p.propagate {
                out.propagated
                    .extend(hood.same.iter().chain(&hood.other).map(|&n| (n, score)));
            }
            let best = out.candidate.as_ref().map_or(0, |(_, list)| list.len());
            if hood.same.len() > best {
                out.candidate = Some((id, hood.same));
            }
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
