//! The node's side of a backbone rollout, in three phases the Tuner drives on every node:
//!
//! 1. **stage**: the ONNX file arrives in checksummed chunks ([`BackboneAssembly`]); its sha256
//!    must be the version, and it must load with its manifest; it is then kept durably in
//!    `DATA/backbones/staged/<sha256>/`;
//! 2. **extract**: the full re-labelling pipeline runs the staged backbone over every stored
//!    tensor, writing features under its version and labels from its own classifier under its
//!    pretrained version, while the node keeps serving the old one; the report is checkpointed
//!    durably after every batch, so a restart loses at most one batch; photos given to faster
//!    nodes ([`super::rollout_share`]) are skipped. Progress carries the pass's own model rate
//!    (photos per second inside the model), which the Tuner balances by from the first batch;
//! 3. **commit**: photos uploaded since, photos given away that no node stored, and photos
//!    left out as another node's that became this node's (their primary was lost) are caught
//!    up, the backbone moves to `DATA/backbones/<sha256>/` and is named the active one, and the
//!    node serves it with the heads the Tuner trained for it (staged before, one per custom
//!    task; a task without one is no longer served). The commit also times the backbone alone on a batch of the node's own
//!    tensors (the report's model-only reference), after the extraction, so that the timing
//!    delays no node's pass.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ndpipe_model::ModelManifest;
use ndpipe_proto::{BackboneAssembly, pb};
use ndpipe_util::fs::{sync_dir, write_durably};
use ndpipe_util::sync::lock;
use sha2::{Digest, Sha256};
use tracing::info;

use super::{NodeError, PipeStoreNode};
use crate::inference::backbone::stored_tensor;
use crate::inference::{
    ActiveModel, InferenceError, Pending, RelabelOptions, RelabelReport, Relabeler,
};

/// The most tensors the model-only timing runs in its one batch.
const TIMED_BATCH: usize = 16;

/// The largest backbone a node accepts.
pub(crate) const MAX_BACKBONE_BYTES: u64 = 4 << 30;

impl PipeStoreNode {
    /// Phase one: checks the assembled backbone (its sha256 is its version; it loads with its
    /// manifest) and keeps it durably, staged. Returns its pretrained version. Staging a
    /// backbone staged (or served) already changes nothing. Blocks: call it off the runtime.
    pub(crate) fn stage_backbone(&self, upload: BackboneAssembly) -> Result<String, NodeError> {
        let upload = upload
            .finish()
            .map_err(|e| NodeError::BadBackbone(e.to_string()))?;
        let sha = upload.version.clone();
        let actual = hex::encode(Sha256::digest(&upload.onnx));
        if actual != sha {
            return Err(NodeError::BadBackbone(format!(
                "the file's sha256 is {actual}, not the version {sha}"
            )));
        }
        let _rollout = lock(&self.rollout);
        let dirs = &self.backbones;
        if !dirs.staged(&sha).exists() && !dirs.committed(&sha).exists() {
            let incoming = dirs.incoming(&sha);
            let io = |path: &std::path::Path| {
                let path = path.to_path_buf();
                move |source| NodeError::BackboneFiles { path, source }
            };
            if incoming.exists() {
                std::fs::remove_dir_all(&incoming).map_err(io(&incoming))?;
            }
            std::fs::create_dir_all(&incoming).map_err(io(&incoming))?;
            let manifest: ModelManifest = serde_json::from_str(&upload.manifest_json)
                .map_err(|e| NodeError::BadBackbone(format!("the manifest: {e}")))?;
            manifest.write_dir(&incoming, &upload.classes, &upload.onnx)?;
            self.loaded_backbone(&sha, &incoming)?;
            let staged = dirs.staged(&sha);
            std::fs::rename(&incoming, &staged).map_err(io(&staged))?;
            if let Some(parent) = staged.parent() {
                sync_dir(parent).map_err(io(parent))?;
            }
            info!(backbone = %sha, "staged a backbone");
        }
        let model = self.staged_model(&sha)?;
        Ok(model.general_version().to_string())
    }

