//! A request body that must arrive at a minimum average rate: a body that trickles (a few
//! bytes a second, each piece within the idle deadline) would otherwise hold its connection
//! and decode slot for hours.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use hyper::body::{Body, Buf, Frame, SizeHint};

/// Boxed error of a body, as hyper and axum take it.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error of a body that arrived too slowly.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body arrived at {rate} bytes/s over {secs} s, under the minimum of {min} \
     bytes/s (min_body_rate)"
)]
pub struct BodyTooSlow {
    rate: u64,
    secs: u64,
    min: u64,
}

/// `inner`, failed with [`BodyTooSlow`] when, past `grace` since it was first read, fewer
/// than `min_rate` bytes a second on average have arrived (0: no minimum). The clock starts
/// at the first read, so that time a request waits in the server before its body is read is
/// not held against the client.
#[derive(Debug)]
pub struct MinRateBody<B> {
    inner: B,
    min_rate: u64,
    grace: Duration,
    started: Option<Instant>,
    received: u64,
}

impl<B> MinRateBody<B> {
    /// `inner` with a minimum rate of `min_rate` bytes/s checked after `grace`.
    pub fn new(inner: B, min_rate: u64, grace: Duration) -> Self {
        MinRateBody {
            inner,
            min_rate,
            grace,
            started: None,
            received: 0,
        }
    }

    /// The error when the body is behind its minimum rate now.
    fn behind(&self, started: Instant) -> Option<BodyTooSlow> {
        let elapsed = started.elapsed();
        if self.min_rate == 0 || elapsed <= self.grace {
            return None;
        }
        let due = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
        (self.received < due).then(|| BodyTooSlow {
            rate: (self.received as f64 / elapsed.as_secs_f64()) as u64,
            secs: elapsed.as_secs(),
            min: self.min_rate,
        })
    }
}

impl<B> Body for MinRateBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let Some(frame) = frame else {
            return Poll::Ready(None);
        };
        let frame = frame.map_err(Into::into)?;
        if let Some(data) = frame.data_ref() {
            self.received = self.received.saturating_add(data.remaining() as u64);
            if !self.inner.is_end_stream()
                && let Some(slow) = self.behind(started)
            {
                return Poll::Ready(Some(Err(slow.into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `pieces` pieces of `size` bytes, each ready at once.
    struct Pieces {
        left: usize,
        size: usize,
    }

    impl Body for Pieces {
        type Data = hyper::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            self.left -= 1;
            Poll::Ready(Some(Ok(Frame::data(vec![0u8; self.size].into()))))
        }
    }

    fn poll(body: &mut MinRateBody<Pieces>) -> Option<Result<usize, String>> {
        let waker = std::task::Waker::noop();
        match Pin::new(body).poll_frame(&mut Context::from_waker(waker)) {
            Poll::Ready(Some(Ok(f))) => Some(Ok(f.into_data().map_or(0, |d| d.len()))),
            Poll::Ready(Some(Err(e))) => Some(Err(e.to_string())),
            Poll::Ready(None) => None,
            Poll::Pending => unreachable!("the test body is always ready"),
        }
    }

    #[test]
    fn a_body_behind_the_minimum_past_the_grace_fails() {
        let mut body = MinRateBody::new(Pieces { left: 3, size: 16 }, 1024, Duration::ZERO);
        body.started = Some(Instant::now() - Duration::from_secs(10));
        let err = poll(&mut body).unwrap().unwrap_err();
        assert!(err.contains("min_body_rate"), "{err}");
    }

    #[test]
    fn within_the_grace_or_fast_enough_or_without_a_minimum_it_passes() {
        let within = MinRateBody::new(Pieces { left: 3, size: 16 }, 1024, Duration::from_secs(60));
        let fast = MinRateBody::new(
            Pieces {
                left: 3,
                size: 1 << 20,
            },
            1024,
            Duration::ZERO,
        );
        let unlimited = MinRateBody::new(Pieces { left: 3, size: 1 }, 0, Duration::ZERO);
        for mut body in [within, fast, unlimited] {
            body.started = Some(Instant::now() - Duration::from_secs(1));
            let mut total = 0;
            while let Some(piece) = poll(&mut body) {
                total += piece.unwrap();
            }
            assert!(total > 0);
        }
    }
}
