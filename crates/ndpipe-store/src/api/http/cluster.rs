//! `GET /v1/cluster`: the replicated cluster as this front door sees it (404 `not_replicated` on a
//! node that keeps single copies).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::FrontState;
use super::error::{ApiError, count};
use crate::replication::ClusterStatus;

/// `GET /v1/cluster`: nodes, copy counts, and this node's repair work.
pub(crate) async fn status(
    State(state): State<FrontState>,
) -> Result<Json<ClusterStatus>, ApiError> {
    let found = (state.objects.cluster().await).map_err(|e| count(&state, e.into()))?;
    let Some(status) = found else {
        return Err(count(
            &state,
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_replicated",
                "this node keeps single copies (replicas = 1): there is no cluster status",
            ),
        ));
    };
    Ok(Json(status))
}
