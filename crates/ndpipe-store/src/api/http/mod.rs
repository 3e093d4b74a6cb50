//! The PipeStore's client API: `/v1/photos`, labels, search, models, jobs, `/healthz`,
//! `/metrics`.
//!
//! Route groups: [`photos`] (upload, read, list, delete, ground truth), [`labels`] (labels,
//! search, models), [`jobs`] (re-labelling jobs), [`ops`] (health, metrics, compaction),
//! [`keys`] (access keys), [`similar`] (similar photos, cluster-wide), [`duplicates`] (groups
//! of duplicate photos), [`tasks`] (tasks and their labels); [`gateway`] is the
//! photo routes of `ndpipe gateway`, a front door with no store of its own. [`auth`] gives
//! every call the role it needs (bearer token or an access key's secret). Every error is a
//! JSON body (`{"error": kind, "message": ...}`) and is counted by kind ([`error`]): handlers
//! answer [`ApiError`]s, and a layer gives one to any error that comes without a body (405
//! from the router, 431 for oversized headers, ...).

mod auth;
pub(crate) mod cluster;
pub(crate) mod duplicates;
mod error;
mod gateway;
pub(crate) mod jobs;
mod keys;
pub(crate) mod labels;
mod ops;
pub(crate) mod photos;
mod similar;
pub(crate) mod tasks;

use std::sync::Arc;

use axum::Router;
use axum::body::HttpBody;
use axum::extract::{DefaultBodyLimit, FromRef, Request, State};
use axum::handler::Handler;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use ndpipe_catalog::Catalog;
use ndpipe_util::per_client::{PerClientLimit, limit_per_client};

use crate::duplicates::DuplicateSettings;
use crate::duplicates::semantic::SemanticPairs;
use crate::inference::model::Models;
use crate::ingest::Ingestor;
use crate::jobs::Jobs;
use crate::keys::KeyStore;
use crate::membership::Readiness;
use crate::metrics::StoreMetrics;
use crate::objects::SharedObjects;
use crate::similar::SimilarFront;
use crate::storage::PhotoStore;
use crate::words::Words;
pub use auth::guard_router;
pub(crate) use auth::{Guard, authorize, open_to_all};
use error::Counted;
pub(crate) use error::{ApiError, parse_id};
pub(crate) use gateway::{GatewayState, gateway_router};

/// Largest page of `GET /v1/photos` and `GET /v1/search`.
const MAX_PAGE: usize = 1000;
/// Largest accepted request head (header names and values), in bytes; larger is 431.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most headers a request may have; more is 431 (with a JSON body: the HTTP server parses up
/// to `ndpipe_util::serve::MAX_PARSED_HEADERS`, so that this check, not its empty 431, answers).
const MAX_HEADERS: usize = 100;

/// What the handlers work with: ingest for adding and deleting photos, the store for reading
/// them, the catalog for what is known about them, jobs, metrics and the access keys.
#[derive(Clone)]
pub(crate) struct AppState {
    ingestor: Arc<Ingestor>,
    store: Arc<PhotoStore>,
    catalog: Arc<dyn Catalog>,
    jobs: Arc<Jobs>,
    metrics: Arc<StoreMetrics>,
    keys: Arc<KeyStore>,
    /// This node's name, given to its own search hits.
    node: Arc<str>,
    /// Whether the node is in its cluster, for `/readyz`.
    readiness: Arc<Readiness>,
    /// Whether a model is loaded (`/readyz` says so).
    model_loaded: bool,
    /// Where photos' bytes live: this node alone, or the replicated cluster.
    objects: SharedObjects,
    /// The node's models, when one is loaded (a task's new floor applies to them at once).
    models: Option<Arc<Models>>,
    /// The matcher of searches in words, when a model is loaded.
    words: Option<Arc<Words>>,
    /// Similarity queries (`None` without a model).
    similar: Option<Arc<SimilarFront>>,
    /// The settings of `GET /v1/duplicates` and its source of semantic pairs.
    duplicates: duplicates::Finding,
    /// The node's gRPC runs without a cluster secret and without mutual TLS (`/healthz`).
    insecure_cluster: bool,
}

/// What the routes every front door has (photos, labels, duplicates, cluster status) work
/// with, taken from a node's or a gateway's state.
#[derive(Clone)]
pub(crate) struct FrontState {
    objects: SharedObjects,
    catalog: Arc<dyn Catalog>,
    metrics: Arc<StoreMetrics>,
    duplicates: duplicates::Finding,
}

