//! Labels: a photo's predictions per model version, search by label, and the model versions.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use ndpipe_catalog::{CatalogError, ModelVersion, NodeHit, Prediction};
use serde::{Deserialize, Serialize};

use crate::replication::FrontDoor;

use super::error::{ApiError, Counted, blocking, count, parse_id};
use super::{AppState, page_limit};

#[derive(Debug, Serialize)]
pub(super) struct VersionLabels {
    model_version: String,
    labels: Vec<Prediction>,
}

/// `GET /v1/photos/{id}/labels`: the photo's ranked labels under every model version (on a
/// replicated cluster, of any node's photo).
pub(super) async fn get_labels(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    if state.ingestor.is_deleted(id) {
        return Err(count(&state, ApiError::photo_not_found(id)));
    }
    let catalog = state.catalog.clone();
    let (exists, labels) = blocking(&state, move || {
        Ok::<_, CatalogError>((catalog.photo(id)?.is_some(), catalog.predictions(id)?))
    })
    .await?;
    match (&state.replication, exists) {
        (_, true) => Ok(Json(by_version(labels))),
        (Some(replication), false) => cluster_labels(&state, replication.front(), id).await,
        (None, false) => Err(count(&state, ApiError::photo_not_found(id))),
    }
}

/// Any node's photo `id`'s labels under every model version.
pub(super) async fn cluster_labels(
    state: &impl Counted,
    front: &FrontDoor,
    id: u64,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let found = front
        .labels_of(id)
        .await
        .map_err(|e| count(state, e.into()))?;
    let labels = found.ok_or_else(|| count(state, ApiError::photo_not_found(id)))?;
    Ok(Json(by_version(labels)))
}

fn by_version(labels: Vec<(String, Vec<Prediction>)>) -> Vec<VersionLabels> {
    labels
        .into_iter()
        .map(|(model_version, labels)| VersionLabels {
            model_version,
            labels,
        })
        .collect()
}

#[derive(Debug, Deserialize)]
pub(super) struct SearchParams {
    label: Option<String>,
    model: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(super) struct SearchReply {
    model_version: String,
    /// Each hit names the node that holds the photo.
    hits: Vec<NodeHit>,
    /// Pass as `offset` for the next page; absent on the last page.
    next_offset: Option<usize>,
}

/// `GET /v1/search?label=&model=&offset=&limit=`: photos labelled `label` by `model` (default:
/// the active version), best score first: on a shared catalog, the photos of every node, each
/// with the node that holds it.
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
    let catalog = state.catalog.clone();
    let requested = params.model;
    let (version, mut hits) = blocking(&state, move || {
        let version = match requested {
            Some(v) if catalog.model(&v)?.is_some() => v,
            Some(v) => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_model",
                    format!("model version {v:?} does not exist"),
                ));
            }
            None => {
                catalog
                    .active_model()?
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::CONFLICT,
                            "no_model",
                            "no model version is active",
                        )
                    })?
                    .id
            }
        };
        let hits = catalog.search_cluster(label.trim(), &version, offset, limit)?;
        Ok((version, hits))
    })
    .await?;
    let next_offset = (hits.len() == limit).then_some(offset + limit);
    let node = &state.node;
    for h in &mut hits {
        h.node.get_or_insert_with(|| node.to_string());
    }
    hits.retain(|h| h.node.as_deref() != Some(node) || !state.ingestor.is_deleted(h.hit.id));
    Ok(Json(SearchReply {
        model_version: version,
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
