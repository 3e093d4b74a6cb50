//! The Tuner's gRPC service: PipeStores register with it and renew their lease with heartbeats
//! (the `Tuner` service of `ndpipe.proto`). Both replies carry the version every node should
//! serve and the heartbeat interval; a node that reports another version wakes the syncer. With
//! a cluster secret, a call without it is refused (`UNAUTHENTICATED`) before it changes
//! anything: nobody registers under a node's name without the secret.

use std::sync::Arc;

use ndpipe_catalog::NodeRecord;
use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::tuner_server::{Tuner as TunerRpc, TunerServer};
use ndpipe_proto::pb::{HeartbeatReply, HeartbeatRequest, RegisterReply, RegisterRequest};
use ndpipe_proto::transport::Guard;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::TunerError;
use crate::control::Core;

/// The service's routes over the Tuner's state, behind the cluster secret's guard.
pub(crate) fn routes(core: Arc<Core>) -> Routes {
    let guard = Guard(core.secret.clone());
    Routes::new(InterceptedService::new(
        TunerServer::new(TunerService(core)),
        guard,
    ))
}

struct TunerService(Arc<Core>);

impl TunerService {
    /// The versions every node must serve and the heartbeat interval for a node's reply;
    /// wakes the syncer when the node serves others.
    fn answer(&self, record: &NodeRecord) -> Result<(String, u32), Status> {
        let active = self.0.registry.intent().map_err(status)?.to_string();
        if !crate::nodes::in_sync(record, Some(&active)) {
            self.0.wake_sync();
        }
        let heartbeat = u32::try_from(self.0.nodes.heartbeat().as_millis()).unwrap_or(u32::MAX);
        Ok((active, heartbeat))
    }
}

fn status(e: TunerError) -> Status {
    match e {
        TunerError::InvalidArgument(message) => Status::invalid_argument(message),
        TunerError::UnknownNode(_) => Status::not_found(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

/// The version a node reports, `None` when it names none.
fn reported(version: &str) -> Option<&str> {
    Some(version).filter(|v| !v.is_empty())
}

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
        let record = self
            .0
            .nodes
            .register(&req.name, &req.grpc_url, reported(&req.active_version))
            .map_err(status)?;
        self.0.nodes.report_copies(record.id, req.replicas);
        let (active_version, heartbeat_ms) = self.answer(&record)?;
        Ok(Response::new(RegisterReply {
            node_id: record.id,
            protocol_version: PROTOCOL_VERSION,
            active_version,
            heartbeat_ms,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let req = request.into_inner();
        let record = self
            .0
            .nodes
            .renew(req.node_id, &req.name, reported(&req.active_version))
            .map_err(status)?;
        self.0.nodes.report_copies(record.id, req.replicas);
        let (active_version, heartbeat_ms) = self.answer(&record)?;
        Ok(Response::new(HeartbeatReply {
            active_version,
            heartbeat_ms,
        }))
    }
}
