//! Two-phase deploy of a model version (one task's) to the nodes, then the re-labelling fan-out;
//! and bringing one lagging node to every task's active version (`bring`, for the syncer).
//!
//! Phase one stages the head on every node (`StageHead`; the node writes it durably before it
//! answers); if any node refuses, every node is told to drop it (`AbortHead`) and nothing
//! changes. Then the registry records the version as the one every node must serve (the
//! intent), and phase two commits it on every node at once (`CommitHead`, idempotent). A node
//! whose commit fails is reported as lagging and brought to the version by the syncer when it is
//! next seen. The nodes that committed re-label their stores (`Relabel`, a stream of progress
//! events watched like every stream: a node silent for the node timeout fails the deploy). A
//! version without a head on the Tuner (a PipeStore's pretrained model, when rolling back to it)
//! skips staging: the nodes still have it.

use ndpipe_catalog::ModelVersion;
use ndpipe_proto::pb::relabel_event::Event;
use ndpipe_proto::{Serving, pb, put_head};
use ndpipe_util::churn::Churn;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::control::JobEnv;
use crate::jobs::{Phase, Progress};
use crate::nodes::{Members, Node, node_error};
use crate::{Head, TunerError};

/// What a deploy and the re-labelling after it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeployReport {
    /// The version now serving.
    pub version: String,
    /// Its task.
    #[serde(default)]
    pub task: String,
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
    /// Nodes whose commit failed, with the reason: the Tuner brings them to the version when
    /// they are next seen.
    #[serde(default)]
    pub lagging: Vec<String>,
    /// Registered nodes the deploy left out (draining, lease ran out, ...), with the reason:
    /// they too are brought to the version when next seen.
    #[serde(default)]
    pub skipped: Vec<String>,
}

/// Deploys `record` to the `members`, staging `head` first when there is one: it becomes its
/// task's version on every node, and the nodes re-label their photos for that task.
pub(crate) async fn deploy(
    env: &JobEnv<'_>,
    members: &Members,
    record: &ModelVersion,
    head: Option<&Head>,
) -> Result<DeployReport, TunerError> {
    let nodes = &members.nodes;
    if nodes.is_empty() {
        return Err(TunerError::NoNodes);
    }
    let version = record.id.as_str();
    env.progress.phase(Phase::Deploying, &[]);
    if let Some(head) = head {
        stage(nodes, record, head).await?;
    }
    env.registry.set_active(version)?;
    let intent = env.registry.intent()?.to_string();
    let commits = futures::future::join_all(nodes.iter().map(|n| commit(n, version))).await;
    let mut committed = Vec::new();
    let mut lagging = Vec::new();
    for (n, result) in nodes.iter().zip(commits) {
        match result.and_then(|()| env.nodes.set_version(n.id, &intent)) {
            Ok(()) => committed.push(n.clone()),
            Err(e) => {
                warn!(node = %n.label(), version, error = %e, "commit failed: the node is brought to the version later");
                lagging.push(e.to_string());
            }
        }
    }
    let mut report = relabel(&committed, version, env.progress).await?;
    report.task = record.task.to_string();
    report.lagging = lagging;
    report.skipped = members.skipped.clone();
    info!(
        version,
        task = %record.task,
        nodes = report.nodes,
        lagging = report.lagging.len(),
        changed = report.changed_fraction,
        "deployed and re-labelled"
    );
    Ok(report)
}

/// Brings one node to what every node must serve, `intent`: nothing when it serves it already;
/// else, when it runs another backbone than the intent's (it missed a rollout's commit), that
/// backbone committed first with the heads staged for it; then each task's version it lacks:
/// the head staged, committed and the node's photos re-labelled for the task.
pub(crate) async fn bring(
    node: &Node,
    intent: &[(ModelVersion, Option<Head>)],
) -> Result<(), TunerError> {
    let before = served(node).await?;
    let missing = |served: &Serving| -> Vec<&(ModelVersion, Option<Head>)> {
        intent
            .iter()
            .filter(|(v, _)| served.version(v.task.as_str()) != Some(v.id.as_str()))
            .collect()
    };
    if missing(&before.1).is_empty() {
        return Ok(());
    }
    let backbone = intent.iter().map(|(v, _)| &v.backbone).next();
    if let Some(backbone) = backbone.filter(|b| **b != before.0) {
        let heads = intent
            .iter()
            .filter(|(v, h)| h.is_some() && v.backbone == *backbone)
            .map(|(v, _)| v.id.clone())
            .collect();
        let request = pb::CommitBackboneRequest {
            backbone_version: backbone.clone(),
            heads,
        };
        node.unary(
            request,
            |mut c, r| async move { c.commit_backbone(r).await },
        )
        .await
        .map_err(|e| node_error(node, format!("backbone commit failed: {}", e.message())))?;
    }
    let now = served(node).await?;
    for (record, head) in missing(&now.1) {
        if let Some(head) = head {
            let request = stage_request(record, head)?;
            node.unary(request, |mut c, r| async move { c.stage_head(r).await })
                .await
                .map_err(|e| node_error(node, format!("staging failed: {}", e.message())))?;
        }
        commit(node, &record.id).await?;
        relabel_one(node, &record.id, |_, _| {}).await?;
    }
    Ok(())
}

