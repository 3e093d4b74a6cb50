//! A backbone rollout, one cluster job in three phases:
//!
//! 1. **staging**: the backbone's ONNX file, manifest and class names stream to every node in
//!    checksummed chunks (`StageBackbone`); the node checks the file's sha256, loads it and
//!    keeps it durably before it answers. A node that refuses aborts the rollout everywhere
//!    (`AbortBackbone`) and nothing changes;
//! 2. **extracting**: every node runs the new backbone over all its photos (`ExtractBackbone`,
//!    the pipelined full re-labelling), storing features under the new backbone's version and
//!    labels under its pretrained version, while search and labels keep serving the old
//!    version; the job shows each node's photos done, rate and ETA. A node that fails or
//!    restarts is waited for and asked again: it resumes at its durable checkpoint (at most one
//!    batch lost). On a replicated cluster, a node that fails and no longer answers is lost to
//!    the job instead once every one of its photos has a copy on a live node: its photos pass
//!    to those holders (`ReplicaCatalog::fail_over`), whose commits extract them, and the
//!    syncer brings the node to the new backbone when it returns. Once every node's rate is known, slow nodes give the photos they have not
//!    reached to fast nodes, and a node that has finished takes from the one furthest from
//!    finishing ([`crate::rollout_balance`]), so that all finish together;
//! 3. **carrying the tasks** ([`crate::rollout_tasks`]): every custom task's head is trained
//!    again on the new features, gated against its head now, and staged on every node; a task
//!    that cannot be carried stops the rollout here, before any commit, unless it is forced;
//! 4. **committing**: once every node has finished (or was lost), the registry records the new
//!    pretrained version and the carried heads as what every node must serve, and every node
//!    commits (`CommitBackbone` with the heads: photos uploaded since are caught up, then it
//!    serves the new backbone and heads, then it times the backbone alone on a batch of its own
//!    tensors), then re-labels its photos for every carried task. A node that cannot commit is
//!    waited for and asked again too.
//!
//! A rollout that was running when the Tuner stopped is resumed when it opens again
//! ([`crate::resume`]): every phase is idempotent per node (staging a staged backbone changes
//! nothing, an extraction resumes at the node's checkpoint, a commit of the backbone a node
//! serves only commits the heads again), and the nodes that already serve the backbone (they
//! switched before the restart) are only committed again, not staged or extracted.
//!
//! The report sets the aggregate photos per second (the photos of the nodes' passes and
//! take-overs over the longest of them) against the sum of the nodes' model-only rates (each
//! node's timing at its commit, in this job, so that it delays no pass).

use std::time::{Duration, Instant};

use ndpipe_proto::pb::extract_backbone_event::Event;
use ndpipe_proto::{backbone_chunks, pb};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use std::sync::Arc;

use ndpipe_catalog::ReplicaCatalog;

use crate::TunerError;
use crate::backbones::BackboneFiles;
use crate::control::JobEnv;
use crate::deploy::first_refusal;
use crate::failover::answers;
use crate::jobs::Phase;
use crate::nodes::{Members, Node, node_error};
use crate::rollout_balance::{Watch, balance};
use crate::rollout_tasks::{self, TaskCarry};

/// How often a node that failed mid-rollout is asked again, at most, before the job fails.
const RESUMES: u32 = 20;
/// Polls for a node that failed to answer again, and the pause between two.
const RETURN_POLLS: u32 = 600;
const RETURN_POLL: Duration = Duration::from_millis(500);

/// What a rollout did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutReport {
    /// The backbone now served: the hex sha256 of its ONNX file.
    pub backbone: String,
    /// Its pretrained model version, now the active one.
    pub version: String,
    /// Per node.
    pub nodes: Vec<NodeRollout>,
    /// Photos with the new backbone's features and labels, all nodes.
    pub photos: u64,
    /// Wall-clock seconds of the extraction phase.
    pub extract_seconds: f64,
    /// Photos the nodes' last extraction calls and take-overs did, per second of the longest
    /// of them: the rate of the nodes together.
    pub images_per_second: f64,
    /// The sum of the nodes' model-only rates, measured in this job (at the commits).
    pub model_only_images_per_second: f64,
    /// `images_per_second / model_only_images_per_second`.
    pub efficiency: f64,
    /// Registered nodes the rollout left out (draining, lease ran out, ...), with the reason.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// What became of every custom task: its head trained again on the new backbone and
    /// carried, or (a forced rollout) left without one.
    #[serde(default)]
    pub tasks: Vec<TaskCarry>,
}

