//! Similar photos, on every front door (`ndpipe serve`, each PipeStore, `ndpipe gateway`):
//! `GET /v1/photos/{id}/similar?k=` (the stored photo's features as the query, the photo left
//! out) and `POST /v1/similar?k=` (the body is a query photo, never stored); on a PipeStore,
//! `POST /v1/similar/neighbours` (a batch of this node's photos: their neighbours above a
//! cosine similarity, cluster-wide; the API for semantic duplicates). All need the `read`
//! role. The answer names each hit's score and node, and the nodes that did not answer.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, Counted, count, internal, parse_id};
use crate::metrics::StoreMetrics;
use crate::similar::{Answer, Neighbours, SimilarError, SimilarFront};

/// Photos one `POST /v1/similar/neighbours` may ask about: a larger set is asked in pages.
pub(crate) const MAX_NEIGHBOUR_IDS: usize = 1024;

/// What the similarity routes work with (`None`: a node that indexes nothing, having no model).
#[derive(Clone)]
struct SimilarState {
    front: Option<Arc<SimilarFront>>,
    metrics: Arc<StoreMetrics>,
}

impl Counted for SimilarState {
    fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }
}

/// The similarity routes over `front`, errors counted in `metrics`.
pub(super) fn routes<S>(front: Option<Arc<SimilarFront>>, metrics: Arc<StoreMetrics>) -> Router<S> {
    Router::new()
        .route("/v1/photos/{id}/similar", get(by_photo))
        .route("/v1/similar", post(by_upload))
        .with_state(SimilarState { front, metrics })
}

/// The neighbours route of a PipeStore over `front`, errors counted in `metrics`.
pub(super) fn neighbour_routes<S>(
    front: Option<Arc<SimilarFront>>,
    metrics: Arc<StoreMetrics>,
) -> Router<S> {
    Router::new()
        .route("/v1/similar/neighbours", post(neighbours))
        .with_state(SimilarState { front, metrics })
}

/// Query parameters of both routes.
#[derive(Debug, Deserialize)]
struct KParams {
    /// Hits wanted (default and limit: the `similar_default_k` and `similar_max_k` settings).
    k: Option<usize>,
}

/// The front door and the checked `k`, or why the query is refused.
fn prepare(
    state: &SimilarState,
    query: Result<Query<KParams>, QueryRejection>,
) -> Result<(&SimilarFront, usize), ApiError> {
    let front = state
        .front
        .as_deref()
        .ok_or_else(|| count(state, SimilarError::NoModel.into()))?;
    let Query(params) =
        query.map_err(|e| count(state, ApiError::bad_request("bad_query", e.body_text())))?;
    let k = front.k(params.k).map_err(|e| count(state, e.into()))?;
    Ok((front, k))
}

/// `GET /v1/photos/{id}/similar?k=`: 404 for an unknown photo, 409 for one not labelled yet.
async fn by_photo(
    State(state): State<SimilarState>,
    Path(raw): Path<String>,
    query: Result<Query<KParams>, QueryRejection>,
) -> Result<Json<Answer>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let (front, k) = prepare(&state, query)?;
    front
        .by_photo(id, k)
        .await
        .map(Json)
        .map_err(|e| count(&state, e.into()))
}

/// `POST /v1/similar?k=`: the body is refused as an upload's would be (400, 413, 415, 422).
async fn by_upload(
    State(state): State<SimilarState>,
    query: Result<Query<KParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Answer>, ApiError> {
    let (front, k) = prepare(&state, query)?;
    let body = body.map_err(|e| {
        let e = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                e.body_text(),
            )
        } else {
            ApiError::bad_request("bad_body", e.body_text())
        };
        count(&state, e)
    })?;
    front
        .by_upload(body, k)
        .await
        .map(Json)
        .map_err(|e| count(&state, e.into()))
}

/// The body of `POST /v1/similar/neighbours`.
#[derive(Debug, Deserialize)]
struct NeighboursBody {
    /// Photos of this node, at most [`MAX_NEIGHBOUR_IDS`].
    ids: Vec<u64>,
    /// The least cosine similarity of a neighbour, in -1..=1.
    min_score: f32,
    /// Neighbours per photo, at most (default and limit: `similar_default_k`, `similar_max_k`).
    k: Option<usize>,
}

/// The answer of `POST /v1/similar/neighbours`.
#[derive(Debug, Serialize)]
struct NeighboursReply {
    #[serde(flatten)]
    neighbours: Neighbours,
    /// Whether some node did not answer, or answered from an index being built.
    partial: bool,
}

/// `POST /v1/similar/neighbours` (`{"ids": [...], "min_score": 0.95, "k": 10}`): for each
/// photo of this node, the cluster's photos at or above `min_score`; photos without features
/// here are listed apart. 400 for a bad body or more than [`MAX_NEIGHBOUR_IDS`] ids.
async fn neighbours(
    State(state): State<SimilarState>,
    body: Result<Json<NeighboursBody>, JsonRejection>,
) -> Result<Json<NeighboursReply>, ApiError> {
    let front = state
        .front
        .as_deref()
        .ok_or_else(|| count(&state, SimilarError::NoModel.into()))?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    if body.ids.len() > MAX_NEIGHBOUR_IDS {
        let e = SimilarError::BadQuery(format!(
            "{} ids: ask for at most {MAX_NEIGHBOUR_IDS} at a time",
            body.ids.len()
        ));
        return Err(count(&state, e.into()));
    }
    let k = front.k(body.k).map_err(|e| count(&state, e.into()))?;
    let neighbours = front
        .neighbours(&body.ids, body.min_score, k)
        .await
        .map_err(|e| count(&state, e.into()))?;
    let partial = neighbours.partial();
    Ok(Json(NeighboursReply {
        neighbours,
        partial,
    }))
}

impl From<SimilarError> for ApiError {
    fn from(e: SimilarError) -> Self {
        let status = |s: StatusCode, kind: &'static str, e: &SimilarError| {
            ApiError::new(s, kind, e.to_string())
        };
        match e {
            SimilarError::Rejected(e) => e.into(),
            SimilarError::Remote {
                status: code,
                kind,
                message,
            } => ApiError::new(
                StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
                kind,
                message,
            ),
            SimilarError::NotFound(id) => ApiError::photo_not_found(id),
            e @ SimilarError::NotLabelled { .. } => {
                status(StatusCode::CONFLICT, "not_labelled", &e)
            }
            e @ SimilarError::OtherBackbone { .. } => {
                status(StatusCode::CONFLICT, "other_backbone", &e)
            }
            e @ SimilarError::BadQuery(_) => status(StatusCode::BAD_REQUEST, "bad_query", &e),
            e @ SimilarError::NoModel => status(StatusCode::SERVICE_UNAVAILABLE, "no_model", &e),
            e @ SimilarError::Unavailable(_) => {
                status(StatusCode::SERVICE_UNAVAILABLE, "similar_unavailable", &e)
            }
            e => internal(ErrorChain(&e)),
        }
    }
}

/// An error with its sources, for a 500's message.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
