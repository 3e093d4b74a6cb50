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
//!    batch lost). Once every node's rate is known, slow nodes give the photos they have not
//!    reached to fast nodes, and a node that has finished takes from the one furthest from
//!    finishing ([`crate::rollout_balance`]), so that all finish together;
//! 3. **committing**: once every node has finished, the registry records the new pretrained
//!    version as the one every node must serve, and every node commits (`CommitBackbone`:
//!    photos uploaded since are caught up, then it serves the new backbone, then it times the
//!    backbone alone on a batch of its own tensors). A node that cannot commit is waited for
//!    and asked again too.
//!
//! The report sets the aggregate photos per second (the photos of the nodes' passes and
//! take-overs over the longest of them) against the sum of the nodes' model-only rates (each
//! node's timing at its commit, in this job, so that it delays no pass).

use std::time::{Duration, Instant};

use ndpipe_proto::pb::extract_backbone_event::Event;
use ndpipe_proto::{backbone_chunks, pb};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::TunerError;
use crate::backbones::BackboneFiles;
use crate::control::JobEnv;
use crate::deploy::first_refusal;
use crate::jobs::Phase;
use crate::nodes::{Members, Node, node_error};
use crate::rollout_balance::{Watch, balance};

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
    /// Photos uploaded during the rollout that its commit caught up.
    pub caught_up: u64,
    /// Copies it holds of other nodes' photos, left to their primaries (a replicated cluster).
    #[serde(default)]
    pub copies_left: u64,
}

/// Rolls `backbone` out to the `members`.
pub(crate) async fn rollout(
    env: &JobEnv<'_>,
    members: &Members,
    backbone: &BackboneFiles,
) -> Result<RolloutReport, TunerError> {
    let nodes = &members.nodes;
    if nodes.is_empty() {
        return Err(TunerError::NoNodes);
    }
    let labels: Vec<String> = nodes.iter().map(Node::label).collect();
    env.progress.phase(Phase::Staging, &labels);
    stage(nodes, backbone).await?;

    env.progress.phase(Phase::Extracting, &labels);
    let started = Instant::now();
    let watch = Watch::new(nodes.len());
    let (extracted, (shared, balanced_seconds)) = futures::join!(
        futures::future::join_all(nodes.iter().enumerate().map(|(i, n)| extract(
            env,
            n,
            &backbone.sha256,
            i,
            &watch
        )),),
        balance(nodes, &backbone.sha256, &watch)
    );
    let extract_seconds = started.elapsed().as_secs_f64();
    let mut done = Vec::new();
    for result in extracted {
        done.push(result?);
    }

    env.progress.phase(Phase::Committing, &labels);
    env.registry.set_active(&backbone.version)?;
    let commits =
        futures::future::join_all(nodes.iter().map(|n| commit(env, n, &backbone.sha256))).await;
    let mut report = RolloutReport {
        backbone: backbone.sha256.clone(),
        version: backbone.version.clone(),
        extract_seconds,
        skipped: members.skipped.clone(),
        ..RolloutReport::default()
    };
    let (mut this_job, mut longest) = (0u64, balanced_seconds);
    for (((n, (extract, resumed)), commit), shared) in
        nodes.iter().zip(done).zip(commits).zip(shared)
    {
        let commit = commit?;
        let caught_up = commit.caught_up;
        env.nodes.set_version(n.id, &backbone.version)?;
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
        });
    }
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
/// answers again) when it fails, its progress told to `watch`. Returns its report and how
/// often it was asked again.
async fn extract(
    env: &JobEnv<'_>,
    node: &Node,
    sha256: &str,
    i: usize,
    watch: &Watch,
) -> Result<(pb::ExtractBackboneDone, u32), TunerError> {
    let mut node = node.clone();
    let mut resumed = 0;
    let result = loop {
        match extract_once(env, &node, sha256, i, watch).await {
            Ok(done) => break Ok((done, resumed)),
            Err(e) if resumed < RESUMES => {
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
    watch.finish(i);
    result
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
) -> Result<pb::CommitBackboneReply, TunerError> {
    let mut node = node.clone();
    let mut resumed = 0;
    loop {
        let request = pb::CommitBackboneRequest {
            backbone_version: sha256.to_string(),
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
            .unary(pb::InventoryRequest {}, |mut c, r| async move {
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
