//! Jobs that survive a Tuner restart: when the Tuner opens, each job that was running when it
//! stopped (kill -9 included) is taken up again ([`Core::resume`]), its `resumed` count raised:
//!
//! - a **rollout** continues from its checkpoints: every phase is idempotent per node, the nodes
//!   that already serve the backbone are only committed again, the others resume their
//!   extraction at their own checkpoint ([`crate::rollout`]);
//! - a **repair** follows the copy counts again, from the catalog;
//! - a **fine-tune** that was still surveying the nodes starts again from its request; one that
//!   had begun to gather features fails, saying so: the features were in the Tuner's memory;
//! - a **deploy** fails, saying what became of it.
//!
//! A job that cannot be taken up (its backbone is gone, no node can take part, another job holds
//! the job lock) fails with the reason; none is left running.

use std::sync::Arc;

use tracing::{info, warn};

use crate::control::Core;
use crate::jobs::{JobKind, JobView, Phase, Progress};
use crate::rollout::RolloutOptions;
use crate::{FinetuneRequest, TunerError};

/// Why a fine-tune past its survey cannot be resumed.
pub(crate) const FINETUNE_LOST: &str =
    "the Tuner restarted while the fine-tune's features were in memory; start it again";
/// Why a deploy is not resumed.
pub(crate) const DEPLOY_LOST: &str = "the Tuner restarted during the deploy; once it had begun \
     committing, the syncer brings every node to the version, otherwise deploy it again";

/// What becomes of a job that was running when the Tuner stopped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// The rollout of kept backbone `backbone` continues.
    Rollout { backbone: String, force: bool },
    /// The repair after node `node`'s removal is followed again.
    Repair { node: String, replicas: u32 },
    /// The fine-tune starts again from its request.
    Finetune(Box<FinetuneRequest>),
    /// The job fails with this reason.
    Fail(String),
}

/// What becomes of `view`, a job that was running when the Tuner stopped, from its kind, phase
/// and request.
pub(crate) fn plan(view: &JobView) -> Plan {
    let request = &view.request;
    let unreadable = |what: &str| {
        Plan::Fail(format!(
            "the Tuner restarted and cannot resume the job: its request {what}"
        ))
    };
    match view.kind {
        JobKind::Rollout => match (request["backbone"].as_str(), request["force"].as_bool()) {
            (Some(backbone), Some(force)) => Plan::Rollout {
                backbone: backbone.to_string(),
                force,
            },
            _ => unreadable("names no backbone"),
        },
        JobKind::Repair => match (
            request["node"].as_str(),
            request["replicas"]
                .as_u64()
                .and_then(|r| u32::try_from(r).ok()),
        ) {
            (Some(node), Some(replicas)) => Plan::Repair {
                node: node.to_string(),
                replicas,
            },
            _ => unreadable("names no node and copies"),
        },
        JobKind::Finetune if view.phase == Phase::Surveying => {
            match serde_json::from_value::<FinetuneRequest>(request.clone()) {
                Ok(req) => Plan::Finetune(Box::new(req)),
                Err(e) => unreadable(&format!("does not parse: {e}")),
            }
        }
        JobKind::Finetune => Plan::Fail(FINETUNE_LOST.to_string()),
        JobKind::Deploy => Plan::Fail(DEPLOY_LOST.to_string()),
    }
}

impl Core {
    /// Takes up every job of `unfinished` (those running when the Tuner stopped): resumes it
    /// or fails it with the reason (see the module's doc). Resuming needs a Tokio runtime; opened
    /// outside one, every such job fails, saying so.
    pub(crate) fn resume(self: &Arc<Self>, unfinished: Vec<JobView>) -> Result<(), TunerError> {
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        for view in unfinished {
            let plan = if in_runtime {
                plan(&view)
            } else {
                Plan::Fail(
                    "the Tuner restarted outside an async runtime and cannot resume the job".into(),
                )
            };
            let progress = self.jobs.adopt(view)?;
            let id = progress.id().to_string();
            match self.take_up(plan, progress.clone()) {
                Ok(()) => info!(job = %id, "resumed after the Tuner restarted"),
                Err(e) => {
                    warn!(job = %id, error = %e, "cannot resume the job after the Tuner restarted");
                    progress.finish(Err(&e));
                }
            }
        }
        Ok(())
    }

