//! Labels: a photo's predictions per model version and task, search by label, and the model
//! versions.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::{Catalog, ModelVersion, Prediction, TaskHit, TaskName};
use ndpipe_model::words::Match;
use serde::{Deserialize, Serialize};

use crate::objects::VersionedLabels;
use crate::words::WordsFailure;

use super::error::{ApiError, blocking, count, parse_id};
use super::{AppState, FrontState, page_limit};

#[derive(Debug, Serialize)]
pub(crate) struct VersionLabels {
    model_version: String,
    /// The task the version labels for.
    task: Option<TaskName>,
    /// Whether the version is the one labelling its task (on the answering node).
    active: bool,
    labels: Vec<Prediction>,
}

/// `GET /v1/photos/{id}/labels`: the photo's ranked labels under every model version, each
/// with its task (on a replicated cluster, of any node's photo).
pub(crate) async fn get_labels(
    State(state): State<FrontState>,
    Path(raw): Path<String>,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let found = (state.objects.labels(id).await).map_err(|e| count(&state, e.into()))?;
    let labels = found.ok_or_else(|| count(&state, ApiError::photo_not_found(id)))?;
    let catalog = state.catalog.clone();
    let versions = blocking(&state, move || catalog.models()).await?;
    Ok(Json(by_version(labels, &versions)))
}

/// The labels of each version with its task, `active` when the photo's primary serves it.
fn by_version(labels: VersionedLabels, versions: &[ModelVersion]) -> Vec<VersionLabels> {
    let VersionedLabels { by_version, active } = labels;
    by_version
        .into_iter()
        .map(|(model_version, labels)| VersionLabels {
            task: (versions.iter())
                .find(|v| v.id == model_version)
                .map(|v| v.task.clone()),
            active: active.contains(&model_version),
            model_version,
            labels,
        })
        .collect()
}

