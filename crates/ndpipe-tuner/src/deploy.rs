//! Two-phase deploy of a model version to every PipeStore, then the re-labelling fan-out.
//!
//! Phase one stages the head on every node (`StageHead`); if any node refuses, every node is told
//! to drop it (`AbortHead`) and nothing changes. Phase two commits it everywhere (`CommitHead`),
//! marks it active in the registry and has every node re-label its store (`Relabel`). A version
//! without a head on the Tuner (a PipeStore's pretrained model, when rolling back to it) skips
//! staging: the nodes still have it.

use ndpipe_catalog::ModelVersion;
use ndpipe_proto::{head_bytes, pb};
use ndpipe_util::churn::Churn;
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::nodes::{Node, Nodes, node_error};
use crate::registry::Registry;
use crate::{Head, TunerError};

/// What a deploy and the re-labelling after it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeployReport {
    /// The version now serving.
    pub version: String,
    /// Nodes that committed it.
    pub nodes: usize,
    /// Photos re-labelled, all nodes.
    pub relabelled: u64,
    /// Photos whose top-1 label was compared with the previous version's.
    pub compared: u64,
    /// Of those, photos whose top-1 label changed.
    pub changed: u64,
    /// `changed / compared`.
    pub changed_fraction: f64,
    /// How nodes re-labelled ("head": a matrix multiply over stored features; "full": the
    /// backbone again).
    pub modes: Vec<String>,
}

/// Deploys the registered `version` with its head from the registry: a rollback, or the deploy
/// of a version trained with `deploy: false`.
pub(crate) async fn deploy_version(
    nodes: &Nodes,
    registry: &Registry,
    version: &str,
) -> Result<DeployReport, TunerError> {
    let record = registry.get(version)?;
    let head = registry.head(version)?;
    deploy(nodes, registry, &record, head.as_ref()).await
}

/// Deploys `record` to every node, staging `head` first when there is one.
pub(crate) async fn deploy(
    nodes: &Nodes,
    registry: &Registry,
    record: &ModelVersion,
    head: Option<&Head>,
) -> Result<DeployReport, TunerError> {
    let nodes = nodes.snapshot();
    if nodes.is_empty() {
        return Err(TunerError::NoNodes);
    }
    let version = record.id.as_str();
    if let Some(head) = head {
        stage(&nodes, record, head).await?;
    }
    for n in &nodes {
        n.client()
            .commit_head(pb::CommitHeadRequest {
                version: version.to_string(),
            })
            .await
            .map_err(|e| node_error(n, format!("commit failed: {}", e.message())))?;
    }
    registry.set_active(version)?;
    let report = relabel(&nodes, version).await?;
    info!(
        version,
        changed = report.changed_fraction,
        "deployed and re-labelled"
    );
    Ok(report)
}

/// Phase one: every node stages the head, or every node drops it.
async fn stage(nodes: &[Node], record: &ModelVersion, head: &Head) -> Result<(), TunerError> {
    let weights = head.weights()?;
    let (bytes, crc32c) = head_bytes(&weights);
    let request = pb::StageHeadRequest {
        version: record.id.clone(),
        backbone_version: record.backbone.clone(),
        classes: weights.classes().to_vec(),
        input_dim: weights.input_dim() as u32,
        weights: bytes,
        crc32c,
        parent: record.parent.clone().unwrap_or_default(),
        metrics_json: record.metrics.to_string(),
    };
    let staged = futures::future::join_all(nodes.iter().map(|n| {
        let request = request.clone();
        async move { n.client().stage_head(request).await }
    }))
    .await;
    let Some((node, err)) = nodes
        .iter()
        .zip(&staged)
        .find_map(|(n, r)| r.as_ref().err().map(|e| (n, e.message().to_string())))
    else {
        return Ok(());
    };
    for n in nodes {
        let _ = n
            .client()
            .abort_head(pb::AbortHeadRequest {
                version: record.id.clone(),
            })
            .await;
    }
    Err(TunerError::DeployAborted {
        version: record.id.clone(),
        reason: format!("{}: {err}", node.label()),
    })
}

/// Every node re-labels its store with `version`; the figures add up.
async fn relabel(nodes: &[Node], version: &str) -> Result<DeployReport, TunerError> {
    let replies = futures::future::join_all(nodes.iter().map(|n| async move {
        n.client()
            .relabel(pb::RelabelRequest {
                version: version.to_string(),
            })
            .await
    }))
    .await;
    let mut report = DeployReport {
        version: version.to_string(),
        nodes: nodes.len(),
        ..DeployReport::default()
    };
    let mut churn = Churn::default();
    for (n, reply) in nodes.iter().zip(replies) {
        let reply = reply
            .map_err(|e| node_error(n, format!("re-labelling failed: {}", e.message())))?
            .into_inner();
        report.relabelled += reply.photos;
        churn += Churn {
            compared: reply.compared,
            changed: reply.changed,
        };
        report.modes.push(reply.mode);
    }
    report.compared = churn.compared;
    report.changed = churn.changed;
    report.changed_fraction = churn.fraction();
    Ok(report)
}
