//! The PipeStore's client API: `/v1/photos`, `/healthz`, `/metrics`.

mod error;

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ndpipe_catalog::{GroundTruth, PhotoRecord, Split};
use serde::{Deserialize, Serialize};

pub use error::ApiError;

use crate::Ingestor;
use crate::jobs::{JobError, JobView, Jobs};
use crate::metrics::StoreMetrics;

/// Default largest upload body.
pub const DEFAULT_MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Largest page of `GET /v1/photos`.
pub const MAX_PAGE: usize = 1000;

/// Settings of the HTTP API.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Largest accepted request body, in bytes.
    pub max_upload_bytes: usize,
    /// When set, writes and admin calls need `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            token: None,
        }
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    ingestor: Arc<Ingestor>,
    jobs: Arc<Jobs>,
    metrics: Arc<StoreMetrics>,
    token: Option<Arc<str>>,
}

impl AppState {
    /// State over an ingest pipeline.
    pub fn new(
        ingestor: Arc<Ingestor>,
        jobs: Arc<Jobs>,
        metrics: Arc<StoreMetrics>,
        config: &HttpConfig,
    ) -> Self {
        AppState {
            ingestor,
            jobs,
            metrics,
            token: config.token.as_deref().map(Arc::from),
        }
    }
}

/// The router of the client API.
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    let writes = Router::new()
        .route("/v1/photos", post(upload))
        .route("/v1/photos/{id}", axum::routing::delete(delete_photo))
        .route(
            "/v1/photos/{id}/ground-truth",
            axum::routing::put(set_ground_truth),
        )
        .route("/v1/admin/compact", post(compact))
        .route("/v1/jobs/relabel", post(start_relabel))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let reads = Router::new()
        .route("/v1/photos", get(list_photos))
        .route("/v1/photos/{id}", get(get_photo))
        .route("/v1/photos/{id}/meta", get(get_meta))
        .route("/v1/photos/{id}/tensor", get(get_tensor))
        .route("/v1/photos/{id}/labels", get(get_labels))
        .route("/v1/search", get(search))
        .route("/v1/models", get(models))
        .route("/v1/jobs", get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/healthz", get(health))
        .route("/metrics", get(metrics));
    writes
        .merge(reads)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such endpoint") })
        .layer(DefaultBodyLimit::max(config.max_upload_bytes))
        .with_state(state)
}

async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            state.metrics.error("unauthorized");
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required",
            )
            .into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return resp;
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Query parameters of an upload; the same values may come as `x-ndpipe-label`/`x-ndpipe-split`.
#[derive(Debug, Deserialize)]
struct UploadParams {
    label: Option<String>,
    split: Option<String>,
}

/// Reply to a successful upload.
#[derive(Debug, Serialize)]
struct UploadReply {
    id: u64,
    sha256: String,
    bytes: u64,
    width: u32,
    height: u32,
}

async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<UploadParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<UploadReply>), ApiError> {
    let started = Instant::now();
    let result = async {
        let Query(params) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
        let body = body.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    e.body_text(),
                )
            } else {
                ApiError::bad_request("bad_body", e.body_text())
            }
        })?;
        let truth = ground_truth(&headers, params)?;
        let size = body.len() as u64;
        let record = state.ingestor.ingest(body, truth).await?;
        state.metrics.uploads.inc();
        state.metrics.upload_bytes.inc_by(size);
        state.metrics.photos.inc();
        Ok(record)
    }
    .await;
    state
        .metrics
        .ingest_seconds
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(r) => Ok((
            StatusCode::CREATED,
            Json(UploadReply {
                id: r.id,
                sha256: r.sha256,
                bytes: r.bytes,
                width: r.width,
                height: r.height,
            }),
        )),
        Err(e) => Err(count(&state, e)),
    }
}

fn ground_truth(
    headers: &HeaderMap,
    params: UploadParams,
) -> Result<Option<GroundTruth>, ApiError> {
    let header_text = |name: &str| -> Result<Option<String>, ApiError> {
        headers
            .get(name)
            .map(|v| {
                v.to_str().map(str::to_owned).map_err(|_| {
                    ApiError::bad_request("invalid_label", format!("{name} is not valid text"))
                })
            })
            .transpose()
    };
    let label = params.label.or(header_text("x-ndpipe-label")?);
    let split = params.split.or(header_text("x-ndpipe-split")?);
    match (label, split) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ApiError::bad_request(
            "invalid_label",
            "a split was given without a label",
        )),
        (Some(label), split) => {
            let split = match split.as_deref() {
                None => Split::Train,
                Some(s) => s.parse().map_err(|e: ndpipe_catalog::CatalogError| {
                    ApiError::bad_request("invalid_split", e.to_string())
                })?,
            };
            Ok(Some(GroundTruth { label, split }))
        }
    }
}

