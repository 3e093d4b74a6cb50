//! Feature extraction for the Tuner: the event stream of a job (validation part, then each
//! training run, chunk by chunk), chunks fetched again, features and tensors by id, the tails
//! given away by load balancing, and the features a take-over computed, stored back.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ndpipe_proto::pb::{self, extract_event::Event};
use ndpipe_proto::{Features, Tensors, decode_chunk, encode_chunk, encode_tensor_chunk};
use tokio::sync::mpsc;
use tracing::info;

use super::plan::{ExtractionPlan, Row};
use super::{NodeError, PipeStoreNode};
use crate::inference::InferenceError;
use crate::inference::backbone::{FeatureSource, stored_blob, stored_tensor};

/// The events of an extraction, as the stream sends them.
pub(crate) type Events = mpsc::Receiver<Result<pb::ExtractEvent, NodeError>>;

impl PipeStoreNode {
    /// The features of `rows` under `backbone` (the served one when `None`, else one a rollout
    /// staged): stored ones when allowed, the rest computed (and stored). Returns the features
    /// and how many were computed.
    fn features(
        &self,
        rows: &[Row],
        use_stored: bool,
        backbone: Option<&str>,
    ) -> Result<(Features, usize), NodeError> {
        let ids: Vec<u64> = rows.iter().map(|r| r.0).collect();
        let backbone = match backbone {
            Some(sha) if sha != self.backbone().info().backbone_version => {
                self.staged_model(sha)?.backend
            }
            _ => self.backbone(),
        };
        let source = FeatureSource {
            store: &self.store,
            features: &self.features,
            backend: &*backbone,
        };
        let (values, computed) = source.features(&ids, use_stored)?;
        Ok((
            Features {
                values,
                dim: backbone.info().feature_dim,
                labels: rows.iter().map(|r| r.1).collect(),
                photo_ids: ids,
            },
            computed,
        ))
    }

    /// One wire chunk of `rows`: features (computing missing ones), or u8 tensors in
    /// conventional mode. Returns the chunk and how many features the backbone computed.
    fn chunk(
        &self,
        plan: &ExtractionPlan,
        part: pb::Part,
        run: u32,
        seq: u32,
        rows: &[Row],
    ) -> Result<(pb::FeatureChunk, usize), NodeError> {
        if !plan.ship_tensors {
            let (features, computed) =
                self.features(rows, plan.use_stored, plan.backbone.as_deref())?;
            return Ok((encode_chunk(part, run, seq, &features), computed));
        }
        let mut data = Vec::new();
        let (mut height, mut width) = (0, 0);
        for (id, _) in rows {
            let t = stored_tensor(&self.store, *id)?;
            (height, width) = (t.height(), t.width());
            data.extend_from_slice(t.data());
        }
        let tensors = Tensors {
            data,
            height,
            width,
            labels: rows.iter().map(|r| r.1).collect(),
            photo_ids: rows.iter().map(|r| r.0).collect(),
        };
        Ok((encode_tensor_chunk(part, run, seq, &tensors), 0))
    }

    /// Plans job `req.job_id` (kept for re-fetches and load balancing) and starts extracting it
    /// on its own thread; returns the stream of its events. Blocks (catalog): call it off the
    /// async runtime.
    pub(crate) fn start_extraction(
        self: Arc<Self>,
        req: pb::ExtractRequest,
    ) -> Result<Events, NodeError> {
        let plan = Arc::new(ExtractionPlan::new(&req, &*self.catalog, &self.duplicates)?);
        self.keep_plan(&req.job_id, plan.clone());
        info!(job = %req.job_id, val = plan.val.len(), train = plan.train.len(), runs = req.runs, "extraction starts");
        let (tx, rx) = mpsc::channel(8);
        std::thread::Builder::new()
            .name("ndpipe-extract".into())
            .spawn(move || self.extract(&req, &plan, &tx))
            .map_err(|e| NodeError::Task(format!("starting the extraction thread: {e}")))?;
        Ok(rx)
    }