    /// Starts `plan` for the job of `progress` in the background, or says why it cannot run.
    fn take_up(self: &Arc<Self>, plan: Plan, progress: Progress) -> Result<(), TunerError> {
        let locked = || {
            self.try_lock().map_err(|_| {
                TunerError::Interrupted(
                    "the Tuner restarted and another job was resumed first; start it again".into(),
                )
            })
        };
        match plan {
            Plan::Fail(reason) => Err(TunerError::Interrupted(reason)),
            Plan::Repair { node, replicas } => {
                let catalog = self.replicas.clone().ok_or_else(|| {
                    TunerError::Interrupted(
                        "the Tuner restarted without a shared catalog; repair cannot be followed"
                            .into(),
                    )
                })?;
                self.follow_repair(catalog, progress, node, replicas);
                Ok(())
            }
            Plan::Rollout { backbone, force } => {
                let guard = locked()?;
                let files = self.backbones.files(&backbone)?;
                // Every live node that is not draining, in sync or not: the nodes that switched
                // before the restart serve another version than the rest.
                let members = self.nodes.members(None)?;
                let options = RolloutOptions {
                    force,
                    resumed: true,
                };
                self.run_rollout(guard, progress, (files, members), options)?;
                Ok(())
            }
            Plan::Finetune(req) => {
                let guard = locked()?;
                let members = self.members()?;
                self.run_finetune(guard, progress, members, *req)?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(kind: JobKind, phase: Phase, request: serde_json::Value) -> JobView {
        JobView {
            id: "j".into(),
            kind,
            phase,
            request,
            created_ms: 0,
            updated_ms: 0,
            progress: Vec::new(),
            skipped: Vec::new(),
            result: None,
            error: None,
            resumed: 0,
            runs: Vec::new(),
        }
    }

    #[test]
    fn a_rollout_continues_in_any_phase() {
        let request = json!({"backbone": "ab12", "version": "v", "force": true});
        for phase in [Phase::Staging, Phase::Extracting, Phase::Committing] {
            assert_eq!(
                plan(&job(JobKind::Rollout, phase, request.clone())),
                Plan::Rollout {
                    backbone: "ab12".into(),
                    force: true
                }
            );
        }
        let Plan::Fail(why) = plan(&job(JobKind::Rollout, Phase::Staging, json!({}))) else {
            panic!("a rollout without a backbone is resumed");
        };
        assert!(why.contains("names no backbone"), "{why}");
    }

    #[test]
    fn a_repair_is_followed_again() {
        let request = json!({"node": "ps-c", "replicas": 2});
        assert_eq!(
            plan(&job(JobKind::Repair, Phase::Repairing, request)),
            Plan::Repair {
                node: "ps-c".into(),
                replicas: 2
            }
        );
    }

    #[test]
    fn a_finetune_restarts_only_before_its_features_are_in_memory() {
        let request = serde_json::to_value(FinetuneRequest {
            epochs: 7,
            ..FinetuneRequest::default()
        })
        .unwrap();
        let Plan::Finetune(req) = plan(&job(JobKind::Finetune, Phase::Surveying, request.clone()))
        else {
            panic!("a fine-tune still surveying is not started again");
        };
        assert_eq!(req.epochs, 7);
        for phase in [Phase::Extracting, Phase::Training, Phase::Deploying] {
            assert_eq!(
                plan(&job(JobKind::Finetune, phase, request.clone())),
                Plan::Fail(FINETUNE_LOST.into())
            );
        }
    }

    #[test]
    fn a_deploy_fails_saying_what_became_of_it() {
        let request = json!({"version": "v1"});
        assert_eq!(
            plan(&job(JobKind::Deploy, Phase::Deploying, request)),
            Plan::Fail(DEPLOY_LOST.into())
        );
    }
}
