//! Recording a fine-tuned version: its head and metrics in the registry, with its task, its
//! gate and its per-class figures.

use ndpipe_catalog::{ModelVersion, TaskName};
use ndpipe_util::time::now_ms;

use super::FinetuneReport;
use super::request::FinetuneRequest;
use super::survey::Survey;
use crate::registry::Registry;
use crate::{Head, TunerError};

/// Records the new version with its head, and the nodes' pretrained version as the general
/// task's (active when the registry has none, so that what every node must serve names it).
pub(super) fn register(
    registry: &Registry,
    survey: &Survey,
    req: &FinetuneRequest,
    report: &FinetuneReport,
    head: &Head,
) -> Result<ModelVersion, TunerError> {
    if !survey.pretrained.is_empty() {
        registry.record(&ModelVersion {
            id: survey.pretrained.clone(),
            task: TaskName::general(),
            backbone: survey.backbone.clone(),
            parent: None,
            metrics: serde_json::json!({"head": "pretrained"}),
            created_ms: 0,
            active: false,
        })?;
        if registry.active(&TaskName::general())?.is_none() {
            registry.set_active(&survey.pretrained)?;
        }
    }
    let record = ModelVersion {
        id: report.version.clone(),
        task: req.task.clone(),
        backbone: survey.backbone.clone(),
        parent: report.parent.clone(),
        metrics: serde_json::json!({
            "val_top1": report.val_top1,
            "val_top1_before": report.val_top1_before,
            "parent_val_top1": report.gate.parent_val_top1,
            "gate_passed": report.gate.passed,
            "val_split": report.val_split,
            "train_images": report.train_images,
            "runs": req.runs,
            "epochs": req.epochs,
            "batch": req.batch,
            "classes": report.classes.len(),
            "floor": report.floor,
            "val_other_share": report.val_other_share,
            "per_class": report.per_class,
        }),
        created_ms: now_ms(),
        active: false,
    };
    registry.save_head(&record, head)?;
    registry.record(&record)?;
    Ok(record)
}
