//! Operations: health, metrics, compaction.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;

use super::AppState;
use super::error::{ApiError, Counted, blocking, count};
use crate::storage::{CompactionReport, StoreError};

#[derive(Debug, Serialize)]
pub(super) struct Health {
    status: &'static str,
    photos: u64,
    disk_bytes: u64,
    /// Free bytes on the store's file system.
    free_bytes: u64,
    /// Whether free space is below the reserve, so uploads are refused (507).
    read_only: bool,
    /// The free-space reserve (`min_free_bytes`): `read_only` while `free_bytes` is below it.
    reserve_bytes: u64,
    /// gRPC runs without a cluster secret and without mutual TLS, open to anyone who reaches
    /// its port.
    insecure_cluster: bool,
}

/// `GET /healthz`: live photos, the volumes' disk bytes, free space and whether uploads are
/// refused for lack of it.
pub(super) async fn health(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let store = state.store.clone();
    let (photos, disk_bytes, (free_bytes, read_only)) = blocking(&state, move || {
        Ok::<_, StoreError>((store.len()?, store.disk_bytes()?, store.free_space()?))
    })
    .await?;
    Ok(Json(Health {
        status: "ok",
        photos,
        disk_bytes,
        free_bytes,
        read_only,
        reserve_bytes: state.store.reserve_bytes(),
        insecure_cluster: state.insecure_cluster,
    }))
}

#[derive(Debug, Serialize)]
pub(super) struct Ready {
    status: &'static str,
    /// Whether a model is loaded (a node started without one stores photos unlabelled).
    model: bool,
    /// Whether the node is in its Tuner's cluster (true when it joins none).
    in_cluster: bool,
}

/// `GET /readyz`: 200 when the catalog answers and the node is in its cluster (its last
/// registration or heartbeat was answered), else 503 `not_ready` saying which.
pub(super) async fn ready(State(state): State<AppState>) -> Result<Json<Ready>, ApiError> {
    let catalog = state.catalog.clone();
    blocking(&state, move || catalog.count_photos())
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                format!("the catalog does not answer: {}", e.message),
            )
        })?;
    if !state.readiness.in_cluster() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the Tuner has not answered this node's registration or last heartbeat",
        ));
    }
    Ok(Json(Ready {
        status: "ready",
        model: state.model_loaded,
        in_cluster: true,
    }))
}

/// `GET /metrics`: the OpenMetrics exposition.
pub(super) async fn metrics<S: Counted>(State(state): State<S>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics().encode(),
    )
}

/// `POST /v1/admin/compact`: rewrites the volumes with only live records.
pub(super) async fn compact(
    State(state): State<AppState>,
) -> Result<Json<CompactionReport>, ApiError> {
    let report = state
        .store
        .compact()
        .await
        .map_err(|e| count(&state, e.into()))?;
    Ok(Json(report))
}
