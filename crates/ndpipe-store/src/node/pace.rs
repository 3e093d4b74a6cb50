//! A job's pace on a node: the request's throttle (images/s) and bandwidth cap (bytes/s), over
//! everything the node sends for the job, its own stream and any take-over, from the moment
//! the job was planned.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ndpipe_util::sync::lock;

/// The throttle and the bandwidth cap of a job on this node.
#[derive(Debug)]
pub(super) struct Pace {
    start: Instant,
    images: Meter,
    bytes: Meter,
}

/// Units booked against a rate (no limit unless the rate is a positive number).
#[derive(Debug)]
struct Meter {
    per_second: f64,
    booked: Mutex<f64>,
}

impl Pace {
    /// At most `images_per_second` images and `bytes_per_second` bytes (0: no limit).
    pub(super) fn new(images_per_second: f64, bytes_per_second: f64) -> Self {
        Pace {
            start: Instant::now(),
            images: Meter::new(images_per_second),
            bytes: Meter::new(bytes_per_second),
        }
    }

    /// Books `images` images and `bytes` bytes; when they may be sent (`None`: now).
    pub(super) fn book(&self, images: usize, bytes: usize) -> Option<Instant> {
        let due = |m: &Meter, units: usize| m.book(units).map(|d| self.start + d);
        due(&self.images, images).max(due(&self.bytes, bytes))
    }

    /// Blocks until `images` and `bytes` more fit under the limits.
    pub(super) fn wait(&self, images: usize, bytes: usize) {
        if let Some(due) = self.book(images, bytes) {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
    }
}

impl Meter {
    fn new(per_second: f64) -> Self {
        Meter {
            per_second: if per_second.is_finite() {
                per_second
            } else {
                0.0
            },
            booked: Mutex::new(0.0),
        }
    }

    /// Books `units`; the time since the start at which they fit under the rate.
    fn book(&self, units: usize) -> Option<Duration> {
        if self.per_second <= 0.0 {
            return None;
        }
        let mut booked = lock(&self.booked);
        *booked += units as f64;
        Some(Duration::from_secs_f64(*booked / self.per_second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_sharing_a_pace_share_its_rate() {
        // 10 images/s: 50 images booked by two streams are due 5 s after the start.
        let pace = Pace::new(10.0, 0.0);
        let first = pace.book(25, 1_000_000).unwrap();
        assert_eq!(first - pace.start, Duration::from_millis(2500));
        assert_eq!(
            pace.book(25, 0).unwrap() - pace.start,
            Duration::from_secs(5)
        );
        // The later of the two limits counts.
        let capped = Pace::new(1.0, 1000.0);
        assert_eq!(
            capped.book(1, 3000).unwrap() - capped.start,
            Duration::from_secs(3)
        );
        assert_eq!(
            capped.book(4, 0).unwrap() - capped.start,
            Duration::from_secs(5)
        );
        assert!(Pace::new(0.0, f64::NAN).book(10, 10).is_none(), "no limit");
    }
}
