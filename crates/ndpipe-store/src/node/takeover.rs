//! Take-over: a fast node extracts photos that a slow node gave away (load balancing), from the
//! slow node's stored tensors fetched over gRPC, and streams the features as its own chunks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ndpipe_model::{InferenceBackend, extract_features};
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::pb::{self, extract_event::Event};
use ndpipe_proto::transport::{self, ClusterSecret};
use ndpipe_proto::{Features, encode_chunk};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::extract::Events;
use super::{MAX_MESSAGE, NodeError, PipeStoreNode};
use crate::inference::backbone::decode_tensor;

impl PipeStoreNode {
    /// Starts extracting `req.photos` from the tensors of the node at `req.source_url`,
    /// `req.chunk_size` per chunk numbered from `req.first_seq`, each fetch within
    /// `req.timeout_ms` (0: [`DEFAULT_PEER_TIMEOUT`]); returns the stream of chunks, then a done
    /// event.
    pub(crate) async fn take_over(&self, req: pb::TakeOverRequest) -> Result<Events, NodeError> {
        if req.chunk_size == 0 {
            return Err(NodeError::InvalidArgument(
                "chunk_size must be at least 1".into(),
            ));
        }
        let channel = transport::channel(&req.source_url, self.tls.as_ref()).map_err(|e| {
            NodeError::Peer {
                what: "cannot reach",
                url: req.source_url.clone(),
                reason: e.to_string(),
            }
        })?;
        let source = PipeStoreClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        let backbone = self.backbone();
        let secret = self.secret.clone();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            if let Err(e) = stream(source, backbone, secret, &req, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(rx)
    }
}

/// How long a take-over waits for the node it takes photos from, when the Tuner does not say.
pub(crate) const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// Fetches, extracts and sends the photos of `req` chunk by chunk; returns early, cleanly, when
/// the receiver is gone.
async fn stream(
    mut source: PipeStoreClient<Channel>,
    backbone: Arc<dyn InferenceBackend>,
    secret: Option<ClusterSecret>,
    req: &pb::TakeOverRequest,
    tx: &mpsc::Sender<Result<pb::ExtractEvent, NodeError>>,
) -> Result<(), NodeError> {
    let started = Instant::now();
    let deadline = match req.timeout_ms {
        0 => DEFAULT_PEER_TIMEOUT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    let mut done = 0u64;
    for (k, photos) in req.photos.chunks(req.chunk_size as usize).enumerate() {
        let ids: Vec<u64> = photos.iter().map(|p| p.id).collect();
        let peer = |reason: String| NodeError::Peer {
            what: "fetching tensors from",
            url: req.source_url.clone(),
            reason,
        };
        let request = transport::request(
            pb::GetTensorsRequest { ids: ids.clone() },
            Some(deadline),
            secret.as_ref(),
        );
        let blobs = transport::unary(deadline, source.get_tensors(request))
            .await
            .map_err(|e| peer(e.message().to_string()))?
            .tensors;
        if blobs.len() != ids.len() {
            return Err(peer(format!(
                "{} tensors for {} photos",
                blobs.len(),
                ids.len()
            )));
        }
        let backbone = backbone.clone();
        let labels: Vec<u32> = photos.iter().map(|p| p.label).collect();
        let features = tokio::task::spawn_blocking(move || -> Result<Features, NodeError> {
            let tensors = ids
                .iter()
                .zip(&blobs)
                .map(|(id, blob)| decode_tensor(*id, blob))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Features {
                values: extract_features(&*backbone, &tensors)?,
                dim: backbone.info().feature_dim,
                labels,
                photo_ids: ids,
            })
        })
        .await
        .map_err(|e| NodeError::Task(e.to_string()))??;
        done += features.len() as u64;
        let seq = req.first_seq + k as u32;
        let chunk = encode_chunk(pb::Part::Train, req.run, seq, &features);
        let event = pb::ExtractEvent {
            event: Some(Event::Chunk(chunk)),
        };
        if tx.send(Ok(event)).await.is_err() {
            return Ok(());
        }
    }
    let _ = tx
        .send(Ok(pb::ExtractEvent {
            event: Some(Event::Done(pb::ExtractDone {
                images: done,
                seconds: started.elapsed().as_secs_f64(),
                extracted: done,
                deleted: 0,
            })),
        }))
        .await;
    Ok(())
}
