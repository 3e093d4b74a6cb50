//! The client API of `ndpipe gateway`: the photo routes of a PipeStore's front door (upload,
//! read, metadata, labels, listing, delete, cluster status, similar photos) over a [`FrontDoor`] that holds no photo,
//! with the probes and metrics. The answers are a replicated PipeStore's, from the same
//! helpers (`photos.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use ndpipe_catalog::Catalog;
use serde::Serialize;

use super::duplicates::{self, DuplicateParams, DuplicatesReply};
use super::error::{ApiError, Counted, count, parse_id};
use super::labels;
use super::photos::{self, MetaReply, Page, PageParams, UploadParams, UploadReply};
use super::{finish, limited_upload, ops};
use crate::duplicates::DuplicateSettings;
use crate::duplicates::semantic::SemanticPairs;
use crate::metrics::StoreMetrics;
use crate::replication::{ClusterStatus, FrontDoor};
use crate::similar::SimilarFront;

/// What a gateway's handlers work with.
#[derive(Clone)]
pub(crate) struct GatewayState {
    front: Arc<FrontDoor>,
    catalog: Arc<dyn Catalog>,
    metrics: Arc<StoreMetrics>,
    similar: Arc<SimilarFront>,
    /// The settings of `GET /v1/duplicates` and its source of semantic pairs.
    duplicates: duplicates::Finding,
}

impl GatewayState {
    /// The state of a gateway in front of `front`, answering bucket and key from `catalog` and
    /// similarity queries through `similar`.
    pub(crate) fn new(
        front: Arc<FrontDoor>,
        catalog: Arc<dyn Catalog>,
        metrics: Arc<StoreMetrics>,
        similar: Arc<SimilarFront>,
    ) -> Self {
        GatewayState {
            front,
            catalog,
            metrics,
            similar,
            duplicates: duplicates::Finding::default(),
        }
    }

    /// The same state, finding duplicates with `settings`, the semantic level's pairs from
    /// `semantic` (without one, `level=semantic` is refused).
    pub(crate) fn with_duplicates(
        self,
        settings: DuplicateSettings,
        semantic: Option<Arc<dyn SemanticPairs>>,
    ) -> Self {
        GatewayState {
            duplicates: duplicates::Finding { settings, semantic },
            ..self
        }
    }
}

impl Counted for GatewayState {
    fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }
}

/// The gateway's router; bodies up to `max_upload_bytes`, `uploads_per_client` uploads in
/// flight per client address (0: any number).
pub(crate) fn gateway_router(
    state: GatewayState,
    max_upload_bytes: usize,
    uploads_per_client: usize,
) -> Router {
    let routes = Router::new()
        .route(
            "/v1/photos",
            limited_upload(upload, uploads_per_client).get(list),
        )
        .route("/v1/photos/{id}", get(get_photo).delete(delete))
        .route("/v1/photos/{id}/meta", get(get_meta))
        .route("/v1/photos/{id}/labels", get(get_labels))
        .route("/v1/cluster", get(cluster))
        .route("/v1/duplicates", get(list_duplicates))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(ops::metrics::<GatewayState>))
        .merge(super::similar::routes(
            Some(state.similar.clone()),
            state.metrics.clone(),
        ));
    finish(routes, state, max_upload_bytes)
}

/// `POST /v1/photos`: placed on `replicas` nodes; 201 once every copy is durable.
async fn upload(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    query: Result<Query<UploadParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<UploadReply>), ApiError> {
    let started = Instant::now();
    let result = async {
        let (body, truth) = photos::upload_input(&headers, query, body)?;
        super::tasks::check_truth(&state.catalog, truth.as_ref()).await?;
        Ok(state.front.upload(body, truth).await?)
    }
    .await;
    photos::answer_upload(&state, started, result)
}

/// `GET /v1/duplicates`: the cluster's groups of duplicate photos, from the catalog.
async fn list_duplicates(
    State(state): State<GatewayState>,
    query: Result<Query<DuplicateParams>, QueryRejection>,
) -> Result<Json<DuplicatesReply>, ApiError> {
    let (catalog, finding) = (state.catalog.clone(), state.duplicates.clone());
    duplicates::answer(&state, catalog, finding, query).await
}

/// `GET /v1/photos/{id}`: the original from the first holder whose copy is intact.
async fn get_photo(
    State(state): State<GatewayState>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let found = state
        .front
        .read(id)
        .await
        .map_err(|e| count(&state, e.into()))?;
    photos::photo_response(&state, id, found, &headers)
}

/// `GET /v1/photos/{id}/meta`: the catalog row, its holders, bucket and key.
async fn get_meta(
    State(state): State<GatewayState>,
    Path(raw): Path<String>,
) -> Result<Json<MetaReply>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    photos::cluster_meta(&state, &state.front, &state.catalog, id)
        .await
        .map(Json)
}

/// `GET /v1/photos/{id}/labels`: the labels under every model version, from the catalog.
async fn get_labels(
    State(state): State<GatewayState>,
    Path(raw): Path<String>,
) -> Result<Json<Vec<labels::VersionLabels>>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    labels::cluster_labels(&state, &state.catalog, &state.front, id).await
}

/// `GET /v1/photos?after=&limit=`: every node's photos with their holders.
async fn list(
    State(state): State<GatewayState>,
    query: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let (after, limit) = photos::page_params(&state, query)?;
    photos::cluster_page(&state, &state.front, &state.catalog, after, limit).await
}

/// `DELETE /v1/photos/{id}`: a tombstone, then every holder's copy; 204, or 404.
async fn delete(
    State(state): State<GatewayState>,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let existed = state
        .front
        .delete(id)
        .await
        .map(|copies| copies.is_some())
        .map_err(ApiError::from);
    photos::answer_delete(&state, id, existed)
}

/// `GET /v1/cluster`: the nodes and copy counts.
async fn cluster(State(state): State<GatewayState>) -> Result<Json<ClusterStatus>, ApiError> {
    let status = state
        .front
        .status()
        .await
        .map_err(|e| count(&state, e.into()))?;
    Ok(Json(status))
}

#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    role: &'static str,
}

/// `GET /healthz`: the gateway runs (it keeps no photos to count).
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok",
        role: "gateway",
    })
}

#[derive(Debug, Serialize)]
struct Ready {
    status: &'static str,
    /// Live, active nodes that take new photos.
    live_nodes: usize,
}

/// `GET /readyz`: 200 when the catalog answers and enough live nodes take uploads for every
/// copy, else 503 `not_ready` saying which.
async fn ready(State(state): State<GatewayState>) -> Result<Json<Ready>, ApiError> {
    let not_ready =
        |message: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message);
    let live_nodes = state
        .front
        .nodes_taking_photos()
        .await
        .map_err(|e| not_ready(format!("the catalog does not answer: {e}")))?;
    let wanted = state.front.replicas();
    if live_nodes < wanted as usize {
        return Err(not_ready(format!(
            "{live_nodes} live nodes take photos, {wanted} copies are wanted"
        )));
    }
    Ok(Json(Ready {
        status: "ready",
        live_nodes,
    }))
}
