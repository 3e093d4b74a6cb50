//! A fine-tune that loses a PipeStore on a replicated cluster still finishes. When a node's
//! stream fails and the node no longer answers, each of its photos passes to a live node that
//! holds a copy (`ReplicaCatalog::fail_over`, in the shared catalog). Mostly the job goes on
//! without starting over (`finetune::lost`: the features received are kept, holders of copies
//! take over the rest). Where that cannot apply (the lost node's validation set was incomplete,
//! load balancing had moved work from or to it, training reads through the cache, or a
//! take-over of its photos failed), the job runs again on the survivors, as here: every
//! training photo has exactly one primary, so each is trained once. Only photos that no live
//! node holds fail the job, named in its error. Without a replica map (a SQLite Tuner), when
//! the node still answers, or when the job had registered its version (a deploy failed), the
//! failure stands as it was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::ReplicaCatalog;
use ndpipe_model::InferenceBackend;
use ndpipe_proto::pb;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::TunerError;
use crate::control::JobEnv;
use crate::finetune::{self, FinetuneReport, FinetuneRequest};
use crate::nodes::{Members, Node};

/// How long a node that failed a job has to answer an inventory before it counts as lost.
const PROBE: Duration = Duration::from_secs(3);

/// A node lost during a fine-tune, and what became of its photos.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedOver {
    /// The node.
    pub node: String,
    /// Why the job lost it.
    pub reason: String,
    /// Its photos now reached through a live holder of a copy.
    pub photos_moved: u64,
    /// Its photos whose features the job had received and kept (0 when it ran again).
    #[serde(default)]
    pub kept: u64,
    /// Per node (label), how many of its training photos not yet received that node took over
    /// in the job (empty when it ran again).
    #[serde(default)]
    pub taken_over: BTreeMap<String, u64>,
    /// Whether the job ran again on the survivors instead.
    #[serde(default)]
    pub rerun: bool,
}

/// [`finetune::finetune`], run again on the survivors after each lost node whose photos all
/// have a live copy elsewhere, when the job could not take its photos over as it ran.
pub(crate) async fn finetune_surviving(
    env: &JobEnv<'_>,
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
    mut members: Members,
    conventional: Option<Arc<dyn InferenceBackend>>,
    req: FinetuneRequest,
) -> Result<FinetuneReport, TunerError> {
    let mut failed_over = Vec::new();
    loop {
        let outcome = finetune::finetune(
            env,
            replicas,
            members.clone(),
            conventional.clone(),
            req.clone(),
            &finetune::Target::default(),
        )
        .await;
        let (Err(TunerError::Node { node, message }), Some(map)) = (&outcome, replicas) else {
            return outcome.map(|mut report| {
                failed_over.append(&mut report.failed_over);
                report.failed_over = failed_over;
                report
            });
        };
        let Some(lost) = members.nodes.iter().find(|n| n.label() == *node).cloned() else {
            return outcome;
        };
        if members.nodes.len() < 2 || registered(env)? || answers(&lost).await {
            return outcome;
        }
        let (map, name) = (map.clone(), lost.name.clone());
        let moved = tokio::task::spawn_blocking(move || map.fail_over(&name))
            .await
            .map_err(|e| TunerError::Internal(e.to_string()))??;
        if moved.stranded_total > 0 {
            return Err(TunerError::Node {
                node: node.clone(),
                message: format!(
                    "{message}; {} of its photos have no copy on a live node (ids {:?}{})",
                    moved.stranded_total,
                    moved.stranded,
                    if moved.stranded_total > moved.stranded.len() as u64 {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            });
        }
        warn!(node = %lost.name, moved = moved.moved, reason = %message,
            "a node was lost during the fine-tune; its photos pass to their copies and the job runs again");
        failed_over.push(FailedOver {
            node: lost.name.clone(),
            reason: message.clone(),
            photos_moved: moved.moved,
            kept: 0,
            taken_over: BTreeMap::new(),
            rerun: true,
        });
        members.nodes.retain(|n| n.name != lost.name);
        members
            .skipped
            .push(format!("{}: lost during the job ({message})", lost.label()));
    }
}

/// Whether the job got as far as registering its version (a deploy failed): running it again
/// would make a second version.
fn registered(env: &JobEnv<'_>) -> Result<bool, TunerError> {
    let job = env.progress.id();
    Ok(env
        .registry
        .list()?
        .iter()
        .any(|v| v.id.starts_with(&format!("{job}-"))))
}

/// Whether `node` answers an inventory within [`PROBE`].
pub(crate) async fn answers(node: &Node) -> bool {
    let call = node.unary(pb::InventoryRequest::default(), |mut c, r| async move {
        c.inventory(r).await
    });
    matches!(tokio::time::timeout(PROBE, call).await, Ok(Ok(_)))
}