    /// Phase two: features and labels of every photo from staged backbone `sha`, resuming at
    /// its checkpoint and skipping the photos given to other nodes; `progress` hears after
    /// every batch, with the pass's model rate so far. Blocks.
    pub(crate) fn extract_backbone(
        &self,
        sha: &str,
        mut progress: impl FnMut(pb::ExtractBackboneProgress),
    ) -> Result<pb::ExtractBackboneDone, NodeError> {
        check_version(sha)?;
        let _rollout = lock(&self.rollout);
        let model = self.staged_model(sha)?;
        self.models.register(&model)?;
        let before = self.read_checkpoint(sha)?.done;
        let pending = self.pending(sha)?;
        let started = Instant::now();
        let given = pending.clone();
        let left_out = pending.left_out().len() as u64;
        let report = self.relabel_with(&model, sha, pending, &mut |r| {
            progress(pb::ExtractBackboneProgress {
                done: r.done,
                total: (before + r.total).saturating_sub(given.given_now()),
                images_per_second: r.images_per_second,
                model_images_per_second: r.model_images_per_second,
            })
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let this_call = report.total;
        info!(backbone = %sha, photos = report.done, seconds, "re-extracted with a staged backbone");
        Ok(pb::ExtractBackboneDone {
            photos: report.done,
            seconds,
            images_per_second: report.images_per_second,
            model_images_per_second: report.model_images_per_second,
            skipped: report.skipped.len() as u64,
            this_call,
            left_out,
        })
    }

    /// Phase three: catches up photos uploaded since phase two, then serves backbone `sha`
    /// (committed durably first) with the staged `heads`, and times it alone. Committing the
    /// backbone served already commits the heads (idempotent) and times it. Blocks.
    pub(crate) fn commit_backbone(
        &self,
        sha: &str,
        heads: &[String],
    ) -> Result<pb::CommitBackboneReply, NodeError> {
        check_version(sha)?;
        let _rollout = lock(&self.rollout);
        let served = self.models.pretrained();
        if served.info().backbone_version == sha {
            for head in heads {
                self.models.commit(head)?;
            }
            self.drop_staged(sha)?;
            return Ok(pb::CommitBackboneReply {
                model_only_images_per_second: self.time_model(&served)?,
                model_version: served.general_version().to_string(),
                caught_up: 0,
            });
        }
        let model = self.staged_model(sha)?;
        let before = self.read_checkpoint(sha)?.done;
        let pending = self.pending(sha)?;
        let caught_up = self.relabel_with(&model, sha, pending, &mut |_| {})?.done - before
            + self.finish_given(&model, sha)?
            + self.finish_moved(&model, sha)?;
        self.backbones
            .commit(sha)
            .map_err(|source| NodeError::BackboneFiles {
                path: self.backbones.committed(sha),
                source,
            })?;
        self.models.switch_backbone(model.clone(), heads)?;
        self.drop_staged(sha)?;
        let model_only = self.time_model(&model)?;
        let version = model.general_version().to_string();
        info!(backbone = %sha, version = %version, heads = heads.len(), caught_up, model_only, "committed a backbone");
        Ok(pb::CommitBackboneReply {
            model_version: version,
            caught_up,
            model_only_images_per_second: model_only,
        })
    }

    /// Drops staged backbone `sha` and its checkpoint (its features and labels stay, unused).
    /// Blocks.
    pub(crate) fn abort_backbone(&self, sha: &str) -> Result<(), NodeError> {
        check_version(sha)?;
        let _rollout = lock(&self.rollout);
        if self.drop_staged(sha)? {
            info!(backbone = %sha, "aborted a staged backbone");
        }
        Ok(())
    }

    /// Forgets staged backbone `sha`: the loaded model, its files and its checkpoint; returns
    /// whether it was staged.
    fn drop_staged(&self, sha: &str) -> Result<bool, NodeError> {
        *lock(&self.staged) = None;
        self.drop_pending();
        self.backbones
            .remove_staged(sha)
            .map_err(|source| NodeError::BackboneFiles {
                path: self.backbones.staged(sha),
                source,
            })
    }

    /// The staged backbone `sha` with its own classifier, loaded once; a backbone committed
    /// here before counts as staged (a rollout of the served backbone re-extracts with it).
    pub(super) fn staged_model(&self, sha: &str) -> Result<ActiveModel, NodeError> {
        if let Some(model) = lock(&self.staged)
            .as_ref()
            .filter(|m| m.info().backbone_version == sha)
        {
            return Ok(model.clone());
        }
        let served = self.models.pretrained();
        if served.info().backbone_version == sha {
            return Ok(served);
        }
        let dir = [self.backbones.staged(sha), self.backbones.committed(sha)]
            .into_iter()
            .find(|d| d.exists())
            .ok_or_else(|| NodeError::BackboneNotStaged(sha.to_string()))?;
        self.loaded_backbone(sha, &dir)
    }

    /// Loads the backbone in `dir`, which must be version `sha`, and keeps it as the staged one.
    fn loaded_backbone(&self, sha: &str, dir: &std::path::Path) -> Result<ActiveModel, NodeError> {
        let backend = self
            .loader
            .load(dir)
            .map_err(|e| NodeError::BadBackbone(e.to_string()))?;
        if backend.info().backbone_version != sha {
            return Err(NodeError::BadBackbone(format!(
                "{} holds backbone {}, not {sha}",
                dir.display(),
                backend.info().backbone_version
            )));
        }
        let model = ActiveModel::pretrained(backend);
        *lock(&self.staged) = Some(model.clone());
        Ok(model)
    }

    /// The backbone alone on a batch (at most [`TIMED_BATCH`]) of this node's own tensors, after
    /// one warm-up image, in images per second; 0 for a store without photos.
    fn time_model(&self, model: &ActiveModel) -> Result<f64, NodeError> {
        let batch = self
            .relabel
            .batch
            .min(model.backend.max_batch())
            .clamp(1, TIMED_BATCH);
        let tensors = self
            .store
            .entries()
            .map_err(InferenceError::from)?
            .into_iter()
            .take(batch)
            .map(|(id, _)| stored_tensor(&self.store, id))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = tensors.first() else {
            return Ok(0.0);
        };
        model.backend.run(std::slice::from_ref(first))?;
        let started = Instant::now();
        model.backend.run(&tensors)?;
        Ok(tensors.len() as f64 / started.elapsed().as_secs_f64().max(1e-9))
    }

    /// The full re-labelling with `model` from the checkpoint of `sha` on, reading from
    /// `pending` and checkpointing after every batch; churn is measured against the served
    /// version.
    fn relabel_with(
        &self,
        model: &ActiveModel,
        sha: &str,
        pending: Arc<Pending>,
        progress: &mut dyn FnMut(&RelabelReport),
    ) -> Result<RelabelReport, NodeError> {
        let options = RelabelOptions {
            compare_with: Some(self.models.pretrained().general_version().to_string()),
            // Beyond the model's batch and the next one, the pass's photos stay in `pending`,
            // to give away.
            queue: 0,
            pending: Some(pending),
            ..self.relabel.clone()
        };
        let relabeler = Relabeler {
            store: &self.store,
            catalog: &*self.catalog,
            features: &self.features,
            model,
            options: &options,
        };
        let report = Mutex::new(self.read_checkpoint(sha)?);
        let path = self.backbones.checkpoint(sha);
        let mut failed = None;
        relabeler.run(&report, &AtomicBool::new(false), |r| {
            let saved = serde_json::to_vec(r)
                .map_err(std::io::Error::other)
                .and_then(|bytes| write_durably(&path, &bytes));
            if let Err(e) = saved {
                failed.get_or_insert(e);
            }
            progress(r);
        })?;
        if let Some(source) = failed {
            return Err(NodeError::BackboneFiles { path, source });
        }
        Ok(lock(&report).clone())
    }

    /// The checkpoint of `sha`'s re-extraction (a fresh report when there is none).
    fn read_checkpoint(&self, sha: &str) -> Result<RelabelReport, NodeError> {
        let path = self.backbones.checkpoint(sha);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| NodeError::BackboneFiles {
                path,
                source: std::io::Error::other(e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RelabelReport::default()),
            Err(source) => Err(NodeError::BackboneFiles { path, source }),
        }
    }
}

/// A backbone version names files on this node: it must be a hex sha256, nothing else.
pub(super) fn check_version(sha: &str) -> Result<(), NodeError> {
    if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(NodeError::InvalidArgument(format!(
            "backbone version {sha:?} is not a hex sha256"
        )))
    }
}
