//! The tonic adapter of the `Replication` service over [`Replication`]: the calls between the
//! front doors, primaries and holders of a replicated cluster, behind the cluster secret.

use std::sync::Arc;

use axum::http::StatusCode;
use ndpipe_catalog::{GroundTruth, Split, TaskName};
use ndpipe_proto::pb;
use ndpipe_proto::pb::replication_server::{Replication as ReplicationRpc, ReplicationServer};
use ndpipe_proto::transport::{ClusterSecret, Guard};
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Request, Response, Status};

use crate::api::http::ApiError;
use crate::replication::{CopyError, Replication, ReplicationError};
use crate::storage::StoreError;

/// The error kinds a primary may answer, which a front door passes on as they are.
const KINDS: &[&str] = &[
    "empty_body",
    "unsupported_format",
    "too_many_pixels",
    "truncated_image",
    "invalid_image",
    "invalid_label",
    "invalid_split",
    "insufficient_storage",
    "catalog_unavailable",
    "catalog_error",
    "shutting_down",
    "storage_error",
    "corrupt_data",
    "conflict",
    "replica_unavailable",
    "insufficient_replicas",
    "internal",
];

/// The tonic service over this node's replication.
#[derive(Clone)]
pub(crate) struct ReplicationService(Arc<Replication>);

impl ReplicationService {
    /// The gRPC server, taking messages as large as the largest upload and its tensor, behind
    /// the cluster secret.
    pub(crate) fn server(
        replication: Arc<Replication>,
        secret: Option<ClusterSecret>,
    ) -> InterceptedService<ReplicationServer<Self>, Guard> {
        let limit = replication.front().max_message();
        let server = ReplicationServer::new(ReplicationService(replication))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        InterceptedService::new(server, Guard(secret))
    }
}

/// An HTTP error as a gRPC status whose message is `status kind message`, so that a front door
/// answers its client what the primary would have.
fn api_status(e: ApiError) -> Status {
    let code = match e.status {
        s if s.is_client_error() => Code::InvalidArgument,
        StatusCode::INSUFFICIENT_STORAGE => Code::ResourceExhausted,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(
        code,
        format!("{} {} {}", e.status.as_u16(), e.kind, e.message),
    )
}

/// A primary's status as the HTTP error it stands for; a status from anything else is 503.
pub(crate) fn remote_error(status: &Status) -> ApiError {
    let mut parts = status.message().splitn(3, ' ');
    let (code, kind, message) = (parts.next(), parts.next(), parts.next());
    if let (Some(code), Some(kind), Some(message)) = (code, kind, message)
        && let Ok(code) = code.parse::<u16>()
        && let Ok(http) = StatusCode::from_u16(code)
        && let Some(kind) = KINDS.iter().find(|k| **k == kind)
    {
        return ApiError::new(http, kind, message);
    }
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "replica_unavailable",
        format!("the photo's primary answered: {}", status.message()),
    )
}

fn copy_status(e: CopyError) -> Status {
    match e {
        CopyError::Invalid(m) => Status::invalid_argument(m),
        CopyError::Deleted(_) => Status::failed_precondition(e.to_string()),
        CopyError::NotHeld(_) | CopyError::NoFile(_) => Status::not_found(e.to_string()),
        CopyError::DamagedFile(_) => Status::data_loss(e.to_string()),
        CopyError::Store(StoreError::Corrupt { .. }) => Status::data_loss(e.to_string()),
        CopyError::Store(StoreError::InsufficientStorage { .. }) => {
            Status::resource_exhausted(e.to_string())
        }
        other => Status::unavailable(other.to_string()),
    }
}

fn ground_truth(label: String, split: &str, task: &str) -> Result<Option<GroundTruth>, Status> {
    if label.is_empty() {
        return Ok(None);
    }
    let task = match task {
        "" => TaskName::default_task(),
        name => name.parse().map_err(|e: ndpipe_catalog::CatalogError| {
            api_status(ApiError::bad_request("invalid_task", e.to_string()))
        })?,
    };
    let split: Split = if split.is_empty() {
        Split::Train
    } else {
        split.parse().map_err(|e: ndpipe_catalog::CatalogError| {
            api_status(ApiError::bad_request("invalid_split", e.to_string()))
        })?
    };
    Ok(Some(GroundTruth { task, label, split }))
}

#[tonic::async_trait]
impl ReplicationRpc for ReplicationService {
    async fn ingest(
        &self,
        request: Request<pb::IngestRequest>,
    ) -> Result<Response<pb::IngestReply>, Status> {
        let req = request.into_inner();
        let truth = ground_truth(req.label, &req.split, &req.task)?;
        let record = self
            .0
            .ingest_primary(req.original.into(), truth, req.copies)
            .await
            .map_err(|e| api_status(e.into()))?;
        Ok(Response::new(pb::IngestReply {
            id: record.id,
            meta_json: serde_json::to_string(&record.meta)
                .expect("metadata serialises; this is a bug"),
        }))
    }

    async fn put_copy(
        &self,
        request: Request<pb::PhotoCopy>,
    ) -> Result<Response<pb::PutCopyReply>, Status> {
        self.0
            .receive_copy(request.into_inner())
            .await
            .map_err(copy_status)?;
        Ok(Response::new(pb::PutCopyReply {}))
    }

    async fn read_copy(
        &self,
        request: Request<pb::ReadCopyRequest>,
    ) -> Result<Response<pb::PhotoCopy>, Status> {
        let id = request.into_inner().id;
        match self.0.read_local_copy(id).await {
            Ok(copy) => Ok(Response::new(copy)),
            Err(e) => {
                if matches!(e, CopyError::Store(StoreError::Corrupt { .. })) {
                    let replication = self.0.clone();
                    tokio::spawn(async move {
                        if let Err(e) = replication.repair_local(id).await {
                            tracing::warn!(photo = id, error = %e, "a damaged copy could not be repaired yet");
                        }
                    });
                }
                Err(copy_status(e))
            }
        }
    }

    async fn drop_copy(
        &self,
        request: Request<pb::DropCopyRequest>,
    ) -> Result<Response<pb::DropCopyReply>, Status> {
        let existed = self
            .0
            .drop_asked(request.into_inner().id)
            .await
            .map_err(|e: ReplicationError| api_status(e.into()))?;
        Ok(Response::new(pb::DropCopyReply { existed }))
    }

    async fn put_blob(
        &self,
        request: Request<pb::BlobCopy>,
    ) -> Result<Response<pb::PutBlobReply>, Status> {
        self.0
            .receive_blob(request.into_inner())
            .await
            .map_err(copy_status)?;
        Ok(Response::new(pb::PutBlobReply {}))
    }

    async fn read_blob(
        &self,
        request: Request<pb::ReadBlobRequest>,
    ) -> Result<Response<pb::BlobCopy>, Status> {
        let req = request.into_inner();
        let copy = self
            .0
            .read_local_blob(&req.name, &req.sha256)
            .await
            .map_err(copy_status)?;
        Ok(Response::new(copy))
    }

    async fn drop_blob(
        &self,
        request: Request<pb::DropBlobRequest>,
    ) -> Result<Response<pb::DropBlobReply>, Status> {
        let existed = self
            .0
            .drop_local_blob(&request.into_inner().name)
            .await
            .map_err(|e| api_status(e.into()))?;
        Ok(Response::new(pb::DropBlobReply { existed }))
    }
}
