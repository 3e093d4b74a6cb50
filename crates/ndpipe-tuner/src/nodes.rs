//! The PipeStores known to the Tuner: a persistent [`NodeRegistry`] with leases (the Tuner's
//! `registry.sqlite`), their gRPC clients, and which of them a job may use.
//!
//! A node registers, then renews its lease with heartbeats. A job uses the *eligible* nodes:
//! active (not draining), with a live lease, and serving the active version (a node on another
//! version is brought to it first, by `sync`). The others are reported, not waited for.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndpipe_catalog::{CatalogError, NodeRecord, NodeRegistry, NodeState};
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::transport::{self, ClusterSecret, Tls};
use ndpipe_proto::{ByteCounter, CountedChannel, Serving};
use ndpipe_util::sync::lock;
use ndpipe_util::time::now_ms;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status, Streaming};
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
    /// Whether it takes new work.
    pub state: NodeState,
    /// Its lease runs until then (ms since the Unix epoch).
    pub lease_expires_ms: i64,
    /// Whether the lease is live now.
    pub live: bool,
    /// The model version it serves, as last reported or committed.
    pub version: Option<String>,
    /// Whether it serves the active version (or no version is active yet).
    pub in_sync: bool,
    /// Why bringing it to the active version failed last, if it did.
    pub sync_error: Option<String>,
    /// First registration, ms since the Unix epoch.
    pub registered_ms: i64,
    /// Last registration or heartbeat, ms since the Unix epoch.
    pub last_seen_ms: i64,
}

/// A client of a PipeStore, its bytes counted at the transport.
pub(crate) type NodeClient = PipeStoreClient<CountedChannel>;

/// A registered PipeStore with its client, as a job uses it.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) url: String,
    client: NodeClient,
    /// The deadline of its unary calls and the longest silence of its streams.
    timeout: Duration,
    /// Sent with every call, when the cluster has one.
    secret: Option<ClusterSecret>,
}

impl Node {
    /// "name (node id)", for messages and reports.
    pub(crate) fn label(&self) -> String {
        format!("{} (node {})", self.name, self.id)
    }

    /// The longest a job waits on this node.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs a unary call with the node's deadline (sent to the node too).
    pub(crate) async fn unary<Req, T, Fut>(
        &self,
        message: Req,
        call: impl FnOnce(NodeClient, Request<Req>) -> Fut,
    ) -> Result<T, Status>
    where
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let request = transport::request(message, Some(self.timeout), self.secret.as_ref());
        transport::unary(self.timeout, call(self.client.clone(), request)).await
    }

    /// Opens a server stream, within the node's deadline.
    pub(crate) async fn open<Req, T, Fut>(
        &self,
        message: Req,
        call: impl FnOnce(NodeClient, Request<Req>) -> Fut,
    ) -> Result<Streaming<T>, Status>
    where
        Fut: Future<Output = Result<Response<Streaming<T>>, Status>>,
    {
        let request = transport::request(message, None, self.secret.as_ref());
        transport::unary(self.timeout, call(self.client.clone(), request)).await
    }

    /// The next message of one of its streams; a silence longer than its timeout fails.
    pub(crate) async fn next<T>(&self, stream: &mut Streaming<T>) -> Result<Option<T>, Status> {
        transport::next(stream, self.timeout).await
    }
}