impl FrontState {
    /// Where photos' bytes live.
    pub(crate) fn objects(&self) -> &SharedObjects {
        &self.objects
    }

    /// The process's counters (the console samples them for its storage page).
    pub(crate) fn counters(&self) -> Arc<StoreMetrics> {
        self.metrics.clone()
    }
}

impl Counted for FrontState {
    fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }
}

impl FromRef<AppState> for FrontState {
    fn from_ref(state: &AppState) -> Self {
        FrontState {
            objects: state.objects.clone(),
            catalog: state.catalog.clone(),
            metrics: state.metrics.clone(),
            duplicates: state.duplicates.clone(),
        }
    }
}

impl AppState {
    /// The state of a node's API over `objects` (who may call it is [`authorize`]'s concern).
    pub(crate) fn new(
        (ingestor, objects): (Arc<Ingestor>, SharedObjects),
        store: Arc<PhotoStore>,
        catalog: Arc<dyn Catalog>,
        jobs: Arc<Jobs>,
        metrics: Arc<StoreMetrics>,
        keys: Arc<KeyStore>,
    ) -> Self {
        AppState {
            ingestor,
            store,
            catalog,
            jobs,
            metrics,
            keys,
            node: Arc::from("local"),
            readiness: Arc::new(Readiness::default()),
            model_loaded: false,
            objects,
            models: None,
            words: None,
            similar: None,
            duplicates: duplicates::Finding::default(),
            insecure_cluster: false,
        }
    }

