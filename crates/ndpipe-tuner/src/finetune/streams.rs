//! The job's event channel: every feature stream (a node's own, or a take-over) forwarded as
//! [`Msg`]s, each watched: a stream silent for longer than its node's timeout fails, naming the
//! node, so a stalled node (SIGSTOP, a black-holed network) never hangs the job. The chunks
//! of every stream pass one [`Ingress`] cap, the Tuner's link. And the re-fetch of a damaged
//! chunk, within the node's deadline.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ndpipe_proto::pb::{self, extract_event::Event};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::TunerError;
use crate::nodes::{Node, node_error};

/// Who sent an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// Node `i`'s own extraction stream.
    Node(usize),
    /// Take-over `k` (see `Intake::add_takeover`).
    TakeOver(usize),
}

/// What the job hears from the streams.
pub(crate) enum Msg {
    /// An event of a stream.
    Event(Source, Event),
    /// A stream failed, could not be opened, or fell silent.
    Failed(Source, String),
    /// A stream ended.
    Ended(Source),
}

/// The Tuner's receive cap over every stream of a job, in bytes/s: a chunk is passed on only
/// when the chunks before it, at the cap, would have arrived (no burst). Clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ingress(Option<Arc<Pace>>);

#[derive(Debug)]
struct Pace {
    bytes_per_second: f64,
    /// When the link is free again.
    free_at: Mutex<Instant>,
}

impl Ingress {
    /// A cap of `bytes_per_second`; none unless it is a positive number.
    pub(crate) fn new(bytes_per_second: f64) -> Self {
        let capped = bytes_per_second.is_finite() && bytes_per_second > 0.0;
        Ingress(capped.then(|| {
            Arc::new(Pace {
                bytes_per_second,
                free_at: Mutex::new(Instant::now()),
            })
        }))
    }

    /// Waits until `bytes` more have room on the link.
    async fn admit(&self, bytes: u64) {
        if let Some(done_at) = self.reserve(bytes) {
            tokio::time::sleep_until(done_at).await;
        }
    }

    /// Books `bytes` on the link after what is booked already; when they will have passed
    /// (`None` without a cap).
    fn reserve(&self, bytes: u64) -> Option<Instant> {
        let pace = self.0.as_ref()?;
        let mut free_at = pace.free_at.lock().unwrap_or_else(PoisonError::into_inner);
        let start = (*free_at).max(Instant::now());
        *free_at = start + Duration::from_secs_f64(bytes as f64 / pace.bytes_per_second);
        Some(*free_at)
    }
}

/// Streams node `i`'s features for the job into `tx`, through `ingress`.
pub(crate) fn spawn_extract(
    i: usize,
    node: &Node,
    request: pb::ExtractRequest,
    tx: mpsc::Sender<Msg>,
    ingress: Ingress,
) {
    let node = node.clone();
    tokio::spawn(async move {
        let opened = node
            .open(request, |mut c, r| async move { c.extract(r).await })
            .await;
        forward(Source::Node(i), &node, opened, tx, ingress).await;
    });
}

/// Streams the features of take-over `k`, which `node` computes, into `tx`, through `ingress`.
pub(crate) fn spawn_takeover(
    k: usize,
    node: &Node,
    request: pb::TakeOverRequest,
    tx: mpsc::Sender<Msg>,
    ingress: Ingress,
) {
    let node = node.clone();
    tokio::spawn(async move {
        let opened = node
            .open(request, |mut c, r| async move { c.take_over(r).await })
            .await;
        forward(Source::TakeOver(k), &node, opened, tx, ingress).await;
    });
}

/// Passes the events of an opened stream to the job until it ends, fails or falls silent;
/// chunks wait for room on `ingress`.
async fn forward(
    source: Source,
    node: &Node,
    opened: Result<tonic::Streaming<pb::ExtractEvent>, tonic::Status>,
    tx: mpsc::Sender<Msg>,
    ingress: Ingress,
) {
    let mut stream = match opened {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Msg::Failed(source, e.message().to_string())).await;
            return;
        }
    };
    loop {
        let msg = match node.next(&mut stream).await {
            Ok(Some(pb::ExtractEvent { event: Some(event) })) => Msg::Event(source, event),
            Ok(Some(_)) => continue,
            Ok(None) => Msg::Ended(source),
            Err(e) => Msg::Failed(source, e.message().to_string()),
        };
        if let Msg::Event(_, Event::Chunk(chunk)) = &msg {
            ingress.admit(wire_bytes(chunk)).await;
        }
        let last = !matches!(msg, Msg::Event(..));
        if tx.send(msg).await.is_err() || last {
            return;
        }
    }
}

/// Fetches a chunk of the job again from `node` (its checksum failed).
pub(crate) async fn refetch(
    node: &Node,
    job_id: &str,
    chunk: &pb::FeatureChunk,
) -> Result<pb::FeatureChunk, TunerError> {
    let request = pb::FetchChunkRequest {
        job_id: job_id.to_string(),
        part: chunk.part,
        run: chunk.run,
        seq: chunk.seq,
    };
    node.unary(request, |mut c, r| async move { c.fetch_chunk(r).await })
        .await
        .map_err(|e| node_error(node, format!("re-fetching a chunk failed: {}", e.message())))
}

/// Bytes of a chunk's payload, labels and ids.
pub(crate) fn wire_bytes(c: &pb::FeatureChunk) -> u64 {
    (c.features.len() + c.labels.len() * 4 + c.photo_ids.len() * 8) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_booked_one_after_another_at_the_cap() {
        // 1 MB/s: 100 MB take 100 s, so the second booking comes while the link is busy and
        // follows the first exactly.
        let ingress = Ingress::new(1e6);
        let first = ingress.reserve(100_000_000).unwrap();
        let second = ingress.reserve(500_000).unwrap();
        assert_eq!(second - first, Duration::from_millis(500));
        assert!(Ingress::new(0.0).reserve(1).is_none(), "0 is no cap");
        assert!(Ingress::new(f64::NAN).reserve(1).is_none(), "NaN is no cap");
    }
}
