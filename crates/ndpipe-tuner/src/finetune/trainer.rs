//! The training thread: trains the runs handed to it, in order, on one head, while the job keeps
//! receiving the next runs.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use ndpipe_proto::Features;

use super::cached::{CacheReport, CacheSetup, CachedTraining, RemoteRow};
use crate::{Head, TunerError};

/// The training data of one run: in memory, or by reference (read through a cache).
#[derive(Debug, PartialEq)]
pub(crate) enum RunData {
    /// Row-major features and their labels.
    Memory { values: Vec<f32>, labels: Vec<u32> },
    /// Samples kept on the nodes.
    Remote(Vec<RemoteRow>),
}

impl RunData {
    /// Training rows.
    pub(crate) fn len(&self) -> usize {
        match self {
            RunData::Memory { labels, .. } => labels.len(),
            RunData::Remote(rows) => rows.len(),
        }
    }
}

/// One trained run, as the job's timeline records it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TrainedRun {
    pub(crate) run: usize,
    /// Seconds from the job's start when training of the run began.
    pub(crate) start: f64,
    pub(crate) seconds: f64,
    /// Validation top-1 after the run.
    pub(crate) val_top1: f32,
    /// Mean training objective of the run's last epoch.
    pub(crate) train_loss: f32,
}

/// How the head scores after a run: validation top-1, and the mean training objective
/// (cross-entropy plus penalties) of the run's last epoch (0 for a run without rows).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RunScore {
    pub(crate) val_top1: f32,
    pub(crate) train_loss: f32,
}

impl RunScore {
    /// The score of a run that had no rows to train on.
    pub(crate) fn untrained(head: &Head, val: &Features) -> Result<Self, TunerError> {
        Ok(RunScore {
            val_top1: validate(head, val)?,
            train_loss: 0.0,
        })
    }
}

/// What the training thread starts from.
pub(crate) struct TrainerSetup {
    /// The head, warm-started from the active version or fresh.
    pub(crate) head: Head,
    /// The validation set, evaluated after every run.
    pub(crate) val: Features,
    pub(crate) epochs: usize,
    pub(crate) runs: usize,
    /// The job's start, which timeline seconds count from.
    pub(crate) started: Instant,
    /// Set when the features exceed the memory budget: runs then come as [`RunData::Remote`].
    pub(crate) cache: Option<CacheSetup>,
}

/// The training thread of a job.
pub(crate) struct Trainer {
    runs: mpsc::Sender<(usize, RunData)>,
    thread: JoinHandle<Result<(Head, Option<CacheReport>), TunerError>>,
}

impl Trainer {
    /// Starts the thread; `notify` hears each trained run (or its failure) and returns false when
    /// nobody listens any more, which stops the thread.
    pub(crate) fn spawn(
        setup: TrainerSetup,
        mut notify: impl FnMut(Result<TrainedRun, TunerError>) -> bool + Send + 'static,
    ) -> Result<Self, TunerError> {
        let (runs, rx) = mpsc::channel::<(usize, RunData)>();
        let thread = std::thread::Builder::new()
            .name("ndpipe-train".into())
            .spawn(move || {
                let TrainerSetup {
                    mut head,
                    val,
                    epochs,
                    runs,
                    started,
                    cache,
                } = setup;
                let mut cached = cache.map(|c| CachedTraining::new(c, epochs, runs));
                for (run, data) in rx {
                    let start = started.elapsed().as_secs_f64();
                    let t = Instant::now();
                    let score = match (data, cached.as_mut()) {
                        (RunData::Remote(rows), Some(cached)) => {
                            cached.train_run(&mut head, run, rows, &val)
                        }
                        (RunData::Memory { values, labels }, _) => {
                            train_in_memory(&mut head, &values, &labels, run, runs, epochs, &val)
                        }
                        (RunData::Remote(_), None) => Err(TunerError::Internal(
                            "a run by reference without a cache".into(),
                        )),
                    };
                    let trained = score.map(|score| TrainedRun {
                        run,
                        start,
                        seconds: t.elapsed().as_secs_f64(),
                        val_top1: score.val_top1,
                        train_loss: score.train_loss,
                    });
                    if !notify(trained) {
                        break;
                    }
                }
                Ok((head, cached.map(CachedTraining::into_report)))
            })
            .map_err(|e| TunerError::Internal(format!("cannot start the training thread: {e}")))?;
        Ok(Trainer { runs, thread })
    }