    /// The same state, telling `/healthz` whether the node's gRPC runs without a cluster
    /// secret and without mutual TLS.
    pub(crate) fn with_insecure_cluster(self, insecure_cluster: bool) -> Self {
        AppState {
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
        AppState {
            duplicates: duplicates::Finding::new(settings, semantic),
            ..self
        }
    }

    /// The same state, with the node's models and its matcher of searches in words.
    pub(crate) fn with_models(
        self,
        models: Option<Arc<Models>>,
        words: Option<Arc<Words>>,
    ) -> Self {
        AppState {
            models,
            words,
            ..self
        }
    }

    /// The same state, answering similarity queries through `similar`.
    pub(crate) fn with_similar(self, similar: Option<Arc<SimilarFront>>) -> Self {
        AppState { similar, ..self }
    }

    /// The same state, telling `/readyz` about the node's membership and model.
    pub(crate) fn with_readiness(self, readiness: Arc<Readiness>, model_loaded: bool) -> Self {
        AppState {
            readiness,
            model_loaded,
            ..self
        }
    }

    /// Similarity queries, when a model is loaded.
    pub(crate) fn similar(&self) -> Option<Arc<SimilarFront>> {
        self.similar.clone()
    }

    /// The same state for node `name` (its search hits carry the name).
    pub(crate) fn named(self, name: &str) -> Self {
        AppState {
            node: Arc::from(name),
            ..self
        }
    }
}

/// The router of the client API; request bodies are limited to `max_upload_bytes`, and one
/// client address may have `uploads_per_client` uploads in flight (0: any number), counted
/// before the body is read.
pub(crate) fn router(
    state: AppState,
    max_upload_bytes: usize,
    uploads_per_client: usize,
) -> Router {
    let writes = Router::new()
        .route(
            "/v1/photos",
            limited_upload(photos::upload, uploads_per_client),
        )
        .route("/v1/photos/{id}", delete(photos::delete))
        .route(
            "/v1/photos/{id}/ground-truth",
            put(photos::set_ground_truth),
        )
        .route("/v1/tasks", post(tasks::create))
        .route("/v1/tasks/{task}", put(tasks::update))
        .route(
            "/v1/tasks/{task}/labels",
            post(tasks::label).delete(tasks::unlabel),
        )
        .route("/v1/photos/{id}/labels/{task}", post(tasks::confirm))
        .route("/v1/admin/compact", post(ops::compact))
        .route("/v1/jobs/relabel", post(jobs::start_relabel))
        .route("/v1/admin/keys", post(keys::create).get(keys::list))
        .route("/v1/admin/keys/{name}", delete(keys::delete));
    let reads = Router::new()
        .route("/v1/photos", get(photos::list))
        .route("/v1/photos/{id}", get(photos::get_photo))
        .route("/v1/photos/{id}/meta", get(photos::get_meta))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/photos/{id}/tensor", get(photos::get_tensor))
        .route("/v1/photos/{id}/labels", get(labels::get_labels))
        .route("/v1/search", get(labels::search))
        .route("/v1/tasks", get(tasks::list))
        .route("/v1/tasks/{task}", get(tasks::get_task))
        .route("/v1/duplicates", get(duplicates::list))
        .route("/v1/photos/{id}/duplicates", get(duplicates::photo_group))
        .route("/v1/models", get(labels::models))
        .route("/v1/jobs", get(jobs::list))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .route("/healthz", get(ops::health))
        .route("/readyz", get(ops::ready))
        .route("/metrics", get(ops::metrics::<AppState>))
        .merge(similar::routes(
            state.similar.clone(),
            state.metrics.clone(),
        ))
        .merge(similar::neighbour_routes(
            state.similar.clone(),
            state.metrics.clone(),
        ));
    finish(writes.merge(reads), state, max_upload_bytes)
}

/// `POST` to `handler`, behind the cap of `uploads_per_client` uploads in flight per client
/// address (0: no cap), counted before the body is read.
fn limited_upload<H, T, S>(handler: H, uploads_per_client: usize) -> MethodRouter<S>
where
    H: Handler<T, S>,
    T: 'static,
    S: Clone + Send + Sync + 'static,
{
    let uploads = PerClientLimit::new(uploads_per_client);
    post(handler).layer(middleware::from_fn(move |req, next| {
        limit_per_client(uploads.clone(), req, next)
    }))
}

/// `routes` with what every client API has: JSON 404 and 405 answers, a JSON body for every
/// error that has none (counted), the header limit and the body limit of `max_upload_bytes`.
fn finish<S>(routes: Router<S>, state: S, max_upload_bytes: usize) -> Router
where
    S: Counted + Clone + Send + Sync + 'static,
{
    routes
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .layer(middleware::map_response_with_state(
            state.clone(),
            json_errors::<S>,
        ))
        .layer(middleware::from_fn(limit_headers))
        .layer(DefaultBodyLimit::max(max_upload_bytes))
        .with_state(state)
}

/// Answers 431 with a JSON body when the request has more than [`MAX_HEADERS`] headers or
/// they exceed [`MAX_HEADER_BYTES`].
async fn limit_headers(req: Request, next: Next) -> Response {
    let count = req.headers().len();
    if count > MAX_HEADERS {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request has {count} headers, the limit is {MAX_HEADERS}"),
        )
        .into_response();
    }
    let bytes: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("request headers are {bytes} bytes, the limit is {MAX_HEADER_BYTES}"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Gives an error response that has no body the JSON error body (keeping its headers, e.g.
/// `Allow` of a 405) and counts it.
async fn json_errors<S: Counted>(State(state): State<S>, response: Response) -> Response {
    let status = response.status();
    let is_error = status.is_client_error() || status.is_server_error();
    if !is_error || response.body().size_hint().exact() != Some(0) {
        return response;
    }
    let kind = error::kind_of(status);
    state.metrics().error(kind);
    let message = status.canonical_reason().unwrap_or("error").to_lowercase();
    let mut json = ApiError::new(status, kind, message).into_response();
    for (name, value) in response.headers() {
        if name != header::CONTENT_LENGTH && name != header::CONTENT_TYPE {
            json.headers_mut().append(name.clone(), value.clone());
        }
    }
    json
}

/// A query parameter `limit` checked against [`MAX_PAGE`].
fn page_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be 1..={MAX_PAGE}"),
        ));
    }
    Ok(limit)
}

#[cfg(test)]
impl AppState {
    /// The state over a test [`Setup`](crate::testing::Setup), without a model or token.
    pub(crate) fn for_tests(s: &crate::testing::Setup) -> Self {
        let metrics = Arc::new(StoreMetrics::default());
        let ingestor = Ingestor::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            metrics.clone(),
            crate::ingest::IngestConfig::default(),
        );
        let jobs = Jobs::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            None,
            crate::inference::RelabelOptions::default(),
        );
        let ingestor = Arc::new(ingestor);
        let objects = Arc::new(crate::objects::Local::new(
            ingestor.clone(),
            s.store.clone(),
            Arc::new(crate::storage::Blobs::open(s._dir.path().join("blobs")).expect("test blobs")),
            s.catalog.clone(),
        ));
        AppState::new(
            (ingestor, objects),
            s.store.clone(),
            s.catalog.clone(),
            Arc::new(jobs),
            metrics,
            Arc::new(
                KeyStore::with_catalog(
                    s.catalog.clone(),
                    s._dir.path(),
                    None,
                    crate::key_cache::DEFAULT_REFRESH,
                )
                .expect("a test key store"),
            ),
        )
    }
}
