//! The PipeStores known to the Tuner: registration (the Tuner's gRPC service) and clients.

use std::sync::Mutex;

use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::pb::tuner_server::Tuner as TunerRpc;
use ndpipe_proto::pb::{RegisterReply, RegisterRequest};
use serde::Serialize;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::info;

/// One registered PipeStore.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// Unique id given at first registration.
    pub id: u32,
    /// The name it registered with.
    pub name: String,
    /// Where its PipeStore service is.
    pub url: String,
    #[serde(skip)]
    client: Option<PipeStoreClient<Channel>>,
}

impl Node {
    /// "name (node id)", for messages.
    pub fn label(&self) -> String {
        format!("{} (node {})", self.name, self.id)
    }

    /// A client for its PipeStore service.
    pub fn client(&self) -> Result<PipeStoreClient<Channel>, Status> {
        self.client
            .clone()
            .ok_or_else(|| Status::unavailable(format!("no connection to {}", self.label())))
    }
}

/// The registry of nodes.
#[derive(Default)]
pub struct Nodes {
    nodes: Mutex<Vec<Node>>,
}

impl Nodes {
    /// Registers (or re-registers) a node; the same name keeps its id.
    pub fn register(&self, name: &str, url: &str) -> Result<u32, Status> {
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| Status::invalid_argument(format!("bad node url {url:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(5));
        let client = PipeStoreClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let id = match nodes.iter_mut().find(|n| n.name == name) {
            Some(n) => {
                n.url = url.to_string();
                n.client = Some(client);
                n.id
            }
            None => {
                let id = nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
                nodes.push(Node {
                    id,
                    name: name.to_string(),
                    url: url.to_string(),
                    client: Some(client),
                });
                id
            }
        };
        info!(node = id, name, url, "PipeStore registered");
        Ok(id)
    }

    /// The nodes now, in id order.
    pub fn snapshot(&self) -> Vec<Node> {
        let mut v = self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_by_key(|n| n.id);
        v
    }
}

/// The Tuner's gRPC service.
pub struct TunerService(pub std::sync::Arc<Nodes>);

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
        if req.name.trim().is_empty() {
            return Err(Status::invalid_argument("a node needs a name"));
        }
        let node_id = self.0.register(&req.name, &req.grpc_url)?;
        Ok(Response::new(RegisterReply {
            node_id,
            protocol_version: PROTOCOL_VERSION,
        }))
    }
}
