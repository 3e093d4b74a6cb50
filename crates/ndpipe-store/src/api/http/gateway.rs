//! The client API of `ndpipe gateway`: the routes every front door has (photos, labels,
//! cluster status, duplicates, similar photos) over the cluster's [`Objects`], with the
//! gateway's own probes and the metrics. It holds no photo, so it has no tensor, search, task
//! or job routes.
//!
//! [`Objects`]: crate::objects::Objects

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use ndpipe_catalog::Catalog;
use serde::Serialize;

use super::error::{ApiError, Counted};
use super::{FrontState, cluster, duplicates, finish, labels, limited_upload, ops, photos};
use crate::duplicates::DuplicateSettings;
use crate::duplicates::semantic::SemanticPairs;
use crate::metrics::StoreMetrics;
use crate::objects::{Gateway, SharedObjects};
use crate::replication::FrontDoor;
use crate::similar::SimilarFront;

/// What a gateway's handlers work with.
#[derive(Clone)]
pub(crate) struct GatewayState {
    /// The cluster's front door, for `/readyz`.
    front: Arc<FrontDoor>,
    objects: SharedObjects,
    catalog: Arc<dyn Catalog>,
    metrics: Arc<StoreMetrics>,
    similar: Arc<SimilarFront>,
    /// The settings of `GET /v1/duplicates` and its source of semantic pairs.
    duplicates: duplicates::Finding,
    /// Calls to the PipeStores carry no cluster secret and no TLS (`/healthz` says so).
    insecure_cluster: bool,
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
            objects: Arc::new(Gateway::new(front.clone())),
            front,
            catalog,
            metrics,
            similar,
            duplicates: duplicates::Finding::default(),
            insecure_cluster: false,
        }
    }

    /// The same state, telling `/healthz` whether calls to the PipeStores go without a cluster
    /// secret and without TLS.
    pub(crate) fn with_insecure_cluster(self, insecure_cluster: bool) -> Self {
        GatewayState {
            insecure_cluster,
            ..self
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
            duplicates: duplicates::Finding::new(settings, semantic),
            ..self
        }
    }

    /// Similarity queries over the PipeStores' indexes.
    pub(crate) fn similar(&self) -> Arc<SimilarFront> {
        self.similar.clone()
    }

    /// The cluster's objects, as the gateway's S3 API serves them too.
    pub(crate) fn objects(&self) -> SharedObjects {
        self.objects.clone()
    }
}

impl Counted for GatewayState {
    fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }
}

impl FromRef<GatewayState> for FrontState {
    fn from_ref(state: &GatewayState) -> Self {
        FrontState {
            objects: state.objects.clone(),
            catalog: state.catalog.clone(),
            metrics: state.metrics.clone(),
            duplicates: state.duplicates.clone(),
        }
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
            limited_upload(photos::upload, uploads_per_client).get(photos::list),
        )
        .route(
            "/v1/photos/{id}",
            get(photos::get_photo).delete(photos::delete),
        )
        .route("/v1/photos/{id}/meta", get(photos::get_meta))
        .route("/v1/photos/{id}/labels", get(labels::get_labels))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/duplicates", get(duplicates::list))
        .route("/v1/photos/{id}/duplicates", get(duplicates::photo_group))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(ops::metrics::<GatewayState>))
        .merge(super::similar::routes(
            Some(state.similar.clone()),
            state.metrics.clone(),
        ));
    finish(routes, state, max_upload_bytes)
}

#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    role: &'static str,
    /// Calls to the PipeStores carry no cluster secret and no TLS.
    insecure_cluster: bool,
}

/// `GET /healthz`: the gateway runs (it keeps no photos to count).
async fn health(State(state): State<GatewayState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        role: "gateway",
        insecure_cluster: state.insecure_cluster,
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