#[cfg(test)]
impl Node {
    /// A node for unit tests, registered nowhere (needs a Tokio runtime).
    pub(crate) fn for_test(name: &str, url: &str) -> Node {
        Node {
            id: 1,
            name: name.to_string(),
            url: url.to_string(),
            client: client(url, None, &Arc::default()).unwrap(),
            timeout: Duration::from_secs(1),
            secret: None,
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

/// The nodes a job may use, and the registered ones it leaves out (with the reason).
#[derive(Clone)]
pub(crate) struct Members {
    pub(crate) nodes: Vec<Node>,
    pub(crate) skipped: Vec<String>,
}

/// The registry of nodes and their clients.
pub(crate) struct Nodes {
    registry: Arc<dyn NodeRegistry>,
    lease: Duration,
    timeout: Duration,
    secret: Option<ClusterSecret>,
    tls: Option<Tls>,
    /// The bytes of every node's channel together: what the Tuner sends and receives.
    traffic: Arc<ByteCounter>,
    /// Clients by node id, with the url they were made for.
    clients: Mutex<HashMap<u32, (String, NodeClient)>>,
    /// Why bringing a node to the active version failed last, by node id.
    sync_errors: Mutex<HashMap<u32, String>>,
    /// The copies of each photo every node said it keeps, by node id.
    copies: Mutex<HashMap<u32, u32>>,
}

impl Nodes {
    /// The nodes of `registry`; leases last `lease`, jobs wait at most `timeout` on a node, and
    /// every call carries `secret` (when there is one) and goes over `tls` (when given).
    pub(crate) fn new(
        registry: Arc<dyn NodeRegistry>,
        lease: Duration,
        timeout: Duration,
        secret: Option<ClusterSecret>,
        tls: Option<Tls>,
    ) -> Self {
        Nodes {
            registry,
            lease,
            timeout,
            secret,
            tls,
            traffic: Arc::default(),
            clients: Mutex::new(HashMap::new()),
            sync_errors: Mutex::new(HashMap::new()),
            copies: Mutex::new(HashMap::new()),
        }
    }

    /// Records that node `id` keeps `replicas` copies of each photo (its register and
    /// heartbeat say so).
    pub(crate) fn report_copies(&self, id: u32, replicas: u32) {
        lock(&self.copies).insert(id, replicas);
    }

    /// The most copies of each photo a registered node said it keeps (0 before any said).
    pub(crate) fn wanted_copies(&self) -> u32 {
        lock(&self.copies).values().copied().max().unwrap_or(0)
    }

    /// The bytes sent and received over every node's channel, counted at the transport.
    pub(crate) fn traffic(&self) -> &ByteCounter {
        &self.traffic
    }

    /// How often a node should heartbeat: three times per lease.
    pub(crate) fn heartbeat(&self) -> Duration {
        self.lease / 3
    }

    fn lease_until(&self, now: i64) -> i64 {
        now.saturating_add(i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX))
    }

    /// Registers (or re-registers) a node serving `version`; the same name keeps its id. The
    /// connection is made lazily, so this needs a Tokio runtime but not a reachable node.
    pub(crate) fn register(
        &self,
        name: &str,
        url: &str,
        version: Option<&str>,
    ) -> Result<NodeRecord, TunerError> {
        if name.trim().is_empty() {
            return Err(TunerError::InvalidArgument("a node needs a name".into()));
        }
        let client = client(url, self.tls.as_ref(), &self.traffic)?;
        let now = now_ms();
        let record = self
            .registry
            .register_node(name, url, version, self.lease_until(now), now)?;
        lock(&self.clients).insert(record.id, (url.to_string(), client));
        info!(node = record.id, name, url, version, "PipeStore registered");
        Ok(record)
    }

    /// Renews the lease of node `id` (registered as `name`), which serves `version`. Fails with
    /// [`TunerError::UnknownNode`] when the node is not registered.
    pub(crate) fn renew(
        &self,
        id: u32,
        name: &str,
        version: Option<&str>,
    ) -> Result<NodeRecord, TunerError> {
        let now = now_ms();
        self.registry
            .renew_node_lease(id, name, version, self.lease_until(now), now)
            .map_err(|e| match e {
                CatalogError::NotFound { .. } => TunerError::UnknownNode(name.to_string()),
                other => other.into(),
            })
    }

    /// Records that node `id` serves `version` now (the Tuner committed it there).
    pub(crate) fn set_version(&self, id: u32, version: &str) -> Result<(), TunerError> {
        lock(&self.sync_errors).remove(&id);
        Ok(self.registry.set_node_version(id, version)?)
    }

    /// Records why bringing node `id` to the active version failed.
    pub(crate) fn set_sync_error(&self, id: u32, error: String) {
        lock(&self.sync_errors).insert(id, error);
    }

    /// Sets whether node `name` takes new work.
    pub(crate) fn set_state(&self, name: &str, state: NodeState) -> Result<NodeView, TunerError> {
        let record = self
            .registry
            .set_node_state(name, state)
            .map_err(|e| match e {
                CatalogError::NotFound { .. } => TunerError::UnknownNode(name.to_string()),
                other => other.into(),
            })?;
        info!(name, %state, "node state changed");
        Ok(self.view(&record, None, now_ms()))
    }

    /// Forgets node `name`: it must register again to come back, under a new id.
    pub(crate) fn remove(&self, name: &str) -> Result<(), TunerError> {
        let id = self
            .registry
            .nodes()?
            .into_iter()
            .find(|n| n.name == name)
            .map(|n| n.id);
        if !self.registry.remove_node(name)? {
            return Err(TunerError::UnknownNode(name.to_string()));
        }
        if let Some(id) = id {
            lock(&self.clients).remove(&id);
            lock(&self.sync_errors).remove(&id);
            lock(&self.copies).remove(&id);
        }
        info!(name, "node removed");
        Ok(())
    }

    /// Every registered node, in id order, against the active version `active`.
    pub(crate) fn views(&self, active: Option<&str>) -> Result<Vec<NodeView>, TunerError> {
        let now = now_ms();
        Ok(self
            .registry
            .nodes()?
            .iter()
            .map(|r| self.view(r, active, now))
            .collect())
    }

    fn view(&self, r: &NodeRecord, active: Option<&str>, now: i64) -> NodeView {
        NodeView {
            id: r.id,
            name: r.name.clone(),
            url: r.url.clone(),
            state: r.state,
            lease_expires_ms: r.lease_expires_ms,
            live: r.lease_expires_ms > now,
            version: r.version.clone(),
            in_sync: in_sync(r, active),
            sync_error: lock(&self.sync_errors).get(&r.id).cloned(),
            registered_ms: r.registered_ms,
            last_seen_ms: r.last_seen_ms,
        }
    }

    /// The nodes a job may use, against the active version `active`: active, with a live lease
    /// and in sync; the rest are reported in [`Members::skipped`].
    pub(crate) fn members(&self, active: Option<&str>) -> Result<Members, TunerError> {
        let now = now_ms();
        let mut members = Members {
            nodes: Vec::new(),
            skipped: Vec::new(),
        };
        for r in self.registry.nodes()? {
            let label = format!("{} (node {})", r.name, r.id);
            let reason = if r.state == NodeState::Draining {
                Some("draining".to_string())
            } else if r.lease_expires_ms <= now {
                Some(format!(
                    "its lease ran out {:.1} s ago",
                    (now - r.lease_expires_ms) as f64 / 1000.0
                ))
            } else if !in_sync(&r, active) {
                Some(format!(
                    "serves {}, not the active {}; it is being brought to them",
                    r.version.as_deref().unwrap_or("an unknown version"),
                    active.unwrap_or_default()
                ))
            } else {
                None
            };
            match reason {
                Some(reason) => members.skipped.push(format!("{label}: {reason}")),
                None => members.nodes.push(self.node(&r)?),
            }
        }
        Ok(members)
    }

    /// The nodes with a live lease that do not serve `active`, in any state.
    pub(crate) fn lagging(&self, active: &str) -> Result<Vec<Node>, TunerError> {
        let now = now_ms();
        self.registry
            .nodes()?
            .iter()
            .filter(|r| r.lease_expires_ms > now && !in_sync(r, Some(active)))
            .map(|r| self.node(r))
            .collect()
    }

    /// The registered node named `name` with a live lease, if there is one (for a job that waits
    /// for a node to come back).
    pub(crate) fn named(&self, name: &str) -> Result<Option<Node>, TunerError> {
        let now = now_ms();
        self.registry
            .nodes()?
            .iter()
            .find(|r| r.name == name && r.lease_expires_ms > now)
            .map(|r| self.node(r))
            .transpose()
    }

    /// A job's handle on a registered node, reusing the client made for its url.
    fn node(&self, r: &NodeRecord) -> Result<Node, TunerError> {
        let mut clients = lock(&self.clients);
        let client = match clients.get(&r.id) {
            Some((url, client)) if *url == r.url => client.clone(),
            _ => {
                let made = client(&r.url, self.tls.as_ref(), &self.traffic)?;
                clients.insert(r.id, (r.url.clone(), made.clone()));
                made
            }
        };
        Ok(Node {
            id: r.id,
            name: r.name.clone(),
            url: r.url.clone(),
            client,
            timeout: self.timeout,
            secret: self.secret.clone(),
        })
    }
}

/// Whether `r` serves what the Tuner means every node to serve, `intent` (protocol form; always,
/// while no version is active): the same version of every task the intent names. A task the
/// intent does not name (the general task of a Tuner that has not recorded it yet) does not
/// count.
pub(crate) fn in_sync(r: &NodeRecord, intent: Option<&str>) -> bool {
    let Some(intent) = intent.filter(|i| !i.is_empty()) else {
        return true;
    };
    let Ok(intent) = intent.parse::<Serving>() else {
        return false;
    };
    let Some(Ok(serving)) = r.version.as_deref().map(str::parse::<Serving>) else {
        return false;
    };
    intent
        .iter()
        .all(|(task, version)| serving.version(task) == Some(version))
}

/// A lazily connecting client for the PipeStore at `url`, with keepalive (over `tls`), its
/// bytes counted into `traffic`.
fn client(
    url: &str,
    tls: Option<&Tls>,
    traffic: &Arc<ByteCounter>,
) -> Result<NodeClient, TunerError> {
    let channel =
        transport::channel(url, tls).map_err(|e| TunerError::InvalidArgument(e.to_string()))?;
    Ok(
        PipeStoreClient::new(CountedChannel::new(channel, traffic.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::SqliteCatalog;

    use super::*;

    fn nodes(lease: Duration) -> Nodes {
        let registry = Arc::new(SqliteCatalog::in_memory().unwrap());
        Nodes::new(registry, lease, Duration::from_secs(1), None, None)
    }

    #[tokio::test]
    async fn a_name_keeps_its_id_and_jobs_use_only_eligible_nodes() {
        let nodes = nodes(Duration::from_secs(60));
        let a = nodes.register("ps-a", "http://127.0.0.1:1", None).unwrap();
        let b = nodes
            .register("ps-b", "http://127.0.0.1:2", Some("default=v1"))
            .unwrap();
        assert_eq!(
            nodes
                .register("ps-a", "http://127.0.0.1:3", Some("default=v1"))
                .unwrap()
                .id,
            a.id
        );
        let views = nodes.views(Some("default=v1")).unwrap();
        assert_eq!(views[0].url, "http://127.0.0.1:3");
        assert!(
            views
                .iter()
                .all(|v| v.live && v.in_sync && v.state == NodeState::Active)
        );
        assert_eq!(nodes.members(Some("default=v1")).unwrap().nodes.len(), 2);

        nodes.set_state("ps-b", NodeState::Draining).unwrap();
        let members = nodes.members(Some("default=v1")).unwrap();
        assert_eq!(members.nodes.len(), 1);
        assert!(members.skipped[0].contains("ps-b") && members.skipped[0].contains("draining"));
        let members = nodes.members(Some("default=v2")).unwrap();
        assert!(members.nodes.is_empty(), "nobody serves v2");
        assert!(
            members.skipped[0].contains("brought"),
            "{:?}",
            members.skipped
        );
        assert_eq!(
            nodes.lagging("default=v2").unwrap().len(),
            2,
            "draining nodes are synced too"
        );
        nodes.set_version(a.id, "default=v2,general=g1").unwrap();
        assert_eq!(
            nodes.members(Some("default=v2")).unwrap().nodes.len(),
            1,
            "a task the intent does not name does not count"
        );
        assert!(
            nodes
                .members(Some("default=v2,general=g2"))
                .unwrap()
                .nodes
                .is_empty()
        );

        nodes.remove("ps-b").unwrap();
        assert!(matches!(
            nodes.remove("ps-b"),
            Err(TunerError::UnknownNode(_))
        ));
        assert!(matches!(
            nodes.renew(b.id, "ps-b", None),
            Err(TunerError::UnknownNode(_))
        ));
        assert!(nodes.renew(a.id, "ps-a", Some("default=v2")).is_ok());
        assert!(matches!(
            nodes.register(" ", "http://127.0.0.1:4", None),
            Err(TunerError::InvalidArgument(_))
        ));
        assert!(matches!(
            nodes.register("ps-c", "not a url", None),
            Err(TunerError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn a_node_whose_lease_ran_out_is_reported_not_used() {
        let nodes = nodes(Duration::from_millis(1));
        nodes.register("ps-a", "http://127.0.0.1:1", None).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let members = nodes.members(None).unwrap();
        assert!(members.nodes.is_empty());
        assert!(
            members.skipped[0].contains("lease ran out"),
            "{:?}",
            members.skipped
        );
        assert!(!nodes.views(None).unwrap()[0].live);
    }
}