/// The backbone `node` runs and the versions it serves.
async fn served(node: &Node) -> Result<(String, Serving), TunerError> {
    let inventory = node
        .unary(pb::InventoryRequest::default(), |mut c, r| async move {
            c.inventory(r).await
        })
        .await
        .map_err(|e| node_error(node, format!("inventory failed: {}", e.message())))?;
    let serving = inventory.active_version.parse()?;
    Ok((inventory.backbone_version, serving))
}

/// The stage request of `record`'s `head`, with its task and label rules.
pub(crate) fn stage_request(
    record: &ModelVersion,
    head: &Head,
) -> Result<pb::StageHeadRequest, TunerError> {
    let mut request = pb::StageHeadRequest {
        version: record.id.clone(),
        backbone_version: record.backbone.clone(),
        parent: record.parent.clone().unwrap_or_default(),
        metrics_json: record.metrics.to_string(),
        task: record.task.to_string(),
        ..Default::default()
    };
    put_head(&mut request, &head.weights()?);
    Ok(request)
}

/// Phase one: every node stages the head, or every node drops it.
async fn stage(nodes: &[Node], record: &ModelVersion, head: &Head) -> Result<(), TunerError> {
    let request = stage_request(record, head)?;
    let staged = futures::future::join_all(nodes.iter().map(|n| {
        let request = request.clone();
        n.unary(request, |mut c, r| async move { c.stage_head(r).await })
    }))
    .await;
    let Some(reason) = first_refusal(nodes, &staged) else {
        return Ok(());
    };
    futures::future::join_all(nodes.iter().map(|n| {
        let request = pb::AbortHeadRequest {
            version: record.id.clone(),
        };
        n.unary(request, |mut c, r| async move { c.abort_head(r).await })
    }))
    .await;
    Err(TunerError::DeployAborted {
        version: record.id.clone(),
        reason,
    })
}

/// "node: why" of the first of `nodes` whose call in `results` failed, if one did.
pub(crate) fn first_refusal<T>(
    nodes: &[Node],
    results: &[Result<T, tonic::Status>],
) -> Option<String> {
    nodes.iter().zip(results).find_map(|(n, r)| {
        r.as_ref()
            .err()
            .map(|e| format!("{}: {}", n.label(), e.message()))
    })
}

/// Commits `version` on `node`.
async fn commit(node: &Node, version: &str) -> Result<(), TunerError> {
    let request = pb::CommitHeadRequest {
        version: version.to_string(),
    };
    node.unary(request, |mut c, r| async move { c.commit_head(r).await })
        .await
        .map(drop)
        .map_err(|e| node_error(node, format!("commit failed: {}", e.message())))
}

/// Every node re-labels its store with `version`, reporting progress; the figures add up.
pub(crate) async fn relabel(
    nodes: &[Node],
    version: &str,
    progress: &Progress,
) -> Result<DeployReport, TunerError> {
    let labels: Vec<String> = nodes.iter().map(Node::label).collect();
    progress.phase(Phase::Relabelling, &labels);
    let replies =
        futures::future::join_all(nodes.iter().enumerate().map(|(i, n)| {
            relabel_one(n, version, move |done, total| progress.node(i, done, total))
        }))
        .await;
    let mut report = DeployReport {
        version: version.to_string(),
        nodes: nodes.len(),
        ..DeployReport::default()
    };
    let mut churn = Churn::default();
    for reply in replies {
        let reply = reply?;
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

/// `node` re-labels its store with `version`; `progress` hears (done, total) as it goes.
async fn relabel_one(
    node: &Node,
    version: &str,
    mut progress: impl FnMut(u64, u64),
) -> Result<pb::RelabelReply, TunerError> {
    let failed =
        |e: tonic::Status| node_error(node, format!("re-labelling failed: {}", e.message()));
    let request = pb::RelabelRequest {
        version: version.to_string(),
    };
    let mut events = node
        .open(request, |mut c, r| async move { c.relabel(r).await })
        .await
        .map_err(failed)?;
    loop {
        match node.next(&mut events).await.map_err(failed)? {
            Some(pb::RelabelEvent {
                event: Some(Event::Progress(p)),
            }) => progress(p.done, p.total),
            Some(pb::RelabelEvent {
                event: Some(Event::Done(reply)),
            }) => return Ok(reply),
            Some(_) => {}
            None => {
                return Err(node_error(
                    node,
                    "re-labelling failed: the stream ended without a result",
                ));
            }
        }
    }
}
