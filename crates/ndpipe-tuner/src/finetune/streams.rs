//! The job's event channel: every feature stream (a node's own, or a take-over) forwarded as
//! [`Msg`]s, each watched: a stream silent for longer than its node's timeout fails, naming the
//! node, so a stalled node (SIGSTOP, a black-holed network) never hangs the job. And the
//! re-fetch of a damaged chunk, within the node's deadline.

use ndpipe_proto::pb::{self, extract_event::Event};
use tokio::sync::mpsc;

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

/// Streams node `i`'s features for the job into `tx`.
pub(crate) fn spawn_extract(
    i: usize,
    node: &Node,
    request: pb::ExtractRequest,
    tx: mpsc::Sender<Msg>,
) {
    let node = node.clone();
    tokio::spawn(async move {
        let opened = node
            .open(request, |mut c, r| async move { c.extract(r).await })
            .await;
        forward(Source::Node(i), &node, opened, tx).await;
    });
}

/// Streams the features of take-over `k`, which `node` computes, into `tx`.
pub(crate) fn spawn_takeover(
    k: usize,
    node: &Node,
    request: pb::TakeOverRequest,
    tx: mpsc::Sender<Msg>,
) {
    let node = node.clone();
    tokio::spawn(async move {
        let opened = node
            .open(request, |mut c, r| async move { c.take_over(r).await })
            .await;
        forward(Source::TakeOver(k), &node, opened, tx).await;
    });
}

/// Passes the events of an opened stream to the job until it ends, fails or falls silent.
async fn forward(
    source: Source,
    node: &Node,
    opened: Result<tonic::Streaming<pb::ExtractEvent>, tonic::Status>,
    tx: mpsc::Sender<Msg>,
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
