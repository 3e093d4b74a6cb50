//! Two-phase head deploys: the Tuner stages a head on every node, then commits it everywhere
//! (or aborts it everywhere). A staged head is checked against this node's backbone and kept in
//! memory; committing hands it to the node's [`Models`](crate::inference::model::Models), which
//! write its file and make it active.

use ndpipe_model::{HeadVersion, HeadWeights};
use ndpipe_proto::pb;
use ndpipe_util::sync::lock;
use tracing::{info, warn};

use super::{NodeError, PipeStoreNode};
use crate::inference::heads::version_of;

/// A head staged for a deploy, with the version it would become.
pub(super) struct Staged {
    head: HeadWeights,
    version: HeadVersion,
}

impl PipeStoreNode {
    /// Checks a head (checksum, shape, backbone, feature length) and keeps it for a commit.
    pub(crate) fn stage_head(&self, req: &pb::StageHeadRequest) -> Result<(), NodeError> {
        let head = ndpipe_proto::head_from_request(req).map_err(NodeError::BadHead)?;
        let info = self.models.pretrained().info();
        if req.backbone_version != info.backbone_version {
            return Err(NodeError::WrongBackbone {
                version: req.version.clone(),
                trained_on: req.backbone_version.clone(),
                runs: info.backbone_version.clone(),
            });
        }
        if head.input_dim() != info.feature_dim {
            return Err(NodeError::WrongInputDim {
                version: req.version.clone(),
                input_dim: head.input_dim(),
                feature_dim: info.feature_dim,
            });
        }
        let version = version_of(req);
        info!(version = %version.id, "staged a head");
        lock(&self.staged).insert(version.id.clone(), Staged { head, version });
        Ok(())
    }

    /// Makes `version` active: a staged head, a head committed here before, or the pretrained
    /// model (a rollback). Blocks (files, catalog): call it off the async runtime.
    pub(crate) fn commit_head(&self, version: &str) -> Result<(), NodeError> {
        let staged = lock(&self.staged)
            .remove(version)
            .map(|s| (s.head, s.version));
        self.models.commit(version, staged)?;
        Ok(())
    }

    /// Drops a staged head, if there is one.
    pub(crate) fn abort_head(&self, version: &str) {
        if lock(&self.staged).remove(version).is_some() {
            warn!(version, "aborted a staged head");
        }
    }
}
