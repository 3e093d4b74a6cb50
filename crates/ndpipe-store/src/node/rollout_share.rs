//! A rollout's share of the work, node side: on a replicated cluster the copies of other
//! nodes' photos are left to their primaries, so that each photo is extracted once. In load
//! balancing, a slow node gives photos its pass has not read yet away ([`Pending::give`]),
//! recording them durably first, so that its pass, a restart of it and its commit skip them;
//! a fast node runs the STAGED backbone over them (its own copy of a
//! photo, else the slow node's tensors) and stores features and logits back on the slow node,
//! which writes the features under the staged backbone and labels under its pretrained
//! version. Whatever a fast node did not store back (it failed), the slow node's commit
//! computes itself: no photo is lost, and storing one twice only overwrites it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ndpipe_model::Outputs;
use ndpipe_proto::pb;
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::transport;
use ndpipe_util::fs::write_durably;
use ndpipe_util::sync::lock;
use tracing::{info, warn};

use super::rollout::check_version;
use super::takeover::{DEFAULT_PEER_TIMEOUT, blocking};
use super::{MAX_MESSAGE, NodeError, PipeStoreNode};
use crate::inference::backbone::{decode_tensor, stored_tensor};
use crate::inference::labeler::write_outputs;
use crate::inference::{ActiveModel, InferenceError, Pending};

/// Photos per query when the pass looks up which of its copies are other nodes' photos.
const COPIES_PAGE: usize = 1000;

impl PipeStoreNode {
    /// The queue of the pass of staged backbone `sha`, with the photos it gave away before
    /// (read from their durable record on the first call) and without the copies of other
    /// nodes' photos.
    pub(super) fn pending(&self, sha: &str) -> Result<Arc<Pending>, NodeError> {
        let mut slot = lock(&self.rollout_pending);
        if let Some((_, pending)) = slot.as_ref().filter(|(s, _)| s == sha) {
            return Ok(pending.clone());
        }
        let path = self.backbones.given(sha);
        let given: BTreeSet<u64> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| NodeError::BackboneFiles {
                path,
                source: std::io::Error::other(e),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(source) => return Err(NodeError::BackboneFiles { path, source }),
        };
        let others = self.others_copies()?;
        if !others.is_empty() {
            info!(backbone = %sha, photos = others.len(), "copies of other nodes' photos left to their primaries");
        }
        let pending = Arc::new(Pending::with_given(given).leaving_out(others));
        *slot = Some((sha.to_string(), pending.clone()));
        Ok(pending)
    }

    /// The photos this node holds as copies of another node's (their catalog row is that
    /// node's): on a replicated cluster each photo is the work of its primary only.
    fn others_copies(&self) -> Result<BTreeSet<u64>, NodeError> {
        let Some((map, me)) = &self.replicas else {
            return Ok(BTreeSet::new());
        };
        let ids: Vec<u64> = (self.store.entries().map_err(InferenceError::from)?)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut others = BTreeSet::new();
        for page in ids.chunks(COPIES_PAGE) {
            others.extend(
                map.copies_many(page)?
                    .into_iter()
                    .filter(|c| c.primary != *me)
                    .map(|c| c.id),
            );
        }
        Ok(others)
    }

    /// Forgets the queue of the pass of `sha`.
    pub(super) fn drop_pending(&self) {
        *lock(&self.rollout_pending) = None;
    }

