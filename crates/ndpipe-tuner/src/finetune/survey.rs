//! What the nodes hold before a fine-tune (their inventories: backbone, the task's classes and
//! training photos), whether training must read through the cache, and the head the job starts
//! from.

use std::collections::BTreeSet;

use ndpipe_catalog::TaskName;
use ndpipe_proto::{Serving, pb};
use tracing::info;

use super::cached::CacheSetup;
use super::request::{FinetuneRequest, ValSplit};
use crate::nodes::{Node, node_error};
use crate::registry::Registry;
use crate::{Head, HeadConfig, TunerError};

/// What the nodes' inventories say about the job.
pub(super) struct Survey {
    /// The backbone every node runs.
    pub(super) backbone: String,
    pub(super) feature_dim: usize,
    /// The general task's version the nodes serve (the backbone's pretrained one; "" for none).
    pub(super) pretrained: String,
    /// "val" or "test".
    pub(super) val_split: &'static str,
    /// Classes with training photos on any node.
    pub(super) labels: BTreeSet<String>,
    /// Training photos per node.
    pub(super) have: Vec<u64>,
}

impl Survey {
    /// Asks every node what it holds of `task`; fails when no node knows the task, or its
    /// training photos span fewer than two classes.
    pub(super) async fn take(
        nodes: &[Node],
        task: &TaskName,
        val_split: ValSplit,
    ) -> Result<Self, TunerError> {
        let request = pb::InventoryRequest {
            task: task.to_string(),
        };
        let replies = futures::future::join_all(nodes.iter().map(|n| {
            n.unary(
                request.clone(),
                |mut c, r| async move { c.inventory(r).await },
            )
        }))
        .await;
        let inventories = nodes
            .iter()
            .zip(replies)
            .map(|(n, r)| {
                r.map_err(|e| node_error(n, format!("inventory failed: {}", e.message())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let backbone = inventories[0].backbone_version.clone();
        for (node, inv) in nodes.iter().zip(&inventories) {
            if inv.backbone_version != backbone {
                return Err(node_error(
                    node,
                    format!(
                        "runs backbone {}, others run {backbone}",
                        inv.backbone_version
                    ),
                ));
            }
        }
        if !inventories.iter().any(|i| i.task_known) {
            return Err(TunerError::UnknownTask(task.to_string()));
        }
        let counts = || inventories.iter().flat_map(|i| &i.classes);
        let val_split = match val_split {
            ValSplit::Auto if counts().any(|c| c.val > 0) => "val",
            ValSplit::Auto | ValSplit::Carve => "carve",
            ValSplit::Val => "val",
        };
        let labels: BTreeSet<String> = counts()
            .filter(|c| c.train > 0)
            .map(|c| c.label.clone())
            .collect();
        if labels.len() < 2 {
            return Err(TunerError::TooFewClasses {
                task: task.to_string(),
                classes: labels.into_iter().collect(),
            });
        }
        let serving: Serving = inventories[0].active_version.parse()?;
        Ok(Survey {
            feature_dim: inventories[0].feature_dim as usize,
            pretrained: serving
                .version(TaskName::GENERAL)
                .unwrap_or_default()
                .to_string(),
            val_split,
            labels,
            have: inventories
                .iter()
                .map(|i| i.classes.iter().map(|c| c.train).sum())
                .collect(),
            backbone,
        })
    }

    /// Training through a cache, when the job's features exceed the memory budget.
    pub(super) fn cache_setup(&self, nodes: &[Node], req: &FinetuneRequest) -> Option<CacheSetup> {
        let feature_bytes = self.have.iter().sum::<u64>() * self.feature_dim as u64 * 4;
        if req.memory_budget_bytes == 0 || feature_bytes <= req.memory_budget_bytes {
            return None;
        }
        info!(
            feature_bytes,
            budget = req.memory_budget_bytes,
            policy = %req.cache_policy,
            "features exceed the memory budget: training reads them through the cache"
        );
        Some(CacheSetup {
            policy: req.cache_policy,
            budget_bytes: req.memory_budget_bytes,
            nodes: nodes.to_vec(),
            handle: tokio::runtime::Handle::current(),
            dim: self.feature_dim,
            batch: req.batch,
            seed: req.seed,
        })
    }
}

/// The head to start from: the task's active version's (with new classes added) or, for a
/// request from scratch or where there is none, a new one; and the version it derives from (the
/// task's active version, whichever head the job starts from: the one it would replace).
pub(super) fn starting_head(
    registry: &Registry,
    req: &FinetuneRequest,
    survey: &Survey,
) -> Result<(Head, Option<String>), TunerError> {
    if survey.labels.is_empty() {
        return Err(TunerError::EmptyData);
    }
    let parent = registry.active(&req.task)?;
    let warm = parent
        .clone()
        .filter(|v| v.backbone == survey.backbone && req.hidden.is_none() && !req.from_scratch);
    if let Some(active) = warm
        && let Some(mut head) = registry.head(&active.id)?
    {
        let new: Vec<String> = survey
            .labels
            .iter()
            .filter(|l| !head.classes().contains(l))
            .cloned()
            .collect();
        head.grow_classes(new)?;
        return Ok((head, Some(active.id)));
    }
    let config = HeadConfig {
        input_dim: survey.feature_dim,
        hidden: req.hidden,
        epochs: req.epochs,
        batch: req.batch,
        seed: req.seed,
        ..HeadConfig::new(survey.labels.iter().cloned().collect())
    };
    Ok((Head::new(config)?, parent.map(|v| v.id)))
}