    /// Hands run `run` to the thread.
    pub(crate) fn train(&self, run: usize, data: RunData) -> Result<(), TunerError> {
        self.runs
            .send((run, data))
            .map_err(|_| TunerError::Internal("the training thread stopped".into()))
    }

    /// Waits for the thread to finish the runs it has; returns the trained head and the cache's
    /// figures.
    pub(crate) fn finish(self) -> Result<(Head, Option<CacheReport>), TunerError> {
        drop(self.runs);
        self.thread
            .join()
            .map_err(|_| TunerError::Internal("the training thread panicked".into()))?
    }
}

/// Trains one run on features in memory; returns the validation top-1 after it.
fn train_in_memory(
    head: &mut Head,
    values: &[f32],
    labels: &[u32],
    run: usize,
    runs: usize,
    epochs: usize,
    val: &Features,
) -> Result<RunScore, TunerError> {
    if labels.is_empty() {
        return RunScore::untrained(head, val);
    }
    let report = head.train_run(values, labels, run, runs, epochs)?;
    Ok(RunScore {
        val_top1: validate(head, val)?,
        train_loss: report.losses.last().copied().unwrap_or(0.0),
    })
}

/// Top-1 on the validation set (0 without one).
pub(crate) fn validate(head: &Head, val: &Features) -> Result<f32, TunerError> {
    if val.is_empty() {
        Ok(0.0)
    } else {
        head.evaluate(&val.values, &val.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadConfig;

    #[test]
    fn runs_are_trained_in_order_and_the_head_comes_back() {
        let head = Head::new(HeadConfig {
            input_dim: 2,
            batch: 8,
            ..HeadConfig::new(vec!["a".into(), "b".into()])
        })
        .unwrap();
        let rows = |n: usize| -> (Vec<f32>, Vec<u32>) {
            let labels: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
            let values = labels
                .iter()
                .flat_map(|&l| if l == 0 { [2.0, 0.0] } else { [0.0, 2.0] })
                .collect();
            (values, labels)
        };
        let (values, labels) = rows(16);
        let untrained_loss = head.loss(&values, &labels).unwrap();
        let val = Features {
            values: values.clone(),
            dim: 2,
            labels: labels.clone(),
            photo_ids: (0..16).collect(),
        };
        let (tx, rx) = mpsc::channel();
        let trainer = Trainer::spawn(
            TrainerSetup {
                head,
                val,
                epochs: 30,
                runs: 2,
                started: Instant::now(),
                cache: None,
            },
            move |r| tx.send(r).is_ok(),
        )
        .unwrap();
        for run in 0..2 {
            let (values, labels) = rows(32);
            trainer
                .train(run, RunData::Memory { values, labels })
                .unwrap();
        }
        let (head, cache) = trainer.finish().unwrap();
        let trained: Vec<TrainedRun> = rx.iter().map(Result::unwrap).collect();
        assert_eq!(trained.iter().map(|t| t.run).collect::<Vec<_>>(), [0, 1]);
        assert!(cache.is_none());
        assert_eq!(head.evaluate(&values, &labels).unwrap(), 1.0);
        assert_eq!(trained[1].val_top1, 1.0, "validated after each run");
        assert!(
            trained
                .iter()
                .all(|t| t.train_loss > 0.0 && t.train_loss < untrained_loss),
            "each run reports its last epoch's loss, below the untrained head's {untrained_loss}"
        );
    }
}
