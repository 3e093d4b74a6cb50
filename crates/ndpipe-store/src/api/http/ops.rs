//! Operations: health, metrics, compaction.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;

use super::AppState;
use super::error::{ApiError, blocking, count};
use crate::storage::{CompactionReport, StoreError};

#[derive(Debug, Serialize)]
pub(super) struct Health {
    status: &'static str,
    photos: u64,
    disk_bytes: u64,
}

/// `GET /healthz`: live photos and the volumes' disk bytes.
pub(super) async fn health(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let store = state.store.clone();
    let (photos, disk_bytes) = blocking(&state, move || {
        Ok::<_, StoreError>((store.len()?, store.disk_bytes()?))
    })
    .await?;
    Ok(Json(Health {
        status: "ok",
        photos,
        disk_bytes,
    }))
}

/// `GET /metrics`: the OpenMetrics exposition.
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
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