#[derive(Debug, Deserialize)]
pub(crate) struct SearchParams {
    label: Option<String>,
    /// A search in words ("kitty"), mapped onto class names.
    q: Option<String>,
    task: Option<String>,
    model: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SearchReply {
    /// The version searched, when one was (a `task` or `model` given, or one task only).
    model_version: Option<String>,
    /// Each hit names the node that holds the photo, its task and version.
    hits: Vec<TaskHit>,
    /// Pass as `offset` for the next page; absent on the last page.
    next_offset: Option<usize>,
}

/// A hit of a search in words: the class the words matched, how well, and the relevance
/// (the label's score times the match's).
#[derive(Debug, Serialize)]
pub(super) struct WordHit {
    relevance: f32,
    matched: Match,
    #[serde(flatten)]
    hit: TaskHit,
}

#[derive(Debug, Serialize)]
pub(super) struct WordsReply {
    /// The classes the words mapped onto, best first.
    matched: Vec<Match>,
    hits: Vec<WordHit>,
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
/// it. `?q=` searches in words instead ([`words_search`]).
pub(crate) async fn search(
    State(state): State<AppState>,
    query: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let limit = page_limit(params.limit, 50).map_err(|e| count(&state, e))?;
    let offset = params.offset.unwrap_or(0);
    let end = offset.checked_add(limit).ok_or_else(|| {
        count(
            &state,
            ApiError::bad_request("bad_query", "offset + limit is too large"),
        )
    })?;
    if let Some(q) = params.q.filter(|q| !q.trim().is_empty()) {
        return Ok(Json(words_search(&state, q, (offset, limit)).await?).into_response());
    }
    let label = params
        .label
        .filter(|l| !l.trim().is_empty())
        .ok_or_else(|| {
            count(
                &state,
                ApiError::bad_request("bad_query", "label (a class name) or q (words) is required"),
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
    let class_check = (requested.is_none() && offset == 0).then(|| (label.clone(), task.clone()));
    let (versions, mut hits) = blocking(&state, move || {
        let versions = searched_versions(&*catalog, task, requested)?;
        let hits = catalog.search_versions(label.trim(), &versions, offset, limit)?;
        Ok::<_, ApiError>((versions, hits))
    })
    .await?;
    if let Some((label, task)) = class_check.filter(|_| hits.is_empty()) {
        known_class(&state, label.trim(), task.as_ref()).map_err(|e| count(&state, e))?;
    }
    let model_version = (single || versions.len() == 1)
        .then(|| versions.first().map(|v| v.id.clone()))
        .flatten();
    let next_offset = (hits.len() == limit).then_some(end);
    own_hits(&state, &mut hits);
    Ok(Json(SearchReply {
        model_version,
        hits,
        next_offset,
    })
    .into_response())
}

/// 404 `unknown_class` when no task this node serves (or `task` only) has a class a search for
/// `label` finds, so a typo or a word is told apart from a class without photos.
fn known_class(state: &AppState, label: &str, task: Option<&TaskName>) -> Result<(), ApiError> {
    let Some(models) = &state.models else {
        return Ok(());
    };
    let model = models.active().get();
    let served: Vec<_> = model
        .tasks
        .iter()
        .filter(|t| task.is_none_or(|name| t.task == *name))
        .collect();
    if served.is_empty() || served.iter().any(|t| model.has_class(t, label)) {
        return Ok(());
    }
    let missing = match task {
        Some(t) => format!("task {t} has no class {label:?}"),
        None => format!("no task has a class {label:?}"),
    };
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_class",
        format!("{missing}; to search in words, pass q= instead of label="),
    ))
}

/// Names this node's own hits and leaves out its photos deleted meanwhile.
fn own_hits(state: &AppState, hits: &mut Vec<TaskHit>) {
    let node = &state.node;
    for h in hits.iter_mut() {
        h.hit.node.get_or_insert_with(|| node.to_string());
    }
    hits.retain(|h| {
        h.hit.node.as_deref() != Some(node) || !state.ingestor.is_deleted(h.hit.hit.id)
    });
}

/// A search in words: `q` mapped onto the class names of every task the node serves, then
/// each matched class searched under its task's active version; hits by relevance.
async fn words_search(
    state: &AppState,
    q: String,
    (offset, limit): (usize, usize),
) -> Result<WordsReply, ApiError> {
    let (Some(words), Some(models)) = (state.words.clone(), state.models.clone()) else {
        return Err(count(
            state,
            ApiError::new(
                StatusCode::CONFLICT,
                "no_model",
                "this node runs no model: search in words maps onto its classes",
            ),
        ));
    };
    let catalog = state.catalog.clone();
    let end = offset.saturating_add(limit);
    let (matched, hits) = blocking(state, move || {
        let model = models.active().get();
        let matched = words.matches(q.trim(), &model).map_err(words_error)?;
        let mut hits = Vec::new();
        for m in &matched {
            let Some(task) = model.task(&m.task) else {
                continue;
            };
            for hit in catalog.search_cluster(&m.class, &task.version, 0, end)? {
                hits.push(WordHit {
                    relevance: hit.hit.score * m.score,
                    matched: m.clone(),
                    hit: TaskHit {
                        task: task.task.clone(),
                        model_version: task.version.clone(),
                        hit,
                    },
                });
            }
        }
        Ok::<_, ApiError>((matched, hits))
    })
    .await?;
    let mut hits = hits;
    hits.sort_by(|a, b| {
        b.relevance
            .total_cmp(&a.relevance)
            .then(a.hit.hit.hit.id.cmp(&b.hit.hit.hit.id))
    });
    let mut seen = std::collections::HashSet::new();
    hits.retain(|h| seen.insert(h.hit.hit.hit.id));
    let mut page: Vec<WordHit> = hits.into_iter().skip(offset).take(limit).collect();
    let mut own: Vec<TaskHit> = page.iter().map(|h| h.hit.clone()).collect();
    own_hits(state, &mut own);
    page.retain(|h| own.iter().any(|o| o.hit.hit.id == h.hit.hit.hit.id));
    for (h, o) in page.iter_mut().zip(&own) {
        h.hit.hit.node.clone_from(&o.hit.node);
    }
    let next_offset = (page.len() == limit).then_some(end);
    Ok(WordsReply {
        matched,
        hits: page,
        next_offset,
    })
}

/// A words failure as the API answers it.
fn words_error(e: WordsFailure) -> ApiError {
    match e {
        WordsFailure::Query(e) => ApiError::bad_request("bad_query", e.to_string()),
        WordsFailure::Starting => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "words_starting",
            e.to_string(),
        ),
        WordsFailure::Unavailable(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "words_unavailable",
            e.to_string(),
        ),
    }
}

/// `GET /v1/models`: every model version, oldest first, with the active one marked.
pub(super) async fn models(
    State(state): State<AppState>,
) -> Result<Json<Vec<ModelVersion>>, ApiError> {
    let catalog = state.catalog.clone();
    Ok(Json(blocking(&state, move || catalog.models()).await?))
}
