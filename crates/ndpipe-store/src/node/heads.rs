//! Two-phase head deploys: the Tuner stages a head on every node, then commits it everywhere
//! (or aborts it everywhere). A staged head is checked against this node's backbone and written
//! durably (`DATA/heads/staged/`) before the stage is acknowledged, so a commit works after a
//! restart too; committing hands it to the node's [`Models`](crate::inference::model::Models),
//! which write its file and make it active. A commit is idempotent.

use std::sync::atomic::Ordering;

use ndpipe_catalog::{Task, TaskName};
use ndpipe_proto::pb;
use tracing::{info, warn};

use super::{NodeError, PipeStoreNode};
use crate::inference::heads::version_of;

impl PipeStoreNode {
    /// Checks a head (checksum, shape, task, backbone, feature length) and stages it durably
    /// for a commit: a head of the backbone the node serves, or of one a rollout staged on it.
    /// Blocks (a file write): call it off the async runtime.
    pub(crate) fn stage_head(&self, req: &pb::StageHeadRequest) -> Result<(), NodeError> {
        let head = ndpipe_proto::head_from_request(req).map_err(NodeError::BadHead)?;
        let version = version_of(req);
        let task: TaskName = version
            .task
            .parse()
            .map_err(|e: ndpipe_catalog::CatalogError| NodeError::InvalidArgument(e.to_string()))?;
        if task.is_general() {
            return Err(NodeError::InvalidArgument(format!(
                "head {}: the general task is the backbone's own classifier, never a head",
                req.version
            )));
        }
        let served = self.models.pretrained();
        let backbone = if req.backbone_version == served.info().backbone_version {
            served
        } else if super::rollout::check_version(&req.backbone_version).is_ok() {
            self.staged_model(&req.backbone_version)
                .map_err(|_| NodeError::WrongBackbone {
                    version: req.version.clone(),
                    trained_on: req.backbone_version.clone(),
                    runs: served.info().backbone_version.clone(),
                })?
        } else {
            return Err(NodeError::WrongBackbone {
                version: req.version.clone(),
                trained_on: req.backbone_version.clone(),
                runs: served.info().backbone_version.clone(),
            });
        };
        let info = backbone.info();
        if head.input_dim() != info.feature_dim {
            return Err(NodeError::WrongInputDim {
                version: req.version.clone(),
                input_dim: head.input_dim(),
                feature_dim: info.feature_dim,
            });
        }
        self.ensure_task(&task)?;
        self.models.stage(&head, &version)?;
        info!(task = %task, version = %version.id, "staged a head");
        Ok(())
    }

    /// Makes `version` active: a staged head, a head committed here before, or the pretrained
    /// model (a rollback); committing the active version again succeeds. Blocks (files,
    /// catalog): call it off the async runtime.
    pub(crate) fn commit_head(&self, version: &str) -> Result<(), NodeError> {
        let injected = self
            .failing_commits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if injected {
            warn!(version, "testing: refusing a commit (fault_fail_commits)");
            return Err(NodeError::Injected("commit refused (fault_fail_commits)"));
        }
        self.models.commit(version)?;
        Ok(())
    }

    /// Records `task` in this node's catalog when it lacks it (a cluster of nodes with a
    /// catalog each learns a task from the Tuner's first head of it).
    fn ensure_task(&self, task: &TaskName) -> Result<(), NodeError> {
        if self.catalog.task(task)?.is_none() {
            let created = self.catalog.create_task(&Task {
                name: task.clone(),
                floor: None,
                created_ms: ndpipe_util::time::now_ms(),
            });
            match created {
                Ok(()) | Err(ndpipe_catalog::CatalogError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Drops a staged head, if there is one. Blocks (a file removal).
    pub(crate) fn abort_head(&self, version: &str) -> Result<(), NodeError> {
        if self.models.abort(version)? {
            warn!(version, "aborted a staged head");
        }
        Ok(())
    }
}
