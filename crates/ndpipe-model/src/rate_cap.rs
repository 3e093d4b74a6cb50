//! A model whose throughput is capped, to emulate a slower accelerator: N PipeStores on one
//! machine, each capped at a rate the machine can serve N times over, behave like N machines of
//! that rate. The cap is a device of its own: one batch runs at a time, and a batch of `n`
//! images takes at least `n / rate` seconds, whatever the real model took.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::{InferenceBackend, ModelError, ModelInfo, Outputs};
use crate::tensor::ImageTensor;

/// `inner`, at most `images_per_second` images per second over all its callers.
pub struct RateCapped {
    inner: Arc<dyn InferenceBackend>,
    images_per_second: f64,
    /// Held while a batch runs: the emulated device does one batch at a time.
    device: Mutex<()>,
}

impl RateCapped {
    /// Caps `inner` at `images_per_second` (> 0).
    pub fn new(inner: Arc<dyn InferenceBackend>, images_per_second: f64) -> Self {
        RateCapped {
            inner,
            images_per_second,
            device: Mutex::new(()),
        }
    }

    /// The least time a batch of `n` images takes.
    fn floor(&self, n: usize) -> Duration {
        Duration::from_secs_f64(n as f64 / self.images_per_second)
    }
}

impl InferenceBackend for RateCapped {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn health(&self) -> Result<(), ModelError> {
        self.inner.health()
    }

    fn run(&self, batch: &[ImageTensor]) -> Result<Outputs, ModelError> {
        let _device = self.device.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let outputs = self.inner.run(batch)?;
        if let Some(rest) = self.floor(batch.len()).checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        Ok(outputs)
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::FakeBackend;

    #[test]
    fn a_batch_is_given_its_share_of_a_second_and_the_same_outputs() {
        let fake: Arc<dyn InferenceBackend> = Arc::new(FakeBackend::new(8, 3));
        let capped = RateCapped::new(fake.clone(), 200.0);
        let batch: Vec<ImageTensor> = (0..4u8)
            .map(|i| ImageTensor::new(224, 224, 3, vec![i; 224 * 224 * 3]).unwrap())
            .collect();
        assert_eq!(capped.floor(4), Duration::from_millis(20));
        assert_eq!(capped.floor(0), Duration::ZERO);
        let a = capped.run(&batch).unwrap();
        let b = capped.run(&batch).unwrap();
        let want = fake.run(&batch).unwrap();
        assert_eq!(a.features(0), want.features(0));
        assert_eq!(b.logits(3), want.logits(3));
    }
}
