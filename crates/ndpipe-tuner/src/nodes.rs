//! The PipeStores known to the Tuner and their gRPC clients.

use std::sync::Mutex;
use std::time::Duration;

use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_util::sync::lock;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;
use tracing::info;

use crate::TunerError;

/// Largest gRPC message to or from a PipeStore: a chunk of 256 features is about 0.7 MB, a
/// 1000-class head about 5 MB.
const MAX_MESSAGE: usize = 64 << 20;

/// A registered PipeStore, as `GET /v1/tuner/nodes` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// Unique id given at first registration.
    pub id: u32,
    /// The name it registered with.
    pub name: String,
    /// Where its PipeStore service is.
    pub url: String,
}

/// One registered PipeStore with its client.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) url: String,
    client: PipeStoreClient<Channel>,
}

impl Node {
    /// "name (node id)", for messages and reports.
    pub(crate) fn label(&self) -> String {
        format!("{} (node {})", self.name, self.id)
    }

    /// A client for its PipeStore service (clients are cheap clones of one channel).
    pub(crate) fn client(&self) -> PipeStoreClient<Channel> {
        self.client.clone()
    }

    pub(crate) fn view(&self) -> NodeView {
        NodeView {
            id: self.id,
            name: self.name.clone(),
            url: self.url.clone(),
        }
    }
}

/// A failure of `node` during a job.
pub(crate) fn node_error(node: &Node, message: impl Into<String>) -> TunerError {
    TunerError::Node {
        node: node.label(),
        message: message.into(),
    }
}

/// The registry of nodes.
#[derive(Debug, Default)]
pub(crate) struct Nodes {
    nodes: Mutex<Vec<Node>>,
}

impl Nodes {
    /// Registers (or re-registers) a node; the same name keeps its id. The connection is made
    /// lazily, so this needs a Tokio runtime but not a reachable node.
    pub(crate) fn register(&self, name: &str, url: &str) -> Result<u32, TunerError> {
        if name.trim().is_empty() {
            return Err(TunerError::InvalidArgument("a node needs a name".into()));
        }
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| TunerError::InvalidArgument(format!("bad node url {url:?}: {e}")))?
            .connect_timeout(Duration::from_secs(5));
        let client = PipeStoreClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let mut nodes = lock(&self.nodes);
        let id = match nodes.iter_mut().find(|n| n.name == name) {
            Some(n) => {
                n.url = url.to_string();
                n.client = client;
                n.id
            }
            None => {
                let id = nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
                nodes.push(Node {
                    id,
                    name: name.to_string(),
                    url: url.to_string(),
                    client,
                });
                id
            }
        };
        info!(node = id, name, url, "PipeStore registered");
        Ok(id)
    }

    /// The nodes now, in id order.
    pub(crate) fn snapshot(&self) -> Vec<Node> {
        let mut v = lock(&self.nodes).clone();
        v.sort_by_key(|n| n.id);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_keeps_its_id_across_registrations() {
        let nodes = Nodes::default();
        let a = nodes.register("ps-a", "http://127.0.0.1:1").unwrap();
        let b = nodes.register("ps-b", "http://127.0.0.1:2").unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(nodes.register("ps-a", "http://127.0.0.1:3").unwrap(), 1);
        let views: Vec<NodeView> = nodes.snapshot().iter().map(Node::view).collect();
        assert_eq!(views[0].url, "http://127.0.0.1:3");
        assert_eq!(
            serde_json::to_value(&views[1]).unwrap(),
            serde_json::json!({"id": 2, "name": "ps-b", "url": "http://127.0.0.1:2"})
        );
        assert!(matches!(
            nodes.register(" ", "http://127.0.0.1:4"),
            Err(TunerError::InvalidArgument(_))
        ));
        assert!(matches!(
            nodes.register("ps-c", "not a url"),
            Err(TunerError::InvalidArgument(_))
        ));
    }
}
