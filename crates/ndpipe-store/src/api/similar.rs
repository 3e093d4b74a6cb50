//! The tonic adapter of the `Similar` service over this node's [`SimilarIndex`] and
//! [`Embedder`]: a front door's batch search, a stored photo's features, a query photo's
//! features; behind the cluster secret. Client errors travel as `HTTP-STATUS KIND MESSAGE`, so
//! that the front door answers its client what this node would have.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use ndpipe_proto::pb;
use ndpipe_proto::pb::similar_server::{Similar as SimilarRpc, SimilarServer};
use ndpipe_proto::transport::{ClusterSecret, Guard};
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Request, Response, Status};

use crate::api::http::ApiError;
use crate::similar::metrics::SimilarMetrics;
use crate::similar::{Embedder, Queries, SimilarError, SimilarIndex};
use crate::storage::PhotoStore;

/// The tonic service over this node's index.
#[derive(Clone)]
pub(crate) struct SimilarService {
    index: Arc<SimilarIndex>,
    embedder: Embedder,
    store: Arc<PhotoStore>,
    metrics: SimilarMetrics,
}

impl SimilarService {
    /// The gRPC server, taking query photos up to `max_message` bytes, behind the cluster
    /// secret.
    pub(crate) fn server(
        index: Arc<SimilarIndex>,
        embedder: Embedder,
        store: Arc<PhotoStore>,
        metrics: SimilarMetrics,
        (secret, max_message): (Option<ClusterSecret>, usize),
    ) -> InterceptedService<SimilarServer<Self>, Guard> {
        let server = SimilarServer::new(SimilarService {
            index,
            embedder,
            store,
            metrics,
        })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
        InterceptedService::new(server, Guard(secret))
    }
}

/// `e` as a gRPC status: a client error carries its HTTP status and kind in the message.
fn status(e: SimilarError) -> Status {
    let api = ApiError::from(e);
    let code = match api.status {
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::CONFLICT => Code::FailedPrecondition,
        s if s.is_client_error() => Code::InvalidArgument,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(
        code,
        format!("{} {} {}", api.status.as_u16(), api.kind, api.message),
    )
}

#[tonic::async_trait]
impl SimilarRpc for SimilarService {
    async fn search(
        &self,
        request: Request<pb::SimilarSearchRequest>,
    ) -> Result<Response<pb::SimilarSearchReply>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let index = self.index.clone();
        let found = tokio::task::spawn_blocking(move || {
            index.search(&Queries {
                backbone: &req.backbone,
                vectors: &req.queries,
                dim: req.dim as usize,
                k: req.k as usize,
                min_score: req.min_score,
                exclude: &req.exclude,
            })
        })
        .await
        .map_err(|e| status(e.into()))?
        .map_err(status)?;
        self.metrics.query("node", started.elapsed().as_secs_f64());
        Ok(Response::new(pb::SimilarSearchReply {
            backbone: found.backbone,
            building: found.building,
            results: found
                .hits
                .into_iter()
                .map(|hits| {
                    let (ids, scores) = hits.into_iter().unzip();
                    pb::SimilarHits { ids, scores }
                })
                .collect(),
        }))
    }

    async fn features(
        &self,
        request: Request<pb::SimilarFeaturesRequest>,
    ) -> Result<Response<pb::SimilarFeatures>, Status> {
        let id = request.into_inner().id;
        let (store, index) = (self.store.clone(), self.index.clone());
        let found = tokio::task::spawn_blocking(move || {
            if !store.contains(id)? {
                return Err(SimilarError::NotFound(id));
            }
            index
                .features_of(id)?
                .ok_or_else(|| SimilarError::NotLabelled {
                    id,
                    backbone: index.active_backbone(),
                })
        })
        .await
        .map_err(|e| status(e.into()))?
        .map_err(status)?;
        Ok(Response::new(pb::SimilarFeatures {
            backbone: found.0,
            features: found.1,
        }))
    }

    async fn embed(
        &self,
        request: Request<pb::SimilarEmbedRequest>,
    ) -> Result<Response<pb::SimilarFeatures>, Status> {
        let photo = request.into_inner().photo;
        let (backbone, features) = self.embedder.embed(photo.into()).await.map_err(status)?;
        Ok(Response::new(pb::SimilarFeatures { backbone, features }))
    }
}