    /// Extracts a job's parts and runs in order, sending chunks, throughput and run boundaries;
    /// stops when the receiver is gone or a chunk fails (the error is the last event).
    fn extract(
        &self,
        req: &pb::ExtractRequest,
        plan: &ExtractionPlan,
        tx: &mpsc::Sender<Result<pb::ExtractEvent, NodeError>>,
    ) {
        let send = |event: Event| {
            tx.blocking_send(Ok(pb::ExtractEvent { event: Some(event) }))
                .is_ok()
        };
        let started = Instant::now();
        let total = (plan.val.len() + plan.train.len()) as u64;
        let mut done = 0u64;
        let mut extracted = 0u64;
        let mut deleted = 0u64;
        let parts = std::iter::once((pb::Part::Val, 0))
            .chain((0..plan.plan.runs() as u32).map(|k| (pb::Part::Train, k)));
        for (part, run) in parts {
            let run_started = Instant::now();
            let mut chunks = 0;
            let mut count = 0u64;
            let mut cursor = 0;
            while let Some((seq, planned)) = plan.take_chunk(part, run, &mut cursor) {
                let rows = self.live(planned);
                deleted += (planned.len() - rows.len()) as u64;
                count += rows.len() as u64;
                let (mut chunk, computed) = match self.chunk(plan, part, run, seq, &rows) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                };
                extracted += computed as u64;
                done += planned.len() as u64;
                plan.pace.wait(planned.len(), chunk.features.len());
                let damage = self
                    .corrupt_chunks
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if damage && !chunk.features.is_empty() {
                    chunk.features[0] ^= 0x55;
                }
                if !send(Event::Chunk(chunk)) {
                    return;
                }
                chunks += 1;
                let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
                if !send(Event::Throughput(pb::Throughput {
                    images_per_second: rate,
                    done,
                    total,
                })) {
                    return;
                }
            }
            let ready = pb::RunReady {
                part: part as i32,
                run,
                chunks,
                count,
                seconds: run_started.elapsed().as_secs_f64(),
            };
            if !send(Event::RunReady(ready)) {
                return;
            }
        }
        if deleted > 0 {
            info!(job = %req.job_id, deleted, "photos deleted during the job were left out");
        }
        send(Event::Done(pb::ExtractDone {
            images: done - deleted,
            seconds: started.elapsed().as_secs_f64(),
            extracted,
            deleted,
            peer_bytes: 0,
        }));
    }

    /// `rows` without the photos deleted since the job was planned.
    fn live(&self, rows: &[Row]) -> Vec<Row> {
        rows.iter()
            .filter(|(id, _)| self.store.contains(*id).unwrap_or(true))
            .copied()
            .collect()
    }

    /// A chunk of a started job, again (its checksum failed on the Tuner).
    pub(crate) fn fetch_chunk(
        &self,
        req: &pb::FetchChunkRequest,
    ) -> Result<pb::FeatureChunk, NodeError> {
        let plan = self.job(&req.job_id)?;
        let part = pb::Part::try_from(req.part)
            .map_err(|_| NodeError::InvalidArgument("unknown part".into()))?;
        let rows = plan.rows(part, req.run);
        let chunk =
            rows.chunks(plan.chunk_size)
                .nth(req.seq as usize)
                .ok_or(NodeError::NoChunk {
                    run: req.run,
                    seq: req.seq,
                })?;
        let (chunk, _) = self.chunk(&plan, part, req.run, req.seq, &self.live(chunk))?;
        Ok(chunk)
    }

    /// The features of photos `ids` (stored, else computed), as one chunk; with `stored_only`,
    /// only those stored (the others left out, for a take-over to compute).
    pub(crate) fn features_chunk(
        &self,
        ids: &[u64],
        stored_only: bool,
    ) -> Result<pb::FeatureChunk, NodeError> {
        let mut rows: Vec<Row> = ids.iter().map(|id| (*id, 0)).collect();
        if stored_only {
            rows = self.with_stored_features(&rows)?;
        }
        let (features, _) = self.features(&rows, true, None)?;
        Ok(encode_chunk(pb::Part::Train, 0, 0, &features))
    }

    /// The rows of `rows` whose features under the backbone are stored.
    pub(super) fn with_stored_features(&self, rows: &[Row]) -> Result<Vec<Row>, NodeError> {
        let pretrained = self.models.pretrained();
        let backbone = &pretrained.info().backbone_version;
        let mut kept = Vec::new();
        for row in rows {
            if self
                .features
                .get(backbone, row.0)
                .map_err(InferenceError::from)?
                .is_some()
            {
                kept.push(*row);
            }
        }
        Ok(kept)
    }

    /// Stores features another node computed for this node's photos under `req`'s backbone,
    /// which must be this node's; photos this node no longer holds are skipped. Blocks.
    pub(crate) fn put_features(
        &self,
        req: &pb::PutFeaturesRequest,
    ) -> Result<pb::PutFeaturesReply, NodeError> {
        let pretrained = self.models.pretrained();
        let info = pretrained.info();
        if req.backbone_version != info.backbone_version {
            return Err(NodeError::InvalidArgument(format!(
                "features of backbone {:?}; this node runs {:?}",
                req.backbone_version, info.backbone_version
            )));
        }
        let chunk = req
            .chunk
            .as_ref()
            .ok_or_else(|| NodeError::InvalidArgument("no features sent".into()))?;
        let classes = chunk.labels.iter().max().map_or(1, |l| *l as usize + 1);
        let features =
            decode_chunk(chunk, classes).map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        if features.dim != info.feature_dim {
            return Err(NodeError::InvalidArgument(format!(
                "{}-d features; the backbone's are {}-d",
                features.dim, info.feature_dim
            )));
        }
        let mut rows = Vec::new();
        for (id, values) in features
            .photo_ids
            .iter()
            .zip(features.values.chunks_exact(features.dim.max(1)))
        {
            if self.store.contains(*id).map_err(InferenceError::from)? {
                rows.push((*id, values));
            }
        }
        self.features
            .put_many(&info.backbone_version, &rows)
            .map_err(InferenceError::from)?;
        Ok(pb::PutFeaturesReply {
            stored: rows.len() as u32,
        })
    }

    /// The compressed tensors of photos `ids` (for a node taking over this one's work).
    pub(crate) fn tensors(&self, ids: &[u64]) -> Result<Vec<Vec<u8>>, NodeError> {
        ids.iter()
            .map(|id| Ok(stored_blob(&self.store, *id)?))
            .collect()
    }

    /// Gives up to `req.give` photos not yet extracted, from the tails of the job's runs (the
    /// latest first), each with its run and checksum. Blocks (store index).
    pub(crate) fn rebalance(
        &self,
        req: &pb::RebalanceRequest,
    ) -> Result<pb::RebalanceReply, NodeError> {
        let plan = self.job(&req.job_id)?;
        let given = plan.give(req.give as usize);
        let runs: std::collections::BTreeSet<u32> = given.iter().map(|g| g.0).collect();
        info!(job = %req.job_id, asked = req.give, given = given.len(), ?runs, "gave work away");
        let photos = given
            .into_iter()
            .map(|(run, (id, label))| {
                Ok(pb::LabelledPhoto {
                    id,
                    label,
                    run,
                    sha256: self
                        .store
                        .sha256(id)
                        .map_err(InferenceError::from)?
                        .unwrap_or_default(),
                })
            })
            .collect::<Result<_, NodeError>>()?;
        Ok(pb::RebalanceReply { photos })
    }
}
