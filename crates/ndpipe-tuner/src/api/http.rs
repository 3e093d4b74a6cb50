//! The Tuner's HTTP API for operators, under `/v1/tuner`.
//!
//! `GET /v1/tuner/nodes`, `GET /v1/tuner/versions`, `POST /v1/tuner/finetune` (a
//! [`FinetuneRequest`] body) and `POST /v1/tuner/deploy/{version}` (also the rollback). With a
//! token, the POSTs need `Authorization: Bearer <token>`. Errors are `{"error": kind, "message"}`.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use ndpipe_catalog::ModelVersion;
use ndpipe_util::http::{error_response, require_bearer};

use crate::{DeployReport, FinetuneReport, FinetuneRequest, NodeView, Tuner, TunerError};

/// The routes over `tuner`; `token` guards the POSTs.
pub(crate) fn router(tuner: Arc<Tuner>, token: Option<Arc<str>>) -> Router {
    let writes = Router::new()
        .route("/v1/tuner/finetune", post(finetune))
        .route("/v1/tuner/deploy/{version}", post(deploy))
        .route_layer(middleware::from_fn(move |req: Request, next: Next| {
            require_bearer(token.clone(), req, next)
        }));
    Router::new()
        .route("/v1/tuner/nodes", get(nodes))
        .route("/v1/tuner/versions", get(versions))
        .merge(writes)
        .with_state(tuner)
}

/// The one mapping of Tuner errors to HTTP: status and stable `error` kind.
impl From<TunerError> for Response {
    fn from(e: TunerError) -> Self {
        let (status, kind) = match &e {
            TunerError::Busy => (StatusCode::CONFLICT, "job_running"),
            TunerError::NoNodes => (StatusCode::CONFLICT, "no_nodes"),
            TunerError::UnknownVersion(_) => (StatusCode::NOT_FOUND, "unknown_model"),
            TunerError::Node { .. } => (StatusCode::BAD_GATEWAY, "node_failed"),
            TunerError::DeployAborted { .. } => (StatusCode::CONFLICT, "deploy_aborted"),
            TunerError::EmptyData => (StatusCode::CONFLICT, "no_training_data"),
            TunerError::InvalidArgument(_) | TunerError::InputDimMismatch { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        error_response(status, kind, &e.to_string())
    }
}

async fn finetune(
    State(tuner): State<Arc<Tuner>>,
    body: Result<Json<FinetuneRequest>, JsonRejection>,
) -> Result<Json<FinetuneReport>, Response> {
    let Json(req) =
        body.map_err(|e| error_response(StatusCode::BAD_REQUEST, "bad_body", &e.body_text()))?;
    Ok(Json(tuner.finetune(req).await?))
}

async fn nodes(State(tuner): State<Arc<Tuner>>) -> Json<Vec<NodeView>> {
    Json(tuner.nodes())
}

async fn versions(State(tuner): State<Arc<Tuner>>) -> Result<Json<Vec<ModelVersion>>, Response> {
    Ok(Json(tuner.versions()?))
}

async fn deploy(
    State(tuner): State<Arc<Tuner>>,
    Path(version): Path<String>,
) -> Result<Json<DeployReport>, Response> {
    Ok(Json(tuner.deploy(&version).await?))
}
