//! Take-over: a fast node extracts photos that a slow node gave away (load balancing) and
//! streams them as its own chunks, run by run. Each photo's features come from the cheapest
//! place: this node's own copy of the photo (same id and checksum, in a replicated cluster:
//! nothing crosses the network), the slow node's stored features (when the job reads stored
//! features), or the backbone here over the slow node's tensors; features computed here are
//! stored back on the slow node, so that its next job reads them. In conventional mode the
//! tensors themselves are streamed. The job's throttle and bandwidth cap on this node apply.
//! When the node that held the photos was lost (`source_lost`), only copies here are read and
//! nothing is stored back there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndpipe_model::{ImageTensor, extract_features};
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::pb::{self, extract_event::Event};
use ndpipe_proto::transport::{self, ClusterSecret};
use ndpipe_proto::{
    ByteCounter, CountedChannel, Features, Tensors, decode_chunk, encode_chunk, encode_tensor_chunk,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::extract::Events;
use super::pace::Pace;
use super::{MAX_MESSAGE, NodeError, PipeStoreNode};
use crate::inference::InferenceError;
use crate::inference::backbone::{decode_tensor, stored_tensor};

/// How long a take-over waits for the node it takes photos from, when the Tuner does not say.
pub(crate) const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

impl PipeStoreNode {
    /// Starts extracting `req.photos` (in run order) for the node at `req.source_url`,
    /// `req.chunk_size` per chunk numbered from `req.first_seq`, each call to that node within
    /// `req.timeout_ms` (0: [`DEFAULT_PEER_TIMEOUT`]); returns the stream of chunks, a run-ready
    /// event after each run, then a done event.
    pub(crate) async fn take_over(
        self: Arc<Self>,
        mut req: pb::TakeOverRequest,
    ) -> Result<Events, NodeError> {
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
        req.photos.sort_by_key(|p| p.run);
        // This node's pace in the job when it extracts the job too, else the request's.
        let pace = match self.job(&req.job_id) {
            Ok(plan) => plan.pace.clone(),
            Err(_) => Arc::new(Pace::new(
                req.throttle_images_per_second,
                req.bandwidth_bytes_per_second,
            )),
        };
        let peer = Arc::new(ByteCounter::default());
        let job = TakeOver {
            source: PipeStoreClient::new(CountedChannel::new(channel, peer.clone()))
                .max_decoding_message_size(MAX_MESSAGE),
            peer,
            secret: self.secret.clone(),
            deadline: match req.timeout_ms {
                0 => DEFAULT_PEER_TIMEOUT,
                ms => Duration::from_millis(u64::from(ms)),
            },
            node: self,
            pace,
            req,
        };
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            if let Err(e) = job.stream(&tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(rx)
    }

    /// Which of `photos` this node holds a copy of: the same id with the same checksum.
    pub(super) fn copies(&self, photos: &[pb::LabelledPhoto]) -> Result<Vec<bool>, NodeError> {
        photos
            .iter()
            .map(|p| {
                let sha = self.store.sha256(p.id).map_err(InferenceError::from)?;
                Ok(!p.sha256.is_empty() && sha.as_deref() == Some(p.sha256.as_str()))
            })
            .collect()
    }
}

/// A take-over in flight.
struct TakeOver {
    node: Arc<PipeStoreNode>,
    source: PipeStoreClient<CountedChannel>,
    /// Bytes of the calls to the slow node.
    peer: Arc<ByteCounter>,
    secret: Option<ClusterSecret>,
    deadline: Duration,
    pace: Arc<Pace>,
    req: pb::TakeOverRequest,
}

/// Where the photos of a chunk came from.
struct Origins {
    /// This node's own copies.
    copies: usize,
    /// The slow node's stored features.
    stored: usize,
    /// The backbone here.
    computed: usize,
}

/// Where one photo of a chunk comes from.
enum Source {
    /// Stored features; whether this node's own (of its copy), else the slow node's.
    Features(Vec<f32>, bool),
    /// A tensor to ship, or to run the backbone on; whether it is this node's own copy.
    Tensor(ImageTensor, bool),
}

impl TakeOver {
    /// Sends the chunks run by run; returns early, cleanly, when the receiver is gone.
    async fn stream(
        mut self,
        tx: &mpsc::Sender<Result<pb::ExtractEvent, NodeError>>,
    ) -> Result<(), NodeError> {
        let started = Instant::now();
        let send = |event| tx.send(Ok(pb::ExtractEvent { event: Some(event) }));
        let photos = std::mem::take(&mut self.req.photos);
        let mut seq = self.req.first_seq;
        let (mut done, mut computed) = (0u64, 0u64);
        let (mut copies, mut stored) = (0usize, 0usize);
        for run in photos.chunk_by(|a, b| a.run == b.run) {
            let run_started = Instant::now();
            let mut chunks = 0;
            for part in run.chunks(self.req.chunk_size as usize) {
                let (chunk, fresh, from) = self.chunk(part, seq).await?;
                (copies, stored) = (copies + from.copies, stored + from.stored);
                computed += from.computed as u64;
                if let Some(due) = self.pace.book(part.len(), chunk.features.len()) {
                    tokio::time::sleep_until(due.into()).await;
                }
                if send(Event::Chunk(chunk)).await.is_err() {
                    return Ok(());
                }
                self.store_back(fresh).await;
                (seq, chunks, done) = (seq + 1, chunks + 1, done + part.len() as u64);
            }
            let ready = pb::RunReady {
                part: pb::Part::Train as i32,
                run: run[0].run,
                chunks,
                count: run.len() as u64,
                seconds: run_started.elapsed().as_secs_f64(),
            };
            if send(Event::RunReady(ready)).await.is_err() {
                return Ok(());
            }
        }
        info!(job = %self.req.job_id, from = %self.req.source_url, photos = done, copies, stored,
            computed, "take-over done");
        let _ = send(Event::Done(pb::ExtractDone {
            images: done,
            seconds: started.elapsed().as_secs_f64(),
            extracted: computed,
            deleted: 0,
            peer_bytes: self.peer.sent() + self.peer.received(),
        }))
        .await;
        Ok(())
    }

    /// One chunk of `photos` (one run), numbered `seq`; the features it found here or computed,
    /// to store back on the slow node; and where its photos came from.
    async fn chunk(
        &mut self,
        photos: &[pb::LabelledPhoto],
        seq: u32,
    ) -> Result<(pb::FeatureChunk, Features, Origins), NodeError> {
        let node = self.node.clone();
        let (ship_tensors, use_stored) = (self.req.ship_tensors, self.req.use_stored_features);
        let owned = photos.to_vec();
        let local = blocking(move || {
            let copies = node.copies(&owned)?;
            local_sources(&node, &owned, &copies, use_stored && !ship_tensors)
        })
        .await?;
        let remote: Vec<u64> = photos
            .iter()
            .zip(&local)
            .filter(|(_, l)| l.is_none())
            .map(|(p, _)| p.id)
            .collect();
        if self.req.source_lost && !remote.is_empty() {
            let reason =
                format!("no intact copy here of photos {remote:?}, and their node is lost");
            return Err(self.peer("taking photos over from", reason));
        }
        let mut stored = HashMap::new();
        if use_stored && !ship_tensors && !remote.is_empty() {
            stored = self.stored_features(&remote).await?;
        }
        let need: Vec<u64> = remote
            .iter()
            .filter(|id| !stored.contains_key(*id))
            .copied()
            .collect();
        let from_slow = stored.len();
        let mut blobs: HashMap<u64, Vec<u8>> = self.tensors(&need).await?;
        let mut sources = Vec::with_capacity(photos.len());
        for (p, l) in photos.iter().zip(local) {
            sources.push(match l {
                Some(s) => s,
                None => match stored.remove(&p.id) {
                    Some(f) => Source::Features(f, false),
                    None => {
                        let blob = blobs.remove(&p.id).unwrap_or_default();
                        Source::Tensor(decode_tensor(p.id, &blob)?, false)
                    }
                },
            });
        }
        let from = Origins {
            copies: photos.len() - remote.len(),
            stored: from_slow,
            computed: match ship_tensors {
                true => 0,
                false => sources
                    .iter()
                    .filter(|s| matches!(s, Source::Tensor(..)))
                    .count(),
            },
        };
        let node = self.node.clone();
        let (run, photos) = (photos[0].run, photos.to_vec());
        let (chunk, fresh) =
            blocking(move || assemble(&node, run, seq, &photos, sources, ship_tensors)).await?;
        Ok((chunk, fresh, from))
    }

    /// The slow node's stored features of `ids` (those it has).
    async fn stored_features(&mut self, ids: &[u64]) -> Result<HashMap<u64, Vec<f32>>, NodeError> {
        let message = pb::GetFeaturesRequest {
            ids: ids.to_vec(),
            stored_only: true,
        };
        let request = transport::request(message, Some(self.deadline), self.secret.as_ref());
        let chunk = transport::unary(self.deadline, self.source.get_features(request))
            .await
            .map_err(|e| self.peer("fetching features from", e.message().to_string()))?;
        let features = decode_chunk(&chunk, 1)
            .map_err(|e| self.peer("fetching features from", e.to_string()))?;
        let dim = self.node.models.pretrained().info().feature_dim;
        if features.dim != dim && !features.photo_ids.is_empty() {
            let reason = format!("{}-d features, the backbone's are {dim}-d", features.dim);
            return Err(self.peer("fetching features from", reason));
        }
        Ok(features
            .photo_ids
            .iter()
            .copied()
            .zip(features.values.chunks_exact(dim).map(<[f32]>::to_vec))
            .filter(|(id, _)| ids.contains(id))
            .collect())
    }

    /// The slow node's compressed tensors of `ids`.
    async fn tensors(&mut self, ids: &[u64]) -> Result<HashMap<u64, Vec<u8>>, NodeError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let message = pb::GetTensorsRequest { ids: ids.to_vec() };
        let request = transport::request(message, Some(self.deadline), self.secret.as_ref());
        let blobs = transport::unary(self.deadline, self.source.get_tensors(request))
            .await
            .map_err(|e| self.peer("fetching tensors from", e.message().to_string()))?
            .tensors;
        if blobs.len() != ids.len() {
            let reason = format!("{} tensors for {} photos", blobs.len(), ids.len());
            return Err(self.peer("fetching tensors from", reason));
        }
        Ok(ids.iter().copied().zip(blobs).collect())
    }

    /// Stores `features` computed here on the slow node. A failure only costs its next job a
    /// backbone run, so it is logged, not fatal.
    async fn store_back(&mut self, features: Features) {
        if features.photo_ids.is_empty() || self.req.source_lost {
            return;
        }
        let message = pb::PutFeaturesRequest {
            backbone_version: self
                .node
                .models
                .pretrained()
                .info()
                .backbone_version
                .clone(),
            chunk: Some(encode_chunk(pb::Part::Train, 0, 0, &features)),
        };
        let request = transport::request(message, Some(self.deadline), self.secret.as_ref());
        if let Err(e) = transport::unary(self.deadline, self.source.put_features(request)).await {
            warn!(node = %self.req.source_url, photos = features.len(), error = %e.message(),
                "storing taken-over features back failed; its next job computes them again");
        }
    }

    fn peer(&self, what: &'static str, reason: String) -> NodeError {
        NodeError::Peer {
            what,
            url: self.req.source_url.clone(),
            reason,
        }
    }
}

/// For each photo of which this node holds a copy, its source here: stored features when
/// `use_stored` and stored, else the tensor. `None` for the others.
fn local_sources(
    node: &PipeStoreNode,
    photos: &[pb::LabelledPhoto],
    copies: &[bool],
    use_stored: bool,
) -> Result<Vec<Option<Source>>, NodeError> {
    let pretrained = node.models.pretrained();
    let backbone = &pretrained.info().backbone_version;
    photos
        .iter()
        .zip(copies)
        .map(|(p, &copy)| {
            if !copy {
                return Ok(None);
            }
            let stored = if use_stored {
                node.features
                    .get(backbone, p.id)
                    .map_err(InferenceError::from)?
            } else {
                None
            };
            Ok(Some(match stored {
                Some(f) => Source::Features(f, true),
                None => Source::Tensor(stored_tensor(&node.store, p.id)?, true),
            }))
        })
        .collect()
}

/// The wire chunk of `photos` from their `sources`: their tensors when `ship_tensors`, else
/// their features, the missing ones computed here by the backbone (stored here too for the
/// photos this node holds a copy of). Also the features that did not come from the slow node
/// (computed, or of this node's copies), to be stored back there.
fn assemble(
    node: &PipeStoreNode,
    run: u32,
    seq: u32,
    photos: &[pb::LabelledPhoto],
    sources: Vec<Source>,
    ship_tensors: bool,
) -> Result<(pb::FeatureChunk, Features), NodeError> {
    let labels: Vec<u32> = photos.iter().map(|p| p.label).collect();
    let ids: Vec<u64> = photos.iter().map(|p| p.id).collect();
    let backbone = node.backbone();
    let dim = backbone.info().feature_dim;
    let mut fresh = Features {
        values: Vec::new(),
        dim,
        labels: Vec::new(),
        photo_ids: Vec::new(),
    };
    if ship_tensors {
        let mut t = Tensors {
            data: Vec::new(),
            height: 0,
            width: 0,
            labels,
            photo_ids: ids,
        };
        for source in sources {
            if let Source::Tensor(tensor, _) = source {
                (t.height, t.width) = (tensor.height(), tensor.width());
                t.data.extend_from_slice(tensor.data());
            }
        }
        let chunk = encode_tensor_chunk(pb::Part::Train, run, seq, &t);
        return Ok((chunk, fresh));
    }
    let (mut rows, mut tensors) = (Vec::new(), Vec::new());
    for (i, source) in sources.iter().enumerate() {
        if let Source::Tensor(t, copy) = source {
            rows.push((i, *copy));
            tensors.push(t.clone());
        }
    }
    let computed = extract_features(&*backbone, &tensors)?;
    let mut values = vec![0f32; ids.len() * dim];
    for (i, source) in sources.iter().enumerate() {
        if let Source::Features(f, copy) = source {
            values[i * dim..(i + 1) * dim].copy_from_slice(f);
            if *copy {
                fresh.values.extend_from_slice(f);
                fresh.labels.push(labels[i]);
                fresh.photo_ids.push(ids[i]);
            }
        }
    }
    let mut own = Vec::new();
    for (&(i, copy), f) in rows.iter().zip(computed.chunks_exact(dim)) {
        values[i * dim..(i + 1) * dim].copy_from_slice(f);
        fresh.values.extend_from_slice(f);
        fresh.labels.push(labels[i]);
        fresh.photo_ids.push(ids[i]);
        if copy {
            own.push((ids[i], f));
        }
    }
    if !own.is_empty() {
        let version = &backbone.info().backbone_version;
        node.features
            .put_many(version, &own)
            .map_err(InferenceError::from)?;
    }
    let features = Features {
        values,
        dim,
        labels,
        photo_ids: ids,
    };
    Ok((encode_chunk(pb::Part::Train, run, seq, &features), fresh))
}

/// Runs `f` off the async runtime (store, features and the backbone block).
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NodeError> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Task(e.to_string()))?
}