    /// Gives up to `req.give` photos the pass of `req.backbone_version` has not read yet away,
    /// durably; none when no pass runs. Blocks.
    pub(crate) fn give_backbone_photos(
        &self,
        req: &pb::GiveBackbonePhotosRequest,
    ) -> Result<pb::GiveBackbonePhotosReply, NodeError> {
        let sha = &req.backbone_version;
        check_version(sha)?;
        let pending = self.pending(sha)?;
        let path = self.backbones.given(sha);
        let ids = pending.give(req.give as usize, |given| {
            serde_json::to_vec(given)
                .map_err(std::io::Error::other)
                .and_then(|bytes| write_durably(&path, &bytes))
                .map_err(|source| NodeError::BackboneFiles {
                    path: path.clone(),
                    source,
                })
        })?;
        let photos = ids
            .into_iter()
            .map(|id| {
                let sha256 = self.store.sha256(id).map_err(InferenceError::from)?;
                Ok(pb::LabelledPhoto {
                    id,
                    sha256: sha256.unwrap_or_default(),
                    ..pb::LabelledPhoto::default()
                })
            })
            .collect::<Result<Vec<_>, NodeError>>()?;
        info!(backbone = %sha, photos = photos.len(), "gave rollout photos away");
        Ok(pb::GiveBackbonePhotosReply { photos })
    }

    /// Stores the outputs another node's staged backbone computed for this node's photos:
    /// features under the backbone, labels under its pretrained version. Photos this node no
    /// longer holds are skipped. Blocks.
    pub(crate) fn put_backbone_outputs(
        &self,
        req: pb::PutBackboneOutputsRequest,
    ) -> Result<pb::PutBackboneOutputsReply, NodeError> {
        check_version(&req.backbone_version)?;
        let model = self.staged_model(&req.backbone_version)?;
        let (dim, classes) = (model.info().feature_dim, model.info().num_classes);
        let outputs = Outputs::new(req.ids.len(), dim, classes, req.features, req.logits)
            .map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        let (mut ids, mut features, mut logits) = (Vec::new(), Vec::new(), Vec::new());
        for (i, id) in req.ids.iter().enumerate() {
            if self.store.contains(*id).map_err(InferenceError::from)? {
                ids.push(*id);
                features.extend_from_slice(outputs.features(i));
                logits.extend_from_slice(outputs.logits(i));
            }
        }
        let kept = Outputs::new(ids.len(), dim, classes, features, logits)?;
        let top_k = self.relabel.top_k;
        write_outputs(&model, &*self.catalog, &self.features, &ids, &kept, top_k)?;
        Ok(pb::PutBackboneOutputsReply {
            stored: ids.len() as u32,
        })
    }

    /// The photos the pass of `sha` gave away that no node stored outputs for (a fast node
    /// failed), computed here with `model`; returns how many. Blocks.
    pub(super) fn finish_given(&self, model: &ActiveModel, sha: &str) -> Result<u64, NodeError> {
        let given = self.pending(sha)?.given();
        let n = self.compute_missing(model, sha, given)?;
        if n > 0 {
            warn!(backbone = %sha, photos = n, "computed photos given away that no node stored");
        }
        Ok(n)
    }

    /// The photos the pass of `sha` left out as other nodes' that are this node's now (a lost
    /// node's photos passed to it), computed here with `model`; returns how many. Blocks.
    pub(super) fn finish_moved(&self, model: &ActiveModel, sha: &str) -> Result<u64, NodeError> {
        let left_out = self.pending(sha)?.left_out();
        if left_out.is_empty() {
            return Ok(0);
        }
        let still = self.others_copies()?;
        let n = self.compute_missing(model, sha, left_out.difference(&still).copied())?;
        if n > 0 {
            info!(backbone = %sha, photos = n, "extracted photos that became this node's during the rollout");
        }
        Ok(n)
    }

    /// Of `ids`, the photos this node holds without features from `sha`, computed with
    /// `model` and stored with their labels; returns how many. Blocks.
    fn compute_missing(
        &self,
        model: &ActiveModel,
        sha: &str,
        ids: impl IntoIterator<Item = u64>,
    ) -> Result<u64, NodeError> {
        let mut missing = Vec::new();
        for id in ids {
            let held = self.store.contains(id).map_err(InferenceError::from)?;
            if held
                && self
                    .features
                    .get(sha, id)
                    .map_err(InferenceError::from)?
                    .is_none()
            {
                missing.push(id);
            }
        }
        let batch = self.relabel.batch.min(model.backend.max_batch()).max(1);
        for ids in missing.chunks(batch) {
            let tensors = ids
                .iter()
                .map(|id| stored_tensor(&self.store, *id))
                .collect::<Result<Vec<_>, _>>()?;
            let outputs = model.backend.run(&tensors)?;
            let top_k = self.relabel.top_k;
            write_outputs(model, &*self.catalog, &self.features, ids, &outputs, top_k)?;
        }
        Ok(missing.len() as u64)
    }

