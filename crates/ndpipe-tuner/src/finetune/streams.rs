//! The job's event channel: every feature stream (a node's own, or a take-over) forwarded as
//! [`Msg`]s, with the trainer's results on the same channel; and the re-fetch of a damaged chunk.

use std::future::Future;

use ndpipe_proto::pb::{self, extract_event::Event};
use tokio::sync::mpsc;
use tonic::{Response, Status, Streaming};

use super::trainer::TrainedRun;
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

/// What the job hears.
pub(crate) enum Msg {
    /// An event of a stream.
    Event(Source, Event),
    /// A stream failed (or could not be opened).
    Failed(Source, String),
    /// A stream ended.
    Ended(Source),
    /// The trainer finished a run.
    Trained(Result<TrainedRun, TunerError>),
}

/// Streams node `i`'s features for the job into `tx`.
pub(crate) fn spawn_extract(
    i: usize,
    node: &Node,
    request: pb::ExtractRequest,
    tx: mpsc::Sender<Msg>,
) {
    let mut client = node.client();
    let opened = async move { client.extract(request).await };
    tokio::spawn(open_stream(Source::Node(i), opened, tx));
}

/// Streams the features of take-over `k`, which `node` computes, into `tx`.
pub(crate) fn spawn_takeover(
    k: usize,
    node: &Node,
    request: pb::TakeOverRequest,
    tx: mpsc::Sender<Msg>,
) {
    let mut client = node.client();
    let opened = async move { client.take_over(request).await };
    tokio::spawn(open_stream(Source::TakeOver(k), opened, tx));
}

/// Opens a stream and passes its events to the job until it ends.
async fn open_stream(
    source: Source,
    opened: impl Future<Output = Result<Response<Streaming<pb::ExtractEvent>>, Status>>,
    tx: mpsc::Sender<Msg>,
) {
    let mut stream = match opened.await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            let _ = tx.send(Msg::Failed(source, e.message().to_string())).await;
            return;
        }
    };
    loop {
        let msg = match stream.message().await {
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
    node.client()
        .fetch_chunk(pb::FetchChunkRequest {
            job_id: job_id.to_string(),
            part: chunk.part,
            run: chunk.run,
            seq: chunk.seq,
        })
        .await
        .map(Response::into_inner)
        .map_err(|e| node_error(node, format!("re-fetching a chunk failed: {}", e.message())))
}

/// Bytes of a chunk's payload, labels and ids.
pub(crate) fn wire_bytes(c: &pb::FeatureChunk) -> u64 {
    (c.features.len() + c.labels.len() * 4 + c.photo_ids.len() * 8) as u64
}
