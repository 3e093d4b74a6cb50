//! Bytes counted at the transport: a gRPC channel that counts every body byte it sends and
//! receives (the gRPC frames: each message's 5-byte prefix and its encoding), so that a report
//! of bytes on the wire is what crossed the channel, not what the application meant to send.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{Bytes, Service, http};
use tonic::transport::Channel;

/// Body bytes sent and received over the channels that share it.
#[derive(Debug, Default)]
pub struct ByteCounter {
    sent: AtomicU64,
    received: AtomicU64,
}

impl ByteCounter {
    /// Bytes of request bodies sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Bytes of response bodies received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// A [`Channel`] whose body bytes are counted into a shared [`ByteCounter`].
#[derive(Debug, Clone)]
pub struct CountedChannel {
    inner: Channel,
    counter: Arc<ByteCounter>,
}

impl CountedChannel {
    /// `inner`, counted into `counter`.
    pub fn new(inner: Channel, counter: Arc<ByteCounter>) -> Self {
        CountedChannel { inner, counter }
    }
}

impl Service<http::Request<Body>> for CountedChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<Body>, tonic::transport::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let counter = self.counter.clone();
        let request = request.map(|body| {
            Body::new(Counting {
                inner: body,
                counter: counter.clone(),
                direction: Direction::Sent,
            })
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::new(Counting {
                    inner: body,
                    counter,
                    direction: Direction::Received,
                })
            }))
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Sent,
    Received,
}

/// A body that adds the length of each data frame to its counter.
struct Counting {
    inner: Body,
    counter: Arc<ByteCounter>,
    direction: Direction,
}

impl tonic::codegen::Body for Counting {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let total = match this.direction {
                Direction::Sent => &this.counter.sent,
                Direction::Received => &this.counter.received,
            };
            total.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