    /// Runs staged backbone `req.backbone_version` over the photos the node at `req.source_url`
    /// gave away, a batch at a time, and stores the outputs there.
    pub(crate) async fn take_over_backbone(
        self: Arc<Self>,
        req: pb::TakeOverBackboneRequest,
    ) -> Result<pb::TakeOverBackboneReply, NodeError> {
        let sha = req.backbone_version.clone();
        check_version(&sha)?;
        let peer = |what: &'static str, reason: String| NodeError::Peer {
            what,
            url: req.source_url.clone(),
            reason,
        };
        let channel = transport::channel(&req.source_url, self.tls.as_ref())
            .map_err(|e| peer("cannot reach", e.to_string()))?;
        let mut source = PipeStoreClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        let deadline = match req.timeout_ms {
            0 => DEFAULT_PEER_TIMEOUT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let node = self.clone();
        let model = blocking(move || node.staged_model(&sha)).await?;
        let batch = self.relabel.batch.min(model.backend.max_batch()).max(1);
        let mut reply = pb::TakeOverBackboneReply::default();
        for part in req.photos.chunks(batch) {
            let (node, owned) = (self.clone(), part.to_vec());
            let copies = blocking(move || node.copies(&owned)).await?;
            let remote: Vec<u64> = part
                .iter()
                .zip(&copies)
                .filter(|(_, c)| !**c)
                .map(|(p, _)| p.id)
                .collect();
            let mut blobs: HashMap<u64, Vec<u8>> = HashMap::new();
            if !remote.is_empty() {
                let message = pb::GetTensorsRequest {
                    ids: remote.clone(),
                };
                let request = transport::request(message, Some(deadline), self.secret.as_ref());
                let got = transport::unary(deadline, source.get_tensors(request))
                    .await
                    .map_err(|e| peer("fetching tensors from", e.message().to_string()))?
                    .tensors;
                if got.len() != remote.len() {
                    let reason = format!("{} tensors for {} photos", got.len(), remote.len());
                    return Err(peer("fetching tensors from", reason));
                }
                blobs = remote.into_iter().zip(got).collect();
            }
            let own = part.len() as u64 - blobs.len() as u64;
            let (node, model, owned) = (self.clone(), model.clone(), part.to_vec());
            let outputs = blocking(move || {
                let tensors = owned
                    .iter()
                    .zip(&copies)
                    .map(|(p, copy)| match copy {
                        true => stored_tensor(&node.store, p.id),
                        false => decode_tensor(p.id, blobs.get(&p.id).map_or(&[], Vec::as_slice)),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(model.backend.run(&tensors)?)
            })
            .await?;
            let message = pb::PutBackboneOutputsRequest {
                backbone_version: req.backbone_version.clone(),
                ids: part.iter().map(|p| p.id).collect(),
                features: outputs.all_features().to_vec(),
                logits: outputs.all_logits().to_vec(),
            };
            let request = transport::request(message, Some(deadline), self.secret.as_ref());
            let stored = transport::unary(deadline, source.put_backbone_outputs(request))
                .await
                .map_err(|e| peer("storing rollout outputs on", e.message().to_string()))?
                .stored;
            reply.taken += u64::from(stored);
            reply.copies += own;
        }
        info!(backbone = %req.backbone_version, from = %req.source_url, photos = reply.taken,
            copies = reply.copies, "took rollout photos over");
        Ok(reply)
    }
}