/// One node's part of a rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRollout {
    /// "name (node N)".
    pub node: String,
    /// Photos with the new backbone's features and labels.
    pub photos: u64,
    /// Seconds of the pass of its last extraction call.
    pub seconds: f64,
    /// Photos per second of its last extraction call.
    pub images_per_second: f64,
    /// Photos per second inside the model in the pass of its last extraction call (what load
    /// balancing went by).
    #[serde(default)]
    pub model_images_per_second: f64,
    /// The new backbone alone on a batch of the node's own tensors, timed at its commit.
    pub model_only_images_per_second: f64,
    /// Times the node failed and was asked again (it resumed at its checkpoint).
    pub resumed: u32,
    /// Photos it gave to faster nodes (load balancing), not in `photos`.
    #[serde(default)]
    pub given: u64,
    /// Photos of slower nodes it extracted for them (stored there), not in `photos`.
    #[serde(default)]
    pub taken: u64,
    /// Photos uploaded during the rollout, and photos that became its own (a lost node's),
    /// that its commit extracted.
    pub caught_up: u64,
    /// Copies it holds of other nodes' photos, left to their primaries (a replicated cluster).
    #[serde(default)]
    pub copies_left: u64,
    /// Why the job lost the node (it failed and no longer answered), when it did: its photos
    /// passed to live holders of copies, and it was not committed.
    #[serde(default)]
    pub lost: Option<String>,
    /// Photos of a lost node that passed to live holders of their copies.
    #[serde(default)]
    pub moved: u64,
    /// The node served the backbone already when the job was resumed after a Tuner restart
    /// (it switched before): it was only committed again, so its photos count as 0 here.
    #[serde(default)]
    pub switched_before_restart: bool,
}

/// How a rollout runs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RolloutOptions {
    /// Carry the tasks even when one's head cannot be.
    pub(crate) force: bool,
    /// The job was resumed after a Tuner restart: nodes that serve the backbone already are
    /// only committed again.
    pub(crate) resumed: bool,
}

/// What one node's extraction came to.
enum Extracted {
    /// It finished, after being asked again `resumed` times.
    Done(pb::ExtractBackboneDone, u32),
    /// It was lost for `reason`; `moved` of its photos passed to live holders of copies.
    Lost { reason: String, moved: u64 },
    /// It served the backbone already when a resumed job began: nothing to extract.
    Switched,
}

/// What one node's commit came to.
enum Committed {
    /// It committed: its extraction's report, how often it was asked again, its commit's reply.
    Yes(pb::ExtractBackboneDone, u32, pb::CommitBackboneReply),
    /// It was lost during the extraction.
    Lost { reason: String, moved: u64 },
}