fn parse_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(
            "bad_id",
            format!("photo id must be a positive integer, not {raw:?}"),
        )
    })
}

fn count(state: &AppState, e: ApiError) -> ApiError {
    state.metrics.error(e.kind);
    e
}

async fn get_photo(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let store = state.ingestor.store().clone();
    let found = tokio::task::spawn_blocking(move || store.original(id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| count(&state, e.into()))?;
    let Some((entry, bytes)) = found else {
        return Err(count(&state, ApiError::photo_not_found(id)));
    };
    state.metrics.reads.inc();
    let etag = format!("\"{}\"", entry.meta.sha256);
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag)
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    Ok((
        [
            (header::CONTENT_TYPE, entry.meta.content_type.clone()),
            (header::ETAG, etag),
            (
                header::CACHE_CONTROL,
                "private, max-age=31536000, immutable".into(),
            ),
        ],
        Body::from(bytes),
    )
        .into_response())
}

async fn get_tensor(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let store = state.ingestor.store().clone();
    let found = tokio::task::spawn_blocking(move || store.tensor(id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| count(&state, e.into()))?;
    let Some((_, blob)) = found else {
        return Err(count(&state, ApiError::photo_not_found(id)));
    };
    Ok((
        [(header::CONTENT_TYPE, "application/vnd.ndpipe.tensor")],
        Body::from(blob),
    )
        .into_response())
}

async fn get_meta(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<PhotoRecord>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let catalog = state.ingestor.catalog().clone();
    let row = tokio::task::spawn_blocking(move || catalog.photo(id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| count(&state, e.into()))?;
    row.map(Json)
        .ok_or_else(|| count(&state, ApiError::photo_not_found(id)))
}

#[derive(Debug, Deserialize)]
struct PageParams {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct Page {
    photos: Vec<PhotoRecord>,
    /// Pass as `after` to get the next page; absent on the last page.
    next_after: Option<u64>,
}

async fn list_photos(
    State(state): State<AppState>,
    query: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let limit = params.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(count(
            &state,
            ApiError::bad_request("bad_query", format!("limit must be 1..={MAX_PAGE}")),
        ));
    }
    let catalog = state.ingestor.catalog().clone();
    let photos = tokio::task::spawn_blocking(move || catalog.list_photos(params.after, limit))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| count(&state, e.into()))?;
    let next_after = (photos.len() == limit)
        .then(|| photos.last().map(|p| p.id))
        .flatten();
    Ok(Json(Page { photos, next_after }))
}

async fn delete_photo(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    if state
        .ingestor
        .delete(id)
        .await
        .map_err(|e| count(&state, e.into()))?
    {
        state.metrics.deletes.inc();
        state.metrics.photos.dec();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(count(&state, ApiError::photo_not_found(id)))
    }
}

#[derive(Debug, Deserialize)]
struct GroundTruthBody {
    label: Option<String>,
    split: Option<Split>,
}

async fn set_ground_truth(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    body: Result<Json<GroundTruthBody>, axum::extract::rejection::JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let truth = match body.label {
        Some(label) => {
            crate::ingest::validate_label(&label).map_err(|e| count(&state, e.into()))?;
            Some(GroundTruth {
                label,
                split: body.split.unwrap_or(Split::Train),
            })
        }
        None => None,
    };
    let catalog = state.ingestor.catalog().clone();
    tokio::task::spawn_blocking(move || catalog.set_ground_truth(id, truth.as_ref()))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| count(&state, e.into()))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn compact(State(state): State<AppState>) -> Result<Json<crate::CompactionReport>, ApiError> {
    let report = state
        .ingestor
        .store()
        .compact()
        .await
        .map_err(|e| count(&state, e.into()))?;
    Ok(Json(report))
}

#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    photos: u64,
    disk_bytes: u64,
}

