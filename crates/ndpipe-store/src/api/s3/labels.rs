//! Labels through S3: GET and HEAD carry every task's labels of a photo in
//! `x-amz-meta-ndpipe-labels-<task>`, the general task's also in `x-amz-meta-ndpipe-labels`,
//! and `GetObjectTagging` answers each task's top label as tags under [`LABEL_TAG_PREFIX`]
//! (beside the user's own tags, see `tagging`).

use ndpipe_catalog::{ObjectRecord, Prediction, TaskName};
use s3s::S3Result;
use s3s::dto::Tag;

use super::S3State;

/// The user-metadata name of the labels on GET and HEAD (`x-amz-meta-ndpipe-labels`, the
/// general task's; `-<task>` after it for each task's).
pub(crate) const LABELS_META: &str = "ndpipe-labels";

/// The start of every tag key that is a label (`ndpipe-<task>`, `ndpipe-<task>-score`):
/// reserved, a user tag cannot have it.
pub(crate) const LABEL_TAG_PREFIX: &str = "ndpipe-";

/// The most tasks whose top label `GetObjectTagging` answers (S3 allows ten tags, two each).
const TAGGED_TASKS: usize = 5;

/// The active versions' predictions of an object's photo per task, best first, the general
/// task first (a task is left out before the photo is labelled for it; a plain object has
/// none).
pub(crate) struct Labels(Vec<(TaskName, Vec<Prediction>)>);

impl Labels {
    /// The labels of `object`.
    pub(crate) async fn of(state: &S3State, object: &ObjectRecord) -> S3Result<Labels> {
        let Some(id) = object.photo_id() else {
            return Ok(Labels(Vec::new()));
        };
        let mut labels = state.objects.active_labels(id).await?;
        labels.sort_by_key(|(task, _)| (!task.is_general(), task.clone()));
        Ok(Labels(labels))
    }

    /// The labels metadata: per task, (metadata name, `label (score); ...` best first), the
    /// general task's under [`LABELS_META`] as well.
    pub(crate) fn metadata(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (task, labels) in &self.0 {
            let text = labels
                .iter()
                .map(|p| format!("{} ({:.3})", header_safe(&p.label), p.score))
                .collect::<Vec<_>>()
                .join("; ");
            if task.is_general() {
                out.push((LABELS_META.to_string(), text.clone()));
            }
            out.push((format!("{LABELS_META}-{task}"), text));
        }
        out
    }

    /// The labels as tags: for each task (the general one first, at most five), tag
    /// `ndpipe-<task>` with its top label and `ndpipe-<task>-score` with its score.
    pub(crate) fn tags(&self) -> Vec<Tag> {
        let tag = |key: String, value: String| Tag {
            key: Some(key),
            value: Some(value),
        };
        self.0
            .iter()
            .filter_map(|(task, labels)| Some((task, labels.first()?)))
            .take(TAGGED_TASKS)
            .flat_map(|(task, p)| {
                [
                    tag(format!("{LABEL_TAG_PREFIX}{task}"), p.label.clone()),
                    tag(
                        format!("{LABEL_TAG_PREFIX}{task}-score"),
                        format!("{:.4}", p.score),
                    ),
                ]
            })
            .collect()
    }
}

/// Text safe in an HTTP header value: visible ASCII and spaces; anything else becomes `?`.
pub(super) fn header_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}
