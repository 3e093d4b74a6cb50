//! The remote-storage model: every miss reads the sample from the PipeStore
//! over HTTP, then pays an injected per-miss latency and a bandwidth cap
//! (a token bucket), like the artifact's `time.sleep` per miss.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use spidercache::{CacheError, Sample, SampleId, SampleSource};

use crate::data::{Dataset, PipeStoreClient};

/// How slow the remote storage is, on top of the real loopback read.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StorageModel {
    /// Latency added to every read.
    pub latency: Duration,
    /// Bandwidth cap in bytes per second; `None` for no cap.
    pub bandwidth: Option<u64>,
}

/// A token bucket: `rate` bytes per second, bursts up to `burst` bytes.
/// Taking more than is available goes into debt, paid back by waiting.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket, as of `now`.
    pub fn new(rate: u64, burst: u64, now: Instant) -> Self {
        Self {
            rate: rate.max(1) as f64,
            burst: burst as f64,
            tokens: burst as f64,
            last: now,
        }
    }

    /// Takes `bytes` at time `now`; returns how long the caller must wait
    /// before the transfer counts as done.
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// Counters of the reads that went to storage.
#[derive(Debug, Default)]
pub struct ReadCounters {
    /// Reads.
    pub reads: AtomicU64,
    /// Bytes read.
    pub bytes: AtomicU64,
    /// Nanoseconds spent reading, injected delays included.
    pub nanos: AtomicU64,
}

impl ReadCounters {
    /// Reads, bytes and time so far.
    pub fn snapshot(&self) -> (u64, u64, Duration) {
        (
            self.reads.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
        )
    }
}

/// The training set on remote storage: sample id `i` is the `i`-th training
/// photo of the [`Dataset`].
pub struct RemoteStore {
    client: PipeStoreClient,
    dataset: Arc<Dataset>,
    model: StorageModel,
    bucket: Option<Mutex<TokenBucket>>,
    /// Reads made by the training loop after a miss.
    pub trainer: ReadCounters,
    /// Reads a policy made on its own through [`SampleSource`].
    pub policy: ReadCounters,
}

impl RemoteStore {
    /// Storage over `dataset`'s training photos behind `client`.
    pub fn new(client: PipeStoreClient, dataset: Arc<Dataset>, model: StorageModel) -> Self {
        // One burst is 10 ms worth of bandwidth.
        let bucket = model
            .bandwidth
            .map(|rate| Mutex::new(TokenBucket::new(rate, rate / 100, Instant::now())));
        Self {
            client,
            dataset,
            model,
            bucket,
            trainer: ReadCounters::default(),
            policy: ReadCounters::default(),
        }
    }

    /// Reads training sample `id` for the training loop.
    pub fn fetch_for_trainer(&self, id: SampleId) -> Result<Sample, CacheError> {
        self.read(id, &self.trainer)
    }

    fn read(&self, id: SampleId, counters: &ReadCounters) -> Result<Sample, CacheError> {
        let started = Instant::now();
        let item = self
            .dataset
            .train
            .get(id as usize)
            .ok_or(CacheError::UnknownSample {
                id,
                num_samples: self.dataset.train.len(),
            })?;
        let data: Bytes = self
            .client
            .photo(item.photo_id)
            .map_err(|e| CacheError::Source {
                id,
                reason: e.to_string(),
            })?
            .into();
        let mut wait = self.model.latency;
        if let Some(bucket) = &self.bucket {
            wait += bucket.lock().take(data.len() as u64, Instant::now());
        }
        std::thread::sleep(wait);
        counters.reads.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        counters
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(Sample {
            label: item.label,
            data,
        })
    }
}

impl SampleSource for RemoteStore {
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError> {
        self.read(id, &self.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_passes_a_burst_then_paces_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 100, t0);
        assert_eq!(b.take(100, t0), Duration::ZERO);
        // 500 bytes with an empty bucket: half a second at 1000 B/s.
        assert_eq!(b.take(500, t0), Duration::from_millis(500));
        // Half a second later the debt is paid; 250 ms more buys 250 bytes
        // (capped by the 100-byte burst).
        let later = t0 + Duration::from_millis(750);
        assert_eq!(b.take(100, later), Duration::ZERO);
        assert_eq!(b.take(50, later), Duration::from_millis(50));
    }

    #[test]
    fn bucket_never_stores_more_than_a_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 20, t0);
        let wait = b.take(40, t0 + Duration::from_secs(100));
        assert_eq!(wait, Duration::from_secs(2));
    }
}
