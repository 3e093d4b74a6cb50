//! The process's own counters over time, for the storage page: every [`EVERY`] a sample of
//! the store's counters is kept in a ring of at most `console_history_samples`, the oldest
//! dropped first, so the page can draw ingest and label rates without a metrics server.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use crate::api::http::FrontState;
use crate::metrics::StoreMetrics;

/// How often the counters are sampled.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// Milliseconds since the Unix epoch.
    pub(crate) at_ms: i64,
    /// Photos accepted so far.
    pub(crate) uploads: u64,
    /// Bytes accepted so far.
    pub(crate) upload_bytes: u64,
    /// Photos labelled at ingest so far.
    pub(crate) labelled: u64,
    /// Photos deleted so far.
    pub(crate) deletes: u64,
    /// Live photos.
    pub(crate) photos: i64,
    /// Photo ids waiting for labels.
    pub(crate) label_backlog: i64,
}

impl Sample {
    /// The counters of `metrics` now.
    fn of(metrics: &StoreMetrics) -> Self {
        Sample {
            at_ms: ndpipe_util::time::now_ms(),
            uploads: metrics.uploads.get(),
            upload_bytes: metrics.upload_bytes.get(),
            labelled: metrics.labelled.get(),
            deletes: metrics.deletes.get(),
            photos: metrics.photos.get(),
            label_backlog: metrics.label_backlog.get(),
        }
    }
}

/// Per second between two samples: photos ingested, photos labelled, bytes ingested.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Rate {
    /// The later sample's time, in seconds since the Unix epoch (uPlot's x).
    pub(crate) at: f64,
    pub(crate) ingest: f64,
    pub(crate) label: f64,
    pub(crate) bytes: f64,
}

impl Rate {
    fn between(a: &Sample, b: &Sample) -> Self {
        let secs = ((b.at_ms - a.at_ms) as f64 / 1000.0).max(1e-3);
        let per = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
        Rate {
            at: b.at_ms as f64 / 1000.0,
            ingest: per(a.uploads, b.uploads),
            label: per(a.labelled, b.labelled),
            bytes: per(a.upload_bytes, b.upload_bytes),
        }
    }
}

/// The ring of samples.
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
    capacity: usize,
}

impl History {
    /// An empty ring of at most `capacity` samples (at least 2: a rate needs two).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        History {
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    /// Keeps `sample`, dropping the oldest when full.
    pub(crate) fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() == self.capacity {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().copied().collect()
    }

    /// The rates between consecutive samples, oldest first.
    pub(crate) fn rates(&self) -> Vec<Rate> {
        let samples = self.samples();
        samples
            .windows(2)
            .map(|w| Rate::between(&w[0], &w[1]))
            .collect()
    }

    /// A ring of `capacity` samples of `front`'s counters, sampled from now on.
    pub(crate) fn sampling(front: &FrontState, capacity: usize) -> Arc<Self> {
        let ring = Arc::new(History::new(capacity));
        ring.sample_every(front.counters());
        ring
    }

    /// Samples `metrics` into the ring every [`EVERY`] while the ring is in use (the task
    /// ends once the console that holds it is gone).
    pub(crate) fn sample_every(self: &Arc<Self>, metrics: Arc<StoreMetrics>) {
        let ring: Weak<History> = Arc::downgrade(self);
        self.push(Sample::of(&metrics));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(ring) = ring.upgrade() else { break };
                ring.push(Sample::of(&metrics));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: i64, uploads: u64, labelled: u64) -> Sample {
        Sample {
            at_ms,
            uploads,
            upload_bytes: uploads * 100,
            labelled,
            deletes: 0,
            photos: uploads as i64,
            label_backlog: 0,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_rates_are_per_second() {
        let ring = History::new(3);
        for (i, (up, lab)) in [(0, 0), (10, 4), (30, 4), (40, 24)].into_iter().enumerate() {
            ring.push(sample(i as i64 * 2000, up, lab));
        }
        let kept: Vec<u64> = ring.samples().iter().map(|s| s.uploads).collect();
        assert_eq!(kept, vec![10, 30, 40], "the oldest goes first");
        let rates = ring.rates();
        assert_eq!(rates.len(), 2);
        assert_eq!((rates[0].ingest, rates[0].label), (10.0, 0.0));
        assert_eq!((rates[1].ingest, rates[1].label), (5.0, 10.0));
        assert_eq!(rates[1].bytes, 500.0);
        assert_eq!(rates[1].at, 6.0);
    }

    #[tokio::test]
    async fn a_first_sample_is_taken_at_once() {
        let metrics = Arc::new(StoreMetrics::default());
        metrics.uploads.inc();
        let ring = Arc::new(History::new(4));
        ring.sample_every(metrics);
        assert_eq!(ring.samples().len(), 1);
        assert_eq!(ring.samples()[0].uploads, 1);
    }
}
