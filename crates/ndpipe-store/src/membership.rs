//! Membership in a Tuner's cluster: register, then renew the lease with a heartbeat at the
//! interval the Tuner asks for; register again when the Tuner no longer knows the node (it was
//! removed, or lost its registry); keep trying, every second, while the Tuner is unreachable
//! (down, restarting), so a restarted Tuner needs no PipeStore restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::tuner_client::TunerClient;
use ndpipe_proto::pb::{HeartbeatRequest, RegisterRequest};
use ndpipe_proto::transport::{self, ClusterSecret, Tls};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::{info, warn};

use crate::node::PipeStoreNode;

/// Wait between attempts while the Tuner cannot be reached or refuses.
const RETRY: Duration = Duration::from_secs(1);
/// Deadline of each registration or heartbeat.
const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// Heartbeat interval when the Tuner names none.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// Who this node is, for the Tuner.
pub(crate) struct Member {
    /// The Tuner's gRPC URL.
    pub(crate) tuner: String,
    /// The name it registers with.
    pub(crate) name: String,
    /// Where the Tuner reaches this node's gRPC service.
    pub(crate) url: String,
    pub(crate) node: Arc<PipeStoreNode>,
    /// Sent with every call, when the cluster has one.
    pub(crate) secret: Option<ClusterSecret>,
    /// Mutual TLS to the Tuner, when configured.
    pub(crate) tls: Option<Tls>,
    /// Where the membership's state is told, for `/readyz`.
    pub(crate) readiness: Arc<Readiness>,
    /// Copies of each photo this node keeps, told to the Tuner.
    pub(crate) replicas: u32,
}

/// Whether the node is in its cluster, for `/readyz`: it is when it joins no Tuner, or when its
/// last registration or heartbeat was answered.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    joining: AtomicBool,
    answered: AtomicBool,
}

impl Readiness {
    /// Whether the node is where it should be: in its Tuner's cluster, or not joining one.
    pub(crate) fn in_cluster(&self) -> bool {
        !self.joining.load(Ordering::Relaxed) || self.answered.load(Ordering::Relaxed)
    }

    /// The node starts joining a Tuner: not in its cluster until the Tuner answers.
    pub(crate) fn start_joining(&self) {
        self.answered.store(false, Ordering::Relaxed);
        self.joining.store(true, Ordering::Relaxed);
    }

    fn answered(&self, answered: bool) {
        self.answered.store(answered, Ordering::Relaxed);
    }
}

/// Keeps `member` registered until `stopped` turns true (or its sender is gone).
pub(crate) async fn run(member: Member, mut stopped: watch::Receiver<bool>) {
    let client = match transport::channel(&member.tuner, member.tls.as_ref()) {
        Ok(channel) => TunerClient::new(channel),
        Err(e) => {
            warn!(error = %e, "cannot register with the Tuner");
            return;
        }
    };
    let mut session = Session {
        member,
        client,
        id: None,
        failures: 0,
        told: String::new(),
    };
    loop {
        let wait = tokio::select! {
            wait = session.beat() => wait,
            _ = stopped.wait_for(|s| *s) => return,
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

/// The state of one node's membership.
struct Session {
    member: Member,
    client: TunerClient<Channel>,
    /// The node id, once registered.
    id: Option<u32>,
    /// Failed attempts in a row, to keep the log short.
    failures: u32,
    /// The active version the Tuner last named, to log a change once.
    told: String,
}

impl Session {
    /// Registers or renews the lease once; returns how long to wait before the next beat.
    /// Each beat also picks up the tasks' floors an operator changed through another node.
    async fn beat(&mut self) -> Duration {
        let node = self.member.node.clone();
        match tokio::task::spawn_blocking(move || node.refresh_floors()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot read the tasks' floors"),
            Err(e) => warn!(error = %e, "reading the tasks' floors"),
        }
        let version = self.member.node.active_version();
        let result = match self.id {
            None => self.register(&version).await,
            Some(id) => self.heartbeat(id, &version).await,
        };
        self.member.readiness.answered(result.is_ok());
        match result {
            Ok((active, heartbeat_ms)) => {
                self.failures = 0;
                if !active.is_empty() && active != version && active != self.told {
                    info!(serves = %version, active = %active, "the Tuner brings this node to its active version");
                }
                self.told = active;
                match heartbeat_ms {
                    0 => DEFAULT_HEARTBEAT,
                    ms => Duration::from_millis(u64::from(ms)),
                }
            }
            Err(e) if e.code() == Code::NotFound && self.id.is_some() => {
                warn!(name = %self.member.name, "the Tuner does not know this node (removed?): registering again");
                self.id = None;
                Duration::ZERO
            }
            Err(e) => {
                if self.failures.is_multiple_of(10) {
                    warn!(error = %e.message(), tuner = %self.member.tuner, registered = self.id.is_some(), "cannot reach the Tuner; retrying");
                }
                self.failures += 1;
                RETRY
            }
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        transport::request(message, Some(CALL_DEADLINE), self.member.secret.as_ref())
    }

    async fn register(&mut self, version: &str) -> Result<(String, u32), Status> {
        let request = RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            grpc_url: self.member.url.clone(),
            name: self.member.name.clone(),
            active_version: version.to_string(),
            replicas: self.member.replicas,
        };
        let call = self.client.register(self.request(request));
        let reply = transport::unary(CALL_DEADLINE, call).await?;
        self.id = Some(reply.node_id);
        self.member.node.set_node_id(reply.node_id);
        info!(node = reply.node_id, name = %self.member.name, tuner = %self.member.tuner, "registered with the Tuner");
        Ok((reply.active_version, reply.heartbeat_ms))
    }

    async fn heartbeat(&mut self, id: u32, version: &str) -> Result<(String, u32), Status> {
        let request = HeartbeatRequest {
            node_id: id,
            name: self.member.name.clone(),
            active_version: version.to_string(),
            replicas: self.member.replicas,
        };
        let call = self.client.heartbeat(self.request(request));
        let reply = transport::unary(CALL_DEADLINE, call).await?;
        Ok((reply.active_version, reply.heartbeat_ms))
    }
}