/// Rolls `backbone` out to the `members`, carrying every task's head to it (`options.force`:
/// even when a task's cannot be); `replicas`, the replica map of a replicated cluster, lets the
/// job lose a node whose photos all have live copies.
pub(crate) async fn rollout(
    env: &JobEnv<'_>,
    members: &Members,
    backbone: &BackboneFiles,
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
    options: RolloutOptions,
) -> Result<RolloutReport, TunerError> {
    let nodes = &members.nodes;
    if nodes.is_empty() {
        return Err(TunerError::NoNodes);
    }
    let labels: Vec<String> = nodes.iter().map(Node::label).collect();
    env.progress.phase(Phase::Staging, &labels);
    let switched = if options.resumed {
        serving(nodes, &backbone.sha256).await
    } else {
        vec![false; nodes.len()]
    };
    let to_stage: Vec<Node> = nodes
        .iter()
        .zip(&switched)
        .filter(|(_, s)| !**s)
        .map(|(n, _)| n.clone())
        .collect();
    stage(&to_stage, backbone).await?;

    env.progress.phase(Phase::Extracting, &labels);
    let started = Instant::now();
    let watch = Watch::new(nodes.len());
    let (extracted, (shared, balanced_seconds)) = futures::join!(
        futures::future::join_all(nodes.iter().enumerate().map(|(i, n)| {
            let switched = switched[i];
            let (watch, sha) = (&watch, &backbone.sha256);
            async move {
                if switched {
                    watch.finish(i, false);
                    return Ok(Extracted::Switched);
                }
                extract(env, (n, i), sha, watch, replicas).await
            }
        })),
        balance(nodes, &backbone.sha256, &watch)
    );
    let extract_seconds = started.elapsed().as_secs_f64();
    let mut done = Vec::new();
    for result in extracted {
        done.push(result?);
    }
    if done.iter().all(|d| matches!(d, Extracted::Lost { .. })) {
        return Err(TunerError::NoNodes);
    }
    let survivors = Members {
        nodes: nodes
            .iter()
            .zip(&done)
            .filter(|(_, d)| matches!(d, Extracted::Done(..) | Extracted::Switched))
            .map(|(n, _)| n.clone())
            .collect(),
        skipped: members.skipped.clone(),
    };
    let carried = rollout_tasks::carry(
        env,
        &survivors,
        (backbone, backbone.feature_dim),
        replicas,
        options,
    )
    .await?;
    let heads: Vec<String> = carried.heads.iter().map(|(v, _)| v.id.clone()).collect();

    env.progress.phase(Phase::Committing, &labels);
    rollout_tasks::record(env, backbone, &carried)?;
    let intent = env.registry.intent()?.to_string();
    let commits = commit_all(env, nodes, done, &backbone.sha256, &heads).await;
    let mut report = RolloutReport {
        backbone: backbone.sha256.clone(),
        version: backbone.version.clone(),
        extract_seconds,
        skipped: members.skipped.clone(),
        tasks: carried.tasks.clone(),
        ..RolloutReport::default()
    };
    let (mut this_job, mut longest) = (0u64, balanced_seconds);
    let rows = nodes.iter().zip(commits).zip(shared).zip(switched);
    for (((n, committed), shared), switched_before_restart) in rows {
        let (extract, resumed, commit) = match committed? {
            Committed::Yes(extract, resumed, reply) => (extract, resumed, reply),
            Committed::Lost { reason, moved } => {
                report.nodes.push(NodeRollout {
                    node: n.label(),
                    given: shared.given,
                    taken: shared.taken,
                    lost: Some(reason),
                    moved,
                    ..NodeRollout::default()
                });
                continue;
            }
        };
        let caught_up = commit.caught_up;
        env.nodes.set_version(n.id, &intent)?;
        this_job += extract.this_call + shared.taken;
        longest = longest.max(extract.seconds);
        report.photos += extract.photos + caught_up + shared.taken;
        report.model_only_images_per_second += commit.model_only_images_per_second;
        report.nodes.push(NodeRollout {
            node: n.label(),
            photos: extract.photos + caught_up,
            seconds: extract.seconds,
            images_per_second: extract.images_per_second,
            model_images_per_second: extract.model_images_per_second,
            model_only_images_per_second: commit.model_only_images_per_second,
            resumed,
            given: shared.given,
            taken: shared.taken,
            caught_up,
            copies_left: extract.left_out,
            switched_before_restart,
            ..NodeRollout::default()
        });
    }
    relabel_carried(env, &survivors, &heads).await?;
    report.images_per_second = this_job as f64 / longest.max(1e-9);
    report.efficiency = if report.model_only_images_per_second > 0.0 {
        report.images_per_second / report.model_only_images_per_second
    } else {
        0.0
    };
    info!(
        backbone = %report.backbone,
        version = %report.version,
        photos = report.photos,
        images_per_second = report.images_per_second,
        efficiency = report.efficiency,
        "backbone rolled out"
    );
    Ok(report)
}

/// Which of `nodes` serve backbone `sha` already (a node that does not answer counts as not).
async fn serving(nodes: &[Node], sha: &str) -> Vec<bool> {
    let asked = futures::future::join_all(nodes.iter().map(|n| {
        n.unary(pb::InventoryRequest::default(), |mut c, r| async move {
            c.inventory(r).await
        })
    }))
    .await;
    nodes
        .iter()
        .zip(asked)
        .map(|(n, reply)| {
            let serves = reply.is_ok_and(|r| r.backbone_version == sha);
            if serves {
                info!(node = %n.label(), backbone = %sha, "the node switched before the Tuner restarted: it is only committed again");
            }
            serves
        })
        .collect()
}