async fn health(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let store = state.ingestor.store().clone();
    let (photos, disk_bytes) = tokio::task::spawn_blocking(move || {
        Ok::<_, crate::StoreError>((store.len()?, store.disk_bytes()?))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))??;
    Ok(Json(Health {
        status: "ok",
        photos,
        disk_bytes,
    }))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

#[derive(Debug, Serialize)]
struct VersionLabels {
    model_version: String,
    labels: Vec<ndpipe_catalog::Prediction>,
}

async fn get_labels(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<Vec<VersionLabels>>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let catalog = state.ingestor.catalog().clone();
    let (exists, labels) = tokio::task::spawn_blocking(move || {
        Ok::<_, ndpipe_catalog::CatalogError>((
            catalog.photo(id)?.is_some(),
            catalog.predictions(id)?,
        ))
    })
    .await
    .map_err(internal)?
    .map_err(|e| count(&state, e.into()))?;
    if !exists {
        return Err(count(&state, ApiError::photo_not_found(id)));
    }
    Ok(Json(
        labels
            .into_iter()
            .map(|(model_version, labels)| VersionLabels {
                model_version,
                labels,
            })
            .collect(),
    ))
}

#[derive(Debug, Deserialize)]
struct SearchParams {
    label: Option<String>,
    model: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct SearchReply {
    model_version: String,
    hits: Vec<ndpipe_catalog::SearchHit>,
    /// Pass as `offset` for the next page; absent on the last page.
    next_offset: Option<usize>,
}

async fn search(
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
    let limit = params.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_PAGE {
        return Err(count(
            &state,
            ApiError::bad_request("bad_query", format!("limit must be 1..={MAX_PAGE}")),
        ));
    }
    let offset = params.offset.unwrap_or(0);
    let catalog = state.ingestor.catalog().clone();
    let requested = params.model;
    let (version, hits) = tokio::task::spawn_blocking(move || {
        let models = catalog.models()?;
        let version = match requested {
            Some(v) if models.iter().any(|m| m.id == v) => v,
            Some(v) => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_model",
                    format!("model version {v:?} does not exist"),
                ));
            }
            None => models
                .iter()
                .find(|m| m.active)
                .map(|m| m.id.clone())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::CONFLICT,
                        "no_model",
                        "no model version is active",
                    )
                })?,
        };
        let hits = catalog.search(label.trim(), &version, offset, limit)?;
        Ok((version, hits))
    })
    .await
    .map_err(internal)?
    .map_err(|e| count(&state, e))?;
    let next_offset = (hits.len() == limit).then_some(offset + limit);
    Ok(Json(SearchReply {
        model_version: version,
        hits,
        next_offset,
    }))
}

async fn models(
    State(state): State<AppState>,
) -> Result<Json<Vec<ndpipe_catalog::ModelVersion>>, ApiError> {
    let catalog = state.ingestor.catalog().clone();
    let models = tokio::task::spawn_blocking(move || catalog.models())
        .await
        .map_err(internal)?
        .map_err(|e| count(&state, e.into()))?;
    Ok(Json(models))
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Busy(_) => ApiError::new(StatusCode::CONFLICT, "job_running", e.to_string()),
            JobError::NoModel => ApiError::new(StatusCode::CONFLICT, "no_model", e.to_string()),
            JobError::UnknownModel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_model", e.to_string())
            }
            JobError::Catalog(c) => c.into(),
            other => internal(other),
        }
    }
}

#[derive(Debug, Deserialize)]
struct RelabelParams {
    model: Option<String>,
}

#[derive(Debug, Serialize)]
struct Started {
    id: String,
}

async fn start_relabel(
    State(state): State<AppState>,
    query: Result<Query<RelabelParams>, QueryRejection>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let jobs = state.jobs.clone();
    let id = tokio::task::spawn_blocking(move || jobs.start_relabel(params.model.as_deref()))
        .await
        .map_err(internal)?
        .map_err(|e| count(&state, e.into()))?;
    Ok((StatusCode::ACCEPTED, Json(Started { id })))
}

async fn list_jobs(State(state): State<AppState>) -> Result<Json<Vec<JobView>>, ApiError> {
    let jobs = state.jobs.clone();
    let list = tokio::task::spawn_blocking(move || jobs.list())
        .await
        .map_err(internal)?
        .map_err(|e| count(&state, e.into()))?;
    Ok(Json(list))
}

async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let jobs = state.jobs.clone();
    let lookup = id.clone();
    let job = tokio::task::spawn_blocking(move || jobs.get(&lookup))
        .await
        .map_err(internal)?
        .map_err(|e| count(&state, e.into()))?;
    job.map(Json).ok_or_else(|| {
        count(
            &state,
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("job {id} does not exist"),
            ),
        )
    })
}
