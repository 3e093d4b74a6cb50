//! What a fine-tuning job reports: the reply of `POST /v1/tuner/finetune`.

use crate::FailedOver;
use serde::{Deserialize, Serialize};

use ndpipe_catalog::TaskName;

use super::cached::CacheReport;
use super::quality::{ClassMetrics, Gate};
use crate::deploy::DeployReport;

/// The result of a fine-tuning job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinetuneReport {
    /// The new version.
    pub version: String,
    /// The task it labels for.
    pub task: TaskName,
    /// The version it was derived from: the task's version before (`None` for its first).
    pub parent: Option<String>,
    /// The head's classes.
    pub classes: Vec<String>,
    /// Training photos, all nodes.
    pub train_images: usize,
    /// Validation photos, all nodes.
    pub val_images: usize,
    /// Validation photos left out because the version this one derives from (or an ancestor)
    /// trained on them.
    pub val_left_out: u64,
    /// The validation split used: "val", or "carve" (a tenth of the training photos).
    pub val_split: String,
    /// Per run.
    pub runs: Vec<RunTimeline>,
    /// Validation top-1 of the head before this job (0 for a new head).
    pub val_top1_before: f32,
    /// Validation top-1 at the end.
    pub val_top1: f32,
    /// The quality gate: the new version against its parent on the same validation photos.
    pub gate: Gate,
    /// Per-class precision and recall on the validation photos.
    pub per_class: Vec<ClassMetrics>,
    /// The label rules the head keeps: its floor, and the least cosine of the novelty check
    /// (`None` when it has none).
    pub floor: f32,
    /// See `floor`.
    pub min_cosine: Option<f32>,
    /// Share of the validation photos the head labels `other` (a class below the floor, or
    /// novel): the cost of the label rules on photos of the task.
    pub val_other_share: f32,
    /// Bytes of features, labels and ids received.
    pub bytes_received: u64,
    /// `bytes_received / (train + val images)`.
    pub bytes_per_image: f64,
    /// Bytes the Tuner received over its channels to the nodes while the job ran, counted at
    /// the transport (gRPC frames of every call: features, tensors, surveys, re-fetches;
    /// other traffic of those channels meanwhile, such as heartbeat answers, too). Absent
    /// (0) in reports of older versions.
    #[serde(default)]
    pub wire_bytes_received: u64,
    /// `wire_bytes_received / (train + val images)`.
    #[serde(default)]
    pub wire_bytes_per_image: f64,
    /// Bytes that crossed node-to-node channels for the job's take-overs (load balancing), both
    /// ways, counted at the transport: the fast node's fetches of tensors and features from the
    /// slow node and its store-back of computed features. Absent (0) in older reports.
    #[serde(default)]
    pub peer_wire_bytes: u64,
    /// Chunks whose checksum failed and were fetched again.
    pub chunks_refetched: u64,
    /// Seconds from start until the last node sent its last run.
    pub extract_seconds: f64,
    /// Seconds of training in all runs.
    pub train_seconds: f64,
    /// Training seconds that overlapped feature extraction.
    pub train_hidden_seconds: f64,
    /// Seconds until the head was trained.
    pub seconds: f64,
    /// Per node.
    pub nodes: Vec<NodeReport>,
    /// Work moved by load balancing.
    pub rebalanced: Vec<Rebalanced>,
    /// Why load balancing was skipped, when it was asked for but could not run (no node
    /// measured a throughput, or every node had finished by then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_skipped: Option<String>,
    /// The cache's figures, when the features exceeded the memory budget.
    pub cache: Option<CacheReport>,
    /// Registered nodes the job left out (draining, lease ran out, ...), with the reason.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The deploy, when asked for and the gate let it (or it was forced); without one, the
    /// version is a candidate (deploy it with `POST /v1/tuner/deploy/{version}`).
    pub deploy: Option<DeployReport>,
    /// Nodes lost during the job whose photos passed to live copies before it ran again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_over: Vec<FailedOver>,
}

/// The timeline of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTimeline {
    /// Run index, from 0.
    pub run: usize,
    /// Training rows of the run (all nodes).
    pub images: usize,
    /// Seconds from the job's start until every node had sent the run.
    pub ready_at: f64,
    /// Seconds from the job's start when training of the run began.
    pub train_start: f64,
    /// Seconds of training.
    pub train_seconds: f64,
    /// Validation top-1 after the run.
    pub val_top1: f32,
    /// Mean training objective (cross-entropy plus penalties) of the run's last epoch, each
    /// batch's taken before its update (absent, 0, in reports of older versions).
    #[serde(default)]
    pub train_loss: f32,
}

/// Per-node figures of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// "name (node N)".
    pub node: String,
    /// Photos whose features it sent (including work it took over).
    pub images: u64,
    /// Of those, features computed by its backbone during the job.
    pub extracted: u64,
    /// Photos of its plan deleted during the job, left out.
    pub deleted: u64,
    /// Its seconds from first to last feature.
    pub seconds: f64,
    /// Its last reported throughput.
    pub images_per_second: f64,
}

/// Photos moved from a slow node to a fast one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalanced {
    /// The slow node.
    pub from: String,
    /// The fast node.
    pub to: String,
    /// Photos moved.
    pub photos: usize,
    /// The runs they belong to.
    #[serde(default)]
    pub runs: Vec<u32>,
}

impl RunTimeline {
    /// Seconds of this run's training that overlapped extraction, which ended at `extract_end`.
    pub(crate) fn hidden_seconds(&self, extract_end: f64) -> f64 {
        (extract_end.min(self.train_start + self.train_seconds) - self.train_start).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_is_hidden_only_while_extraction_runs() {
        let run = RunTimeline {
            run: 0,
            images: 10,
            ready_at: 1.0,
            train_start: 2.0,
            train_seconds: 3.0,
            val_top1: 0.5,
            train_loss: 0.7,
        };
        assert_eq!(run.hidden_seconds(10.0), 3.0);
        assert_eq!(run.hidden_seconds(4.0), 2.0);
        assert_eq!(run.hidden_seconds(1.0), 0.0);
    }
}
