//! The Tuner's HTTP API for operators, under `/v1/tuner`.
//!
//! - `GET /v1/tuner/nodes`: the registered PipeStores with their state, lease and version;
//!   `POST /v1/tuner/nodes/{name}/drain` (it takes no new work), `POST
//!   /v1/tuner/nodes/{name}/activate` and `DELETE /v1/tuner/nodes/{name}` (forgotten; on a
//!   replicated cluster the answer names the repair job that follows the copies it held).
//! - `GET /v1/tuner/versions`: the model versions.
//! - `POST /v1/tuner/backbones` (a [`BackboneUpload`] body, at most `max_backbone_bytes` of
//!   ONNX): verified and kept, 201 with the [`BackboneView`] (200 when it was kept already), 400
//!   for a file that does not load as its manifest says, 413 over the limit; `GET
//!   /v1/tuner/backbones` lists them.
//! - `POST /v1/tuner/finetune` (a [`FinetuneRequest`] body) and `POST
//!   /v1/tuner/deploy/{version}` (also the rollback) start a job in the background and answer
//!   202 with the [`JobView`] (and `Location: /v1/tuner/jobs/{id}`); what can be checked at
//!   once is (400, 404, 409).
//! - `POST /v1/tuner/rollout/{backbone}`: a rollout of a kept backbone, in the background (202
//!   with the job; 404 for a backbone the Tuner does not keep).
//! - `GET /v1/tuner/jobs` and `GET /v1/tuner/jobs/{id}`: phase, progress, result or error.
//! - `GET /v1/search?label=&model=&task=&offset=&limit=` (standalone Tuner only; an embedded one
//!   leaves it to its PipeStore): photos of every node of a shared catalog, with their node;
//!   also `/healthz`, `/readyz` and `/metrics` (see `ops`).
//!
//! Who may call what is the guard's concern (the PipeStores' access keys and roles: reads need
//! a key once keys exist, writes an admin key or the token). Errors are `{"error": kind,
//! "message"}`.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use ndpipe_catalog::{ModelVersion, NodeState, TaskHit, TaskName};
use ndpipe_util::http::error_response;
use serde::{Deserialize, Serialize};

use crate::jobs::JobView;
use crate::{BackboneUpload, BackboneView, FinetuneRequest, NodeView, Tuner, TunerError};

