//! Jobs: start a re-labelling of the whole store, list jobs, follow one.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, blocking, count};
use crate::jobs::JobView;

#[derive(Debug, Deserialize)]
pub(crate) struct RelabelParams {
    model: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Started {
    id: String,
}

/// `POST /v1/jobs/relabel?model=`: 202 with the job id; 409 while another job runs.
pub(crate) async fn start_relabel(
    State(state): State<AppState>,
    query: Result<Query<RelabelParams>, QueryRejection>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let jobs = state.jobs.clone();
    let id = blocking(&state, move || jobs.start_relabel(params.model.as_deref())).await?;
    Ok((StatusCode::ACCEPTED, Json(Started { id })))
}

/// `GET /v1/jobs`: every job, oldest first.
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<Vec<JobView>>, ApiError> {
    let jobs = state.jobs.clone();
    Ok(Json(blocking(&state, move || jobs.list()).await?))
}

/// `GET /v1/jobs/{id}`: one job, with live progress while it runs.
pub(super) async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let jobs = state.jobs.clone();
    let lookup = id.clone();
    let job = blocking(&state, move || jobs.get(&lookup)).await?;
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
