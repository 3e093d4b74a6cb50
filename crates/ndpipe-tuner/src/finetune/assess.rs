//! A trained head, assessed before it is recorded: its label rules calibrated, its per-class
//! figures, the share of validation photos it would call `other`, and its quality gate against
//! its parent on the same validation photos (the parent's own backbone's features of them, when
//! a rollout trains the head on another backbone).

use std::collections::HashMap;

use ndpipe_model::OTHER;
use ndpipe_proto::pb::GetFeaturesRequest;
use ndpipe_proto::{Features, decode_chunk};

use super::intake::Intake;
use super::quality::{ClassMetrics, Gate, class_metrics, parent_top1};
use super::request::FinetuneRequest;
use super::trainer::validate;
use crate::nodes::{Node, node_error};
use crate::registry::Registry;
use crate::{Head, TunerError};

/// What the assessment found.
pub(super) struct Assessed {
    pub(super) gate: Gate,
    pub(super) per_class: Vec<ClassMetrics>,
    pub(super) val_other_share: f32,
}

/// Calibrates `head`'s label rules on the job's validation set and training class means,
/// measures it, and judges it against `parent` (the task's version before) with `margin`.
/// `backbone` is the one the job's features came from.
pub(super) async fn assess(
    registry: &Registry,
    req: &FinetuneRequest,
    (nodes, intake): (&[Node], &Intake),
    head: &mut Head,
    parent: Option<&str>,
    (backbone, margin): (&str, f32),
) -> Result<Assessed, TunerError> {
    let val = intake.val();
    head.set_acceptance(
        intake
            .means()
            .acceptance(req.floor, &val, req.novelty_quantile),
    )?;
    let val_top1 = validate(head, &val)?;
    let parent_top1 = match parent {
        Some(id) => parent_score(registry, id, head, (nodes, intake), &val, backbone).await?,
        None => None,
    };
    Ok(Assessed {
        gate: Gate::judge(val_top1, parent_top1, margin, req.force),
        per_class: class_metrics(head, &val)?,
        val_other_share: other_share(head, &val),
    })
}

/// The share of `val` that `head` labels [`OTHER`] (0 for a head PipeStores cannot run).
fn other_share(head: &Head, val: &Features) -> f32 {
    let Ok(weights) = head.weights() else {
        return 0.0;
    };
    if val.is_empty() {
        return 0.0;
    }
    let other = val
        .values
        .chunks_exact(val.dim)
        .filter(|row| weights.label(row, 1, None)[0].0 == OTHER)
        .count();
    other as f32 / val.len() as f32
}

/// The top-1 of version `id` on the job's validation photos: with the job's features when it
/// runs on the same backbone, else with its own backbone's features of the same photos, fetched
/// from the nodes that sent them. `None` for a version without a head (a backbone's own
/// classifier, which no custom task derives from).
async fn parent_score(
    registry: &Registry,
    id: &str,
    head: &Head,
    (nodes, intake): (&[Node], &Intake),
    val: &Features,
    backbone: &str,
) -> Result<Option<f32>, TunerError> {
    let record = registry.get(id)?;
    let Some(parent) = registry.head(id)? else {
        return Ok(None);
    };
    let values = if record.backbone == backbone {
        val.values.clone()
    } else {
        served_features(nodes, intake, val).await?
    };
    parent_top1(&parent, head.classes(), &values, &val.labels)
}

/// The features of `val`'s photos under the backbone each node serves, in `val`'s order.
async fn served_features(
    nodes: &[Node],
    intake: &Intake,
    val: &Features,
) -> Result<Vec<f32>, TunerError> {
    let position: HashMap<u64, usize> = val
        .photo_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, i))
        .collect();
    let mut values = vec![0f32; val.values.len()];
    for (i, ids) in intake.val_owners() {
        let ids: Vec<u64> = ids
            .into_iter()
            .filter(|id| position.contains_key(id))
            .collect();
        if ids.is_empty() {
            continue;
        }
        let node = &nodes[i];
        let request = GetFeaturesRequest {
            ids: ids.clone(),
            stored_only: false,
        };
        let chunk = node
            .unary(request, |mut c, r| async move { c.get_features(r).await })
            .await
            .map_err(|e| node_error(node, format!("fetching features: {}", e.message())))?;
        let features = decode_chunk(&chunk, u32::MAX as usize)
            .map_err(|e| node_error(node, format!("fetching features: {e}")))?;
        if features.dim != val.dim || features.len() != ids.len() {
            return Err(node_error(
                node,
                format!(
                    "asked for {} features of {}, sent {} of {}",
                    ids.len(),
                    val.dim,
                    features.len(),
                    features.dim
                ),
            ));
        }
        for (id, row) in ids.iter().zip(features.values.chunks_exact(val.dim)) {
            let at = position[id] * val.dim;
            values[at..at + val.dim].copy_from_slice(row);
        }
    }
    Ok(values)
}
