//! A rollout carries every custom task to the new backbone: between the extraction (every
//! photo's features under the new backbone, stored on its node) and the commit, each task's
//! head is trained again from scratch on the new features from the task's stored ground truth,
//! gated against the task's current head (its top-1 on the same validation photos, with the old
//! backbone's features), and staged on every node; the commit then switches backbone and heads
//! together. A task whose head cannot be carried (its gate fails, or it cannot train) stops the
//! rollout before anything is committed, saying which task and why, unless the rollout is forced:
//! then such a task is left without a head (no labels) until it is fine-tuned again. The
//! general task needs nothing: it is the new backbone's own classifier. A rollout resumed after
//! a Tuner restart that had recorded its carried heads already (it was committing) takes them
//! as they are, without training them again.

use std::sync::Arc;

use ndpipe_catalog::{ModelVersion, ReplicaCatalog, TaskName};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::backbones::BackboneFiles;
use crate::control::JobEnv;
use crate::deploy::{first_refusal, stage_request};
use crate::finetune::{self, Target};
use crate::nodes::Members;
use crate::rollout::RolloutOptions;
use crate::{FinetuneRequest, Head, TunerError};

/// What became of one task in a rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskCarry {
    /// The task.
    pub task: String,
    /// Its version on the old backbone.
    pub from: String,
    /// Its version on the new backbone, when one was trained.
    pub version: Option<String>,
    /// The new head's validation top-1, and the old head's on the same photos.
    pub val_top1: Option<f32>,
    /// See `val_top1`.
    pub parent_val_top1: Option<f32>,
    /// Whether the new head serves the task after the rollout.
    pub carried: bool,
    /// Why it was not carried, when it was not.
    pub reason: Option<String>,
}

/// The heads a rollout commits with the backbone, and what became of every task.
pub(crate) struct Carried {
    pub(crate) heads: Vec<(ModelVersion, Head)>,
    pub(crate) tasks: Vec<TaskCarry>,
}

/// Retrains every custom task's head on `backbone`'s features (of `dim` values) and stages the
/// heads that pass their gate on every member; fails with [`TunerError::TasksNotCarried`] when a
/// task cannot be carried and the rollout is not `force`d. A `resumed` rollout takes the heads
/// it carried before the restart as they are.
pub(crate) async fn carry(
    env: &JobEnv<'_>,
    members: &Members,
    (backbone, dim): (&BackboneFiles, usize),
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
    options: RolloutOptions,
) -> Result<Carried, TunerError> {
    let (tasks, on_it): (Vec<ModelVersion>, Vec<ModelVersion>) = env
        .registry
        .active_all()?
        .into_iter()
        .filter(|v| !v.task.is_general())
        .partition(|v| v.backbone != backbone.sha256);
    let mut carried = Carried {
        heads: Vec::new(),
        tasks: Vec::new(),
    };
    if options.resumed {
        for version in on_it {
            carried_before(env, &mut carried, version)?;
        }
    }
    for old in tasks {
        let (line, head) = retrain(env, members, (backbone, dim), replicas, &old).await;
        if let Some(head) = head {
            carried.heads.push(head);
        }
        carried.tasks.push(line);
    }
    let refused: Vec<String> = carried
        .tasks
        .iter()
        .filter(|t| !t.carried)
        .map(|t| format!("task {}: {}", t.task, t.reason.as_deref().unwrap_or("")))
        .collect();
    if !refused.is_empty() && !options.force {
        return Err(TunerError::TasksNotCarried(refused.join("; ")));
    }
    stage(members, &carried.heads).await?;
    Ok(carried)
}

/// Adds `version`, a head on the new backbone that a rollout carried and recorded before the
/// Tuner restarted, to `carried` as it is.
fn carried_before(
    env: &JobEnv<'_>,
    carried: &mut Carried,
    version: ModelVersion,
) -> Result<(), TunerError> {
    let mut line = TaskCarry {
        task: version.task.to_string(),
        from: version.parent.clone().unwrap_or_else(|| version.id.clone()),
        version: Some(version.id.clone()),
        ..TaskCarry::default()
    };
    match env.registry.head(&version.id)? {
        Some(head) => {
            info!(task = %version.task, version = %version.id, "the task's head was carried before the Tuner restarted");
            line.carried = true;
            carried.heads.push((version, head));
        }
        None => line.reason = Some("its new head was not recorded".into()),
    }
    carried.tasks.push(line);
    Ok(())
}

