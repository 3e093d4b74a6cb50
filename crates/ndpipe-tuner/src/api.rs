//! The Tuner's HTTP API for operators, under `/v1/tuner`.

use std::sync::Arc;

use axum::extract::Request;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::TunerError;
use crate::coordinator::{Coordinator, FinetuneRequest};

#[derive(Serialize)]
struct ErrorBody {
    error: &'static str,
    message: String,
}

struct ApiError(StatusCode, &'static str, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.0,
            Json(ErrorBody {
                error: self.1,
                message: self.2,
            }),
        )
            .into_response()
    }
}

impl From<TunerError> for ApiError {
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
        ApiError(status, kind, e.to_string())
    }
}

/// Routes: `POST /v1/tuner/finetune`, `GET /v1/tuner/nodes`, `GET /v1/tuner/versions`,
/// `POST /v1/tuner/deploy/{version}` (also the rollback). With a `token`, the POSTs need
/// `Authorization: Bearer <token>`.
pub fn router(coordinator: Arc<Coordinator>, token: Option<String>) -> Router {
    let writes = Router::new()
        .route("/v1/tuner/finetune", post(finetune))
        .route("/v1/tuner/deploy/{version}", post(deploy))
        .route_layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = token.clone();
            async move {
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                match (&token, given) {
                    (Some(t), Some(g)) if same(t.as_bytes(), g.as_bytes()) => next.run(req).await,
                    (Some(_), _) => ApiError(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "a valid bearer token is required".into(),
                    )
                    .into_response(),
                    (None, _) => next.run(req).await,
                }
            }
        }));
    Router::new()
        .route("/v1/tuner/nodes", get(nodes))
        .route("/v1/tuner/versions", get(versions))
        .merge(writes)
        .with_state(coordinator)
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn finetune(
    State(c): State<Arc<Coordinator>>,
    body: Result<Json<FinetuneRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) =
        body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, "bad_body", e.body_text()))?;
    Ok(Json(c.finetune(req).await?).into_response())
}

async fn nodes(State(c): State<Arc<Coordinator>>) -> Response {
    Json(c.nodes()).into_response()
}

async fn versions(State(c): State<Arc<Coordinator>>) -> Result<Response, ApiError> {
    Ok(Json(c.versions().list()?).into_response())
}

async fn deploy(
    State(c): State<Arc<Coordinator>>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(c.deploy(&version).await?).into_response())
}
