//! The Tuner's gRPC service: PipeStores register with it (the `Tuner` service of
//! `ndpipe.proto`).

use std::sync::Arc;

use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::tuner_server::{Tuner as TunerRpc, TunerServer};
use ndpipe_proto::pb::{RegisterReply, RegisterRequest};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::TunerError;
use crate::nodes::Nodes;

/// The service's routes over the node registry.
pub(crate) fn routes(nodes: Arc<Nodes>) -> Routes {
    Routes::new(TunerServer::new(TunerService(nodes)))
}

struct TunerService(Arc<Nodes>);

#[tonic::async_trait]
impl TunerRpc for TunerService {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterReply>, Status> {
        let req = request.into_inner();
        if req.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported (this Tuner speaks {PROTOCOL_VERSION})",
                req.protocol_version
            )));
        }
        let node_id = self
            .0
            .register(&req.name, &req.grpc_url)
            .map_err(|e| match e {
                TunerError::InvalidArgument(message) => Status::invalid_argument(message),
                other => Status::internal(other.to_string()),
            })?;
        Ok(Response::new(RegisterReply {
            node_id,
            protocol_version: PROTOCOL_VERSION,
        }))
    }
}