/// Trains `old`'s task again on the new backbone's features; the task's line, and the new
/// version with its head when it passed its gate.
async fn retrain(
    env: &JobEnv<'_>,
    members: &Members,
    (backbone, dim): (&BackboneFiles, usize),
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
    old: &ModelVersion,
) -> (TaskCarry, Option<(ModelVersion, Head)>) {
    let mut line = TaskCarry {
        task: old.task.to_string(),
        from: old.id.clone(),
        ..TaskCarry::default()
    };
    // Trained as the head it replaces was (its runs, epochs and batch), from scratch.
    let d = FinetuneRequest::default();
    let setting = |key: &str| old.metrics.get(key).and_then(serde_json::Value::as_u64);
    let request = FinetuneRequest {
        task: old.task.clone(),
        from_scratch: true,
        deploy: false,
        load_balance: false,
        runs: setting("runs").map_or(d.runs, |r| r.clamp(1, 64) as u32),
        epochs: setting("epochs").map_or(d.epochs, |e| e.clamp(1, 10_000) as usize),
        batch: setting("batch").map_or(d.batch, |b| b.clamp(1, 1 << 20) as usize),
        ..d
    };
    let target = Target {
        backbone: Some((backbone.sha256.clone(), dim)),
        suffix: format!("-{}", old.task),
    };
    let report = finetune::finetune(env, replicas, members.clone(), None, request, &target).await;
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            warn!(task = %old.task, error = %e, "the task's head could not be trained on the new backbone");
            line.reason = Some(format!("training on the new backbone failed: {e}"));
            return (line, None);
        }
    };
    line.version = Some(report.version.clone());
    line.val_top1 = Some(report.gate.val_top1);
    line.parent_val_top1 = report.gate.parent_val_top1;
    if !report.gate.passed {
        line.reason = Some(format!(
            "its head on the new backbone validates at {:.1}%, its head now at {:.1}% on the same photos (margin {:.1} points)",
            report.gate.val_top1 * 100.0,
            report.gate.parent_val_top1.unwrap_or(0.0) * 100.0,
            report.gate.margin * 100.0
        ));
        return (line, None);
    }
    let loaded = env
        .registry
        .get(&report.version)
        .and_then(|v| Ok((env.registry.head(&v.id)?, v)));
    match loaded {
        Ok((Some(head), version)) => {
            info!(task = %old.task, version = %version.id, val_top1 = report.gate.val_top1, "the task's head is carried to the new backbone");
            line.carried = true;
            (line, Some((version, head)))
        }
        Ok((None, _)) => {
            line.reason = Some("its new head was not recorded".into());
            (line, None)
        }
        Err(e) => {
            line.reason = Some(e.to_string());
            (line, None)
        }
    }
}

/// Stages every carried head on every member (for the staged backbone), or fails naming the
/// node that refused.
async fn stage(members: &Members, heads: &[(ModelVersion, Head)]) -> Result<(), TunerError> {
    for (version, head) in heads {
        let request = stage_request(version, head)?;
        let staged = futures::future::join_all(members.nodes.iter().map(|n| {
            let request = request.clone();
            n.unary(request, |mut c, r| async move { c.stage_head(r).await })
        }))
        .await;
        if let Some(reason) = first_refusal(&members.nodes, &staged) {
            return Err(TunerError::DeployAborted {
                version: version.id.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// After the commit: the new backbone's version serves the general task, each carried head its
/// task, and a task that was not carried none.
pub(crate) fn record(
    env: &JobEnv<'_>,
    backbone: &BackboneFiles,
    carried: &Carried,
) -> Result<(), TunerError> {
    env.registry.set_active(&backbone.version)?;
    for (version, _) in &carried.heads {
        env.registry.set_active(&version.id)?;
    }
    for line in carried.tasks.iter().filter(|t| !t.carried) {
        if let Ok(task) = line.task.parse::<TaskName>() {
            env.registry.deactivate(&task)?;
        }
    }
    Ok(())
}