/// Phase four: commits every node that finished its extraction (all at once, or one after
/// another `env.commit_interval` apart), each shown done in its progress row once it serves the
/// backbone.
async fn commit_all(
    env: &JobEnv<'_>,
    nodes: &[Node],
    done: Vec<Extracted>,
    sha: &str,
    heads: &[String],
) -> Vec<Result<Committed, TunerError>> {
    let each = nodes.iter().zip(done).enumerate();
    if env.commit_interval.is_zero() {
        let all = each.map(|(i, (n, d))| commit_one(env, (n, i), d, sha, heads));
        return futures::future::join_all(all).await;
    }
    let mut out = Vec::new();
    for (i, (n, d)) in each {
        if i > 0 {
            tokio::time::sleep(env.commit_interval).await;
        }
        out.push(commit_one(env, (n, i), d, sha, heads).await);
    }
    out
}

/// Commits node `i`, `n`, after its extraction `d` (a lost node is not committed), its progress
/// row done once it serves the backbone.
async fn commit_one(
    env: &JobEnv<'_>,
    (n, i): (&Node, usize),
    d: Extracted,
    sha: &str,
    heads: &[String],
) -> Result<Committed, TunerError> {
    let (extract, resumed) = match d {
        Extracted::Done(extract, resumed) => (extract, resumed),
        Extracted::Switched => (pb::ExtractBackboneDone::default(), 0),
        Extracted::Lost { reason, moved } => return Ok(Committed::Lost { reason, moved }),
    };
    let reply = commit(env, n, sha, heads).await?;
    env.progress.node(i, 1, 1);
    Ok(Committed::Yes(extract, resumed, reply))
}

/// After the commits: every node re-labels its photos for each carried task (its new head over
/// the new backbone's stored features).
async fn relabel_carried(
    env: &JobEnv<'_>,
    members: &Members,
    heads: &[String],
) -> Result<(), TunerError> {
    for version in heads {
        crate::deploy::relabel(&members.nodes, version, env.progress).await?;
    }
    Ok(())
}

/// Phase one: every node stages the backbone, or every node drops it.
async fn stage(nodes: &[Node], backbone: &BackboneFiles) -> Result<(), TunerError> {
    let chunks = backbone_chunks(
        &backbone.sha256,
        &backbone.manifest_json,
        &backbone.classes,
        &backbone.onnx,
    );
    let staged = futures::future::join_all(nodes.iter().map(|n| {
        let stream = futures::stream::iter(chunks.clone());
        n.unary(stream, |mut c, r| async move { c.stage_backbone(r).await })
    }))
    .await;
    let Some(reason) = first_refusal(nodes, &staged) else {
        return Ok(());
    };
    futures::future::join_all(nodes.iter().map(|n| {
        let request = pb::AbortBackboneRequest {
            backbone_version: backbone.sha256.clone(),
        };
        n.unary(request, |mut c, r| async move { c.abort_backbone(r).await })
    }))
    .await;
    Err(TunerError::DeployAborted {
        version: backbone.version.clone(),
        reason,
    })
}

/// Phase two on node `i`: extraction until it reports done, asking again (after the node
/// answers again) when it fails, its progress told to `watch`; or, with `replicas`, the node
/// lost once it fails and no longer answers, when every one of its photos has a live copy.
async fn extract(
    env: &JobEnv<'_>,
    (node, i): (&Node, usize),
    sha256: &str,
    watch: &Watch,
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
) -> Result<Extracted, TunerError> {
    let mut node = node.clone();
    let mut resumed = 0;
    let result = loop {
        match extract_once(env, &node, sha256, i, watch).await {
            Ok(done) => break Ok(Extracted::Done(done, resumed)),
            Err(e) if resumed < RESUMES => {
                if let Some(lost) = lose(&node, &e, replicas).await? {
                    break Ok(lost);
                }
                warn!(node = %node.label(), error = %e, "the node failed mid-rollout: asking again once it answers");
                resumed += 1;
                match returned(env, &node).await {
                    Ok(now) => node = now,
                    Err(e) => break Err(e),
                }
            }
            Err(e) => break Err(e),
        }
    };
    watch.finish(i, matches!(result, Ok(Extracted::Done(..))));
    result
}