/// The routes over `tuner` (the caller guards them: see [`Tuner::http_router`]).
pub(crate) fn router(tuner: Arc<Tuner>) -> Router {
    let upload_limit = tuner.backbone_upload_limit();
    let writes = Router::new()
        .route(
            "/v1/tuner/backbones",
            post(add_backbone).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/v1/tuner/finetune", post(finetune))
        .route("/v1/tuner/deploy/{version}", post(deploy))
        .route("/v1/tuner/rollout/{backbone}", post(rollout))
        .route("/v1/tuner/nodes/{name}/drain", post(drain))
        .route("/v1/tuner/nodes/{name}/activate", post(activate))
        .route("/v1/tuner/nodes/{name}", delete(remove));
    Router::new()
        .route("/v1/tuner/nodes", get(nodes))
        .route("/v1/tuner/versions", get(versions))
        .route("/v1/tuner/backbones", get(backbones))
        .route("/v1/tuner/jobs", get(jobs))
        .route("/v1/tuner/jobs/{id}", get(job))
        .merge(writes)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(tuner)
}

/// `base` (the Tuner's routes) with what only a standalone Tuner serves (an embedded one leaves
/// it to its PipeStore): `GET /v1/search` over its catalog, `/healthz`, `/readyz`, `/metrics`,
/// and JSON answers for unknown paths (404) and methods (405).
pub(crate) fn standalone(base: Router, tuner: Arc<Tuner>) -> Router {
    let own = Router::new()
        .route("/v1/search", get(search))
        .route("/healthz", get(super::ops::health))
        .route("/readyz", get(super::ops::ready))
        .route("/metrics", get(super::ops::metrics))
        .with_state(tuner);
    base.merge(own)
        .fallback(|| async {
            error_response(StatusCode::NOT_FOUND, "no_route", "no such endpoint")
        })
        .method_not_allowed_fallback(method_not_allowed)
}

/// The JSON 405, for the Tuner's routes wherever they are served (merged into a PipeStore's
/// router, they keep it).
async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

/// Most hits on one page of `GET /v1/search`.
const MAX_PAGE: usize = 1000;

#[derive(Deserialize)]
struct SearchParams {
    label: Option<String>,
    model: Option<String>,
    task: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct SearchReply {
    hits: Vec<TaskHit>,
    next_offset: Option<usize>,
}

async fn search(
    State(tuner): State<Arc<Tuner>>,
    query: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Json<SearchReply>, Response> {
    let bad = |m: &str| error_response(StatusCode::BAD_REQUEST, "bad_query", m);
    let Query(params) = query.map_err(|e| bad(&e.body_text()))?;
    let label = params
        .label
        .filter(|l| !l.trim().is_empty())
        .ok_or_else(|| bad("label is required"))?;
    let limit = params.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad(&format!("limit must be 1..={MAX_PAGE}")));
    }
    let offset = params.offset.unwrap_or(0);
    let task = params
        .task
        .map(|t| t.parse::<TaskName>())
        .transpose()
        .map_err(|e| bad(&e.to_string()))?;
    let hits = tuner.search(
        label.trim(),
        (params.model.as_deref(), task.as_ref()),
        offset,
        limit,
    )?;
    let next_offset = (hits.len() == limit).then(|| offset.saturating_add(limit));
    Ok(Json(SearchReply { hits, next_offset }))
}

/// The one mapping of Tuner errors to HTTP: status and stable `error` kind.
impl From<TunerError> for Response {
    fn from(e: TunerError) -> Self {
        let status = match &e {
            TunerError::Busy
            | TunerError::NoNodes
            | TunerError::NoEligibleNodes(_)
            | TunerError::DeployAborted { .. }
            | TunerError::EmptyData => StatusCode::CONFLICT,
            TunerError::UnknownVersion(_)
            | TunerError::UnknownBackbone(_)
            | TunerError::UnknownNode(_)
            | TunerError::UnknownTask(_)
            | TunerError::UnknownJob(_) => StatusCode::NOT_FOUND,
            TunerError::TasksNotCarried(_) => StatusCode::CONFLICT,
            TunerError::Node { .. } => StatusCode::BAD_GATEWAY,
            TunerError::InvalidArgument(_)
            | TunerError::InvalidBackbone(_)
            | TunerError::TooFewClasses { .. }
            | TunerError::InputDimMismatch { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        error_response(status, e.kind(), &e.to_string())
    }
}

/// 202 with the job and where to follow it.
fn accepted(job: JobView) -> Response {
    let location = format!("/v1/tuner/jobs/{}", job.id);
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(job),
    )
        .into_response()
}

async fn finetune(
    State(tuner): State<Arc<Tuner>>,
    body: Result<Json<FinetuneRequest>, JsonRejection>,
) -> Result<Response, Response> {
    let Json(req) =
        body.map_err(|e| error_response(StatusCode::BAD_REQUEST, "bad_body", &e.body_text()))?;
    Ok(accepted(tuner.submit_finetune(req).await?))
}

async fn deploy(
    State(tuner): State<Arc<Tuner>>,
    Path(version): Path<String>,
) -> Result<Response, Response> {
    Ok(accepted(tuner.submit_deploy(&version)?))
}

#[derive(Deserialize)]
struct RolloutParams {
    #[serde(default)]
    force: bool,
}

/// `POST /v1/tuner/rollout/{backbone}[?force=true]`: `force` commits the backbone even when a
/// task's head cannot be carried to it (that task is then left without one).
async fn rollout(
    State(tuner): State<Arc<Tuner>>,
    Path(backbone): Path<String>,
    query: Result<Query<RolloutParams>, QueryRejection>,
) -> Result<Response, Response> {
    let Query(params) =
        query.map_err(|e| error_response(StatusCode::BAD_REQUEST, "bad_query", &e.body_text()))?;
    Ok(accepted(tuner.submit_rollout(&backbone, params.force)?))
}

async fn jobs(State(tuner): State<Arc<Tuner>>) -> Result<Json<Vec<JobView>>, Response> {
    Ok(Json(tuner.jobs()?))
}

async fn job(
    State(tuner): State<Arc<Tuner>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, Response> {
    Ok(Json(tuner.job(&id)?))
}

async fn nodes(State(tuner): State<Arc<Tuner>>) -> Result<Json<Vec<NodeView>>, Response> {
    Ok(Json(tuner.nodes()?))
}

async fn drain(
    State(tuner): State<Arc<Tuner>>,
    Path(name): Path<String>,
) -> Result<Json<NodeView>, Response> {
    Ok(Json(tuner.set_node_state(&name, NodeState::Draining)?))
}

async fn activate(
    State(tuner): State<Arc<Tuner>>,
    Path(name): Path<String>,
) -> Result<Json<NodeView>, Response> {
    Ok(Json(tuner.set_node_state(&name, NodeState::Active)?))
}

/// What `DELETE /v1/tuner/nodes/{name}` answers.
#[derive(Debug, Serialize)]
struct Removed {
    removed: String,
    /// On a replicated cluster, the job that follows the repair of what the node held.
    repair_job: Option<JobView>,
}

async fn remove(
    State(tuner): State<Arc<Tuner>>,
    Path(name): Path<String>,
) -> Result<Json<Removed>, Response> {
    let repair_job = tuner.remove_node(&name)?;
    Ok(Json(Removed {
        removed: name,
        repair_job,
    }))
}

async fn versions(State(tuner): State<Arc<Tuner>>) -> Result<Json<Vec<ModelVersion>>, Response> {
    Ok(Json(tuner.versions()?))
}

async fn add_backbone(
    State(tuner): State<Arc<Tuner>>,
    body: Result<Json<BackboneUpload>, JsonRejection>,
) -> Result<Response, Response> {
    let Json(upload) = body.map_err(|e| error_response(e.status(), "bad_body", &e.body_text()))?;
    let (view, created) = tuner.add_backbone(upload).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

async fn backbones(State(tuner): State<Arc<Tuner>>) -> Result<Json<Vec<BackboneView>>, Response> {
    Ok(Json(tuner.backbones()?))
}
