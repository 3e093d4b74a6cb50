//! The `Similar` calls a front door makes to the cluster's nodes: one lazily connected channel
//! per node URL, each call carrying the cluster secret and the caller's deadline.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ndpipe_proto::pb;
use ndpipe_proto::pb::similar_client::SimilarClient;
use ndpipe_proto::transport::{self, ClusterSecret, Tls};
use ndpipe_util::sync::lock;
use tonic::transport::Channel;

/// The channels to the cluster's nodes and how to call them.
pub(super) struct SimilarPeers {
    channels: Mutex<HashMap<String, Channel>>,
    secret: Option<ClusterSecret>,
    tls: Option<Tls>,
    max_message: usize,
}

impl SimilarPeers {
    /// Peers called with `secret` over `tls`, messages (query photos) up to `max_message`.
    pub(super) fn new(secret: Option<ClusterSecret>, tls: Option<Tls>, max_message: usize) -> Self {
        SimilarPeers {
            channels: Mutex::default(),
            secret,
            tls,
            max_message,
        }
    }

    fn client(&self, url: &str) -> Result<SimilarClient<Channel>, tonic::Status> {
        let known = lock(&self.channels).get(url).cloned();
        let channel = match known {
            Some(c) => c,
            None => {
                let c = transport::channel(url, self.tls.as_ref())
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                lock(&self.channels).insert(url.into(), c.clone());
                c
            }
        };
        Ok(SimilarClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }

    fn request<T>(&self, message: T, deadline: Duration) -> tonic::Request<T> {
        transport::request(message, Some(deadline), self.secret.as_ref())
    }

    /// The node at `url`'s hits for `req`, within `deadline`.
    pub(super) async fn search(
        &self,
        url: &str,
        req: pb::SimilarSearchRequest,
        deadline: Duration,
    ) -> Result<pb::SimilarSearchReply, tonic::Status> {
        let mut client = self.client(url)?;
        transport::unary(deadline, client.search(self.request(req, deadline))).await
    }

    /// The node at `url`'s stored features of photo `id`, within `deadline`.
    pub(super) async fn features(
        &self,
        url: &str,
        id: u64,
        deadline: Duration,
    ) -> Result<pb::SimilarFeatures, tonic::Status> {
        let mut client = self.client(url)?;
        let req = pb::SimilarFeaturesRequest { id };
        transport::unary(deadline, client.features(self.request(req, deadline))).await
    }

    /// The features the node at `url` computes for the query photo `photo`, within `deadline`.
    pub(super) async fn embed(
        &self,
        url: &str,
        photo: Vec<u8>,
        deadline: Duration,
    ) -> Result<pb::SimilarFeatures, tonic::Status> {
        let mut client = self.client(url)?;
        let req = pb::SimilarEmbedRequest { photo };
        transport::unary(deadline, client.embed(self.request(req, deadline))).await
    }
}

/// The client errors a node passes on to the front door's client as they are.
const CLIENT_KINDS: &[&str] = &[
    "not_found",
    "not_labelled",
    "bad_query",
    "other_backbone",
    "empty_body",
    "unsupported_format",
    "too_many_pixels",
    "truncated_image",
    "invalid_image",
];

/// A client error as a node's gRPC status says it (`HTTP-STATUS KIND MESSAGE`, as the
/// `Similar` service writes it); `None` for any other status.
pub(crate) fn client_error(status: &tonic::Status) -> Option<super::SimilarError> {
    let mut parts = status.message().splitn(3, ' ');
    let (code, kind, message) = (parts.next()?, parts.next()?, parts.next()?);
    let code: u16 = code.parse().ok().filter(|c| (400..500).contains(c))?;
    let kind = CLIENT_KINDS.iter().find(|k| **k == kind)?;
    Some(super::SimilarError::Remote {
        status: code,
        kind,
        message: message.to_string(),
    })
}
