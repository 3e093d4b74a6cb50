//! Labels through S3: `GetObjectTagging` answers the active model's top labels of a photo as
//! tags, and GET and HEAD carry them in `x-amz-meta-ndpipe-labels`.

use ndpipe_catalog::{PhotoId, Prediction};
use s3s::dto::*;
use s3s::{S3Response, S3Result};

use super::S3State;
use super::objects::lookup;

/// The user-metadata name of the labels on GET and HEAD (`x-amz-meta-ndpipe-labels`).
pub(crate) const LABELS_META: &str = "ndpipe-labels";

/// The active model's predictions of photo `id`, best first (empty before it is labelled or
/// without a model).
async fn active_labels(state: &S3State, id: PhotoId) -> S3Result<Vec<Prediction>> {
    state.backend.active_labels(&state.catalog, id).await
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

/// The labels header of photo `id`: `label (score); label (score); ...`, best first; `None`
/// before it is labelled.
pub(crate) async fn header_value(state: &S3State, id: PhotoId) -> S3Result<Option<String>> {
    let labels = active_labels(state, id).await?;
    if labels.is_empty() {
        return Ok(None);
    }
    let parts: Vec<String> = labels
        .iter()
        .map(|p| format!("{} ({:.3})", header_safe(&p.label), p.score))
        .collect();
    Ok(Some(parts.join("; ")))
}

/// `GetObjectTagging`: tags `ndpipe-label-N` (the class name) and `ndpipe-score-N` for the
/// active model's top labels (N = 1 is the best; at most five, S3's limit being ten tags); a
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
        .take(5)
        .enumerate()
        .flat_map(|(i, p)| {
            [
                tag(format!("ndpipe-label-{}", i + 1), p.label.clone()),
                tag(format!("ndpipe-score-{}", i + 1), format!("{:.4}", p.score)),
            ]
        })
        .collect();
    Ok(S3Response::new(GetObjectTaggingOutput {
        tag_set,
        version_id: None,
    }))
}
