//! Labels: a photo's predictions per model version and task, search by label, and the model
//! versions.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use ndpipe_catalog::{Catalog, CatalogError, ModelVersion, Prediction, TaskHit, TaskName};
use serde::{Deserialize, Serialize};

use crate::replication::FrontDoor;

use super::error::{ApiError, Counted, blocking, count, parse_id};
use super::{AppState, page_limit};

#[derive(Debug, Serialize)]
pub(super) struct VersionLabels {
    model_version: String,
    /// The task the version labels for.
    task: Option<TaskName>,
    /// Whether the version is the one labelling its task (on the answering node).
    active: bool,
    labels: Vec<Prediction>,
}

/// `GET /v1/photos/{id}/labels`: the photo's ranked labels under every model version, each
/// with its task (on a replicated cluster, of any node's photo).
pub(super) async fn get_labels(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    if state.ingestor.is_deleted(id) {
        return Err(count(&state, ApiError::photo_not_found(id)));
    }
    let catalog = state.catalog.clone();
    let (exists, labels, versions) = blocking(&state, move || {
        Ok::<_, CatalogError>((
            catalog.photo(id)?.is_some(),
            catalog.predictions(id)?,
            catalog.models()?,
        ))
    })
    .await?;
    match (&state.replication, exists) {
        (_, true) => Ok(Json(by_version(labels, &versions))),
        (Some(replication), false) => {
            cluster_labels(&state, &state.catalog, replication.front(), id).await
        }
        (None, false) => Err(count(&state, ApiError::photo_not_found(id))),
    }
}

/// Any node's photo `id`'s labels under every model version.
pub(super) async fn cluster_labels(
    state: &impl Counted,
    catalog: &Arc<dyn Catalog>,
    front: &FrontDoor,
    id: u64,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let found = front
        .labels_of(id)
        .await
        .map_err(|e| count(state, e.into()))?;
    let labels = found.ok_or_else(|| count(state, ApiError::photo_not_found(id)))?;
    let catalog = catalog.clone();
    let versions = blocking(state, move || catalog.models()).await?;
    Ok(Json(by_version(labels, &versions)))
}

fn by_version(
    labels: Vec<(String, Vec<Prediction>)>,
    versions: &[ModelVersion],
) -> Vec<VersionLabels> {
    labels
        .into_iter()
        .map(|(model_version, labels)| {
            let known = versions.iter().find(|v| v.id == model_version);
            VersionLabels {
                task: known.map(|v| v.task.clone()),
                active: known.is_some_and(|v| v.active),
                model_version,
                labels,
            }
        })
        .collect()
}

#[derive(Debug, Deserialize)]
pub(super) struct SearchParams {
    label: Option<String>,
    task: Option<String>,
    model: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(super) struct SearchReply {
    /// The version searched, when one was (a `task` or `model` given).
    model_version: Option<String>,
    /// Each hit names the node that holds the photo, its task and version.
    hits: Vec<TaskHit>,
    /// Pass as `offset` for the next page; absent on the last page.
    next_offset: Option<usize>,
}

/// The versions a search reads: `model` when given (404 when unknown), else the active version
/// of `task` (404 for an unknown task, 409 for one without a version), else every task's
/// active version.
fn searched_versions(
    catalog: &dyn Catalog,
    task: Option<TaskName>,
    model: Option<String>,
) -> Result<Vec<ModelVersion>, ApiError> {
    if let Some(v) = model {
        return catalog.model(&v)?.map(|m| vec![m]).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_model",
                format!("model version {v:?} does not exist"),
            )
        });
    }
    let Some(task) = task else {
        return Ok(catalog.active_models()?);
    };
    if catalog.task(&task)?.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_task",
            format!("task {task} does not exist"),
        ));
    }
    let active = catalog.active_model(&task)?.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_model",
            format!("task {task} has no active version"),
        )
    })?;
    Ok(vec![active])
}

/// `GET /v1/search?label=&task=&model=&offset=&limit=`: photos labelled `label` by `model`, or
/// by the active version of `task`, or (neither given) by every task's active version, best
/// score first: on a shared catalog, the photos of every node, each with the node that holds
/// it.
pub(super) async fn search(
    State(state): State<AppState>,
    query: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Json<SearchReply>, ApiError> {
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let label = params
        .label
        .filter(|l| !l.trim().is_empty())
        .ok_or_else(|| {
            count(
                &state,
                ApiError::bad_request("bad_query", "label is required"),
            )
        })?;
    let limit = page_limit(params.limit, 50).map_err(|e| count(&state, e))?;
    let offset = params.offset.unwrap_or(0);
    let end = offset.checked_add(limit).ok_or_else(|| {
        count(
            &state,
            ApiError::bad_request("bad_query", "offset + limit is too large"),
        )
    })?;
    let task = params
        .task
        .as_deref()
        .map(|t| super::tasks::task_name(Some(t)))
        .transpose()
        .map_err(|e| count(&state, e))?;
    let catalog = state.catalog.clone();
    let single = task.is_some() || params.model.is_some();
    let requested = params.model;
    let (versions, mut hits) = blocking(&state, move || {
        let versions = searched_versions(&*catalog, task, requested)?;
        let hits = catalog.search_versions(label.trim(), &versions, offset, limit)?;
        Ok::<_, ApiError>((versions, hits))
    })
    .await?;
    let model_version = single
        .then(|| versions.first().map(|v| v.id.clone()))
        .flatten();
    let next_offset = (hits.len() == limit).then_some(end);
    let node = &state.node;
    for h in &mut hits {
        h.hit.node.get_or_insert_with(|| node.to_string());
    }
    hits.retain(|h| {
        h.hit.node.as_deref() != Some(node) || !state.ingestor.is_deleted(h.hit.hit.id)
    });
    Ok(Json(SearchReply {
        model_version,
        hits,
        next_offset,
    }))
}

/// `GET /v1/models`: every model version, oldest first, with the active one marked.
pub(super) async fn models(
    State(state): State<AppState>,
) -> Result<Json<Vec<ModelVersion>>, ApiError> {
    let catalog = state.catalog.clone();
    Ok(Json(blocking(&state, move || catalog.models()).await?))
}
