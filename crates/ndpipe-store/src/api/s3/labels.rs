//! Labels through S3: `GetObjectTagging` answers each task's top label of a photo as tags,
//! and GET and HEAD carry every task's labels in `x-amz-meta-ndpipe-labels-<task>`, the general
//! task's also in `x-amz-meta-ndpipe-labels`.

use ndpipe_catalog::{PhotoId, Prediction, TaskName};
use s3s::dto::*;
use s3s::{S3Response, S3Result};

use super::S3State;
use super::objects::lookup;

/// The user-metadata name of the labels on GET and HEAD (`x-amz-meta-ndpipe-labels`, the
/// general task's; `-<task>` after it for each task's).
pub(crate) const LABELS_META: &str = "ndpipe-labels";

/// The most tasks whose top label `GetObjectTagging` answers (S3 allows ten tags, two each).
const TAGGED_TASKS: usize = 5;

/// The active versions' predictions of photo `id` per task, best first (a task is left out
/// before the photo is labelled for it), the general task first.
async fn active_labels(state: &S3State, id: PhotoId) -> S3Result<Vec<(TaskName, Vec<Prediction>)>> {
    let mut labels = state.objects.active_labels(id).await?;
    labels.sort_by_key(|(task, _)| (!task.is_general(), task.clone()));
    Ok(labels)
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

/// The labels metadata of photo `id`: per task, (metadata name, `label (score); ...` best
/// first), the general task's under [`LABELS_META`] as well; empty before it is labelled.
pub(crate) async fn metadata(state: &S3State, id: PhotoId) -> S3Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (task, labels) in active_labels(state, id).await? {
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
    Ok(out)
}

/// `GetObjectTagging`: for each task (the general one first, at most five, S3's limit being ten
/// tags), tag `ndpipe-<task>` with its top label and `ndpipe-<task>-score` with its score; a
/// plain object or an unlabelled photo has none.
pub(crate) async fn tagging(
    state: &S3State,
    input: GetObjectTaggingInput,
) -> S3Result<S3Response<GetObjectTaggingOutput>> {
    let object = lookup(state, &input.bucket, &input.key).await?;
    let labels = match object.photo_id() {
        Some(id) => active_labels(state, id).await?,
        None => Vec::new(),
    };
    let tag = |key: String, value: String| Tag {
        key: Some(key),
        value: Some(value),
    };
    let tag_set = labels
        .iter()
        .filter_map(|(task, labels)| Some((task, labels.first()?)))
        .take(TAGGED_TASKS)
        .flat_map(|(task, p)| {
            [
                tag(format!("ndpipe-{task}"), p.label.clone()),
                tag(format!("ndpipe-{task}-score"), format!("{:.4}", p.score)),
            ]
        })
        .collect();
    Ok(S3Response::new(GetObjectTaggingOutput {
        tag_set,
        version_id: None,
    }))
}