/// `node`, which failed with `error`, lost to the job when there is a replica map, it no
/// longer answers and every one of its photos now has a live holder of a copy as its primary;
/// `None` when it is to be waited for.
async fn lose(
    node: &Node,
    error: &TunerError,
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
) -> Result<Option<Extracted>, TunerError> {
    let Some(map) = replicas else {
        return Ok(None);
    };
    if answers(node).await {
        return Ok(None);
    }
    let (map, name) = (map.clone(), node.name.clone());
    let moved = tokio::task::spawn_blocking(move || map.fail_over(&name))
        .await
        .map_err(|e| TunerError::Internal(e.to_string()))??;
    if moved.stranded_total > 0 {
        warn!(node = %node.label(), stranded = moved.stranded_total,
            "a node was lost mid-rollout with photos no live node holds: waiting for it");
        return Ok(None);
    }
    warn!(node = %node.label(), moved = moved.moved, error = %error,
        "a node was lost mid-rollout: its photos pass to the holders of their copies");
    Ok(Some(Extracted::Lost {
        reason: error.to_string(),
        moved: moved.moved,
    }))
}

/// One extraction call on `node`, its progress (photos done, rate, ETA) shown as row `i`.
async fn extract_once(
    env: &JobEnv<'_>,
    node: &Node,
    sha256: &str,
    i: usize,
    watch: &Watch,
) -> Result<pb::ExtractBackboneDone, TunerError> {
    let failed =
        |e: tonic::Status| node_error(node, format!("re-extraction failed: {}", e.message()));
    let request = pb::ExtractBackboneRequest {
        backbone_version: sha256.to_string(),
    };
    let mut events = node
        .open(
            request,
            |mut c, r| async move { c.extract_backbone(r).await },
        )
        .await
        .map_err(failed)?;
    loop {
        match node.next(&mut events).await.map_err(failed)? {
            Some(pb::ExtractBackboneEvent {
                event: Some(Event::Progress(p)),
            }) => {
                watch.saw(i, &p);
                env.progress
                    .node_rate(i, p.done, p.total, p.images_per_second);
            }
            Some(pb::ExtractBackboneEvent {
                event: Some(Event::Done(done)),
            }) => {
                env.progress
                    .node_rate(i, done.photos, done.photos, done.images_per_second);
                return Ok(done);
            }
            Some(_) => {}
            None => {
                return Err(node_error(
                    node,
                    "re-extraction failed: the stream ended without a result",
                ));
            }
        }
    }
}

/// Phase three on `node`: its commit, asked again (after the node answers again) when it
/// fails. Returns its reply (the photos it caught up, its model-only rate).
async fn commit(
    env: &JobEnv<'_>,
    node: &Node,
    sha256: &str,
    heads: &[String],
) -> Result<pb::CommitBackboneReply, TunerError> {
    let mut node = node.clone();
    let mut resumed = 0;
    loop {
        let request = pb::CommitBackboneRequest {
            backbone_version: sha256.to_string(),
            heads: heads.to_vec(),
        };
        let result = node
            .unary(
                request,
                |mut c, r| async move { c.commit_backbone(r).await },
            )
            .await;
        match result {
            Ok(reply) => return Ok(reply),
            Err(e) if resumed < RESUMES => {
                warn!(node = %node.label(), error = %e.message(), "commit failed: asking again once the node answers");
                resumed += 1;
                node = returned(env, &node).await?;
            }
            Err(e) => {
                return Err(node_error(&node, format!("commit failed: {}", e.message())));
            }
        }
    }
}

/// `node` once it answers again (registered under the same name, perhaps at a new address),
/// polled a bounded number of times.
async fn returned(env: &JobEnv<'_>, node: &Node) -> Result<Node, TunerError> {
    for _ in 0..RETURN_POLLS {
        tokio::time::sleep(RETURN_POLL).await;
        let Some(now) = env.nodes.named(&node.name)? else {
            continue;
        };
        let answered = now
            .unary(pb::InventoryRequest::default(), |mut c, r| async move {
                c.inventory(r).await
            })
            .await;
        if answered.is_ok() {
            info!(node = %now.label(), "the node answers again: resuming the rollout there");
            return Ok(now);
        }
    }
    Err(node_error(
        node,
        "did not answer again during the rollout".to_string(),
    ))
}
