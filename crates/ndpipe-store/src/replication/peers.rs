//! Calls to the other PipeStores of the cluster: one lazily connected channel per node URL,
//! each call with a deadline and the cluster secret.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ndpipe_proto::pb;
use ndpipe_proto::pb::replication_client::ReplicationClient;
use ndpipe_proto::transport::{self, ClusterSecret, Tls};
use ndpipe_util::sync::lock;
use tonic::transport::Channel;

use super::ReplicationError;

/// The channels to the cluster's nodes and how to call them.
pub(crate) struct Peers {
    channels: Mutex<HashMap<String, Channel>>,
    secret: Option<ClusterSecret>,
    tls: Option<Tls>,
    deadline: Duration,
    /// The deadline of a copy and of a check that a node is alive (shorter than `deadline`).
    copy_deadline: Duration,
    max_message: usize,
}

impl Peers {
    /// Peers called with `secret` over `tls`, each call within `deadline` (a copy within
    /// `copy_deadline`), messages up to `max_message` bytes.
    pub(crate) fn new(
        (secret, tls): (Option<ClusterSecret>, Option<Tls>),
        deadline: Duration,
        copy_deadline: Duration,
        max_message: usize,
    ) -> Self {
        Peers {
            channels: Mutex::default(),
            secret,
            tls,
            deadline,
            copy_deadline,
            max_message,
        }
    }

    fn client(&self, url: &str) -> Result<ReplicationClient<Channel>, ReplicationError> {
        let known = lock(&self.channels).get(url).cloned();
        let channel = match known {
            Some(c) => c,
            None => {
                let c = transport::channel(url, self.tls.as_ref()).map_err(|e| {
                    ReplicationError::Peer {
                        url: url.into(),
                        reason: e.to_string(),
                    }
                })?;
                lock(&self.channels).insert(url.into(), c.clone());
                c
            }
        };
        Ok(ReplicationClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        transport::request(message, Some(self.deadline), self.secret.as_ref())
    }

    fn copy_request<T>(&self, message: T) -> tonic::Request<T> {
        transport::request(message, Some(self.copy_deadline), self.secret.as_ref())
    }

    /// Whether the node at `url` answers within the copy deadline: a lookup of photo 0, which
    /// no node holds (`NOT_FOUND` is an answer).
    pub(crate) async fn probe(&self, url: &str) -> Result<(), tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        let req = pb::ReadCopyRequest { id: 0 };
        match transport::unary(self.copy_deadline, client.read_copy(self.copy_request(req))).await {
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            other => other.map(drop),
        }
    }

    /// Asks the primary at `url` to ingest an upload and copy it to `req.copies`.
    pub(crate) async fn ingest(
        &self,
        url: &str,
        req: pb::IngestRequest,
    ) -> Result<pb::IngestReply, tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        transport::unary(self.deadline, client.ingest(self.request(req))).await
    }

    /// Stores `copy` on the node at `url`.
    pub(crate) async fn put_copy(
        &self,
        url: &str,
        copy: pb::PhotoCopy,
    ) -> Result<(), tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        transport::unary(self.copy_deadline, client.put_copy(self.copy_request(copy)))
            .await
            .map(drop)
    }

    /// The node at `url`'s copy of photo `id`.
    pub(crate) async fn read_copy(
        &self,
        url: &str,
        id: u64,
    ) -> Result<pb::PhotoCopy, tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        let req = pb::ReadCopyRequest { id };
        transport::unary(self.deadline, client.read_copy(self.request(req))).await
    }

    /// Removes the node at `url`'s copy of photo `id`; whether it had one.
    pub(crate) async fn drop_copy(&self, url: &str, id: u64) -> Result<bool, tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        let req = pb::DropCopyRequest { id };
        transport::unary(self.deadline, client.drop_copy(self.request(req)))
            .await
            .map(|r| r.existed)
    }
}

impl Peers {
    /// Stores a copy of a plain object's file on the node at `url`.
    pub(crate) async fn put_blob(
        &self,
        url: &str,
        copy: pb::BlobCopy,
    ) -> Result<(), tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        transport::unary(self.deadline, client.put_blob(self.request(copy)))
            .await
            .map(drop)
    }

    /// The node at `url`'s copy of file `name`, which must have `sha256`.
    pub(crate) async fn read_blob(
        &self,
        url: &str,
        name: &str,
        sha256: &str,
    ) -> Result<pb::BlobCopy, tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        let req = pb::ReadBlobRequest {
            name: name.into(),
            sha256: sha256.into(),
        };
        transport::unary(self.deadline, client.read_blob(self.request(req))).await
    }

    /// Removes the node at `url`'s copy of file `name`; whether it had one.
    pub(crate) async fn drop_blob(&self, url: &str, name: &str) -> Result<bool, tonic::Status> {
        let mut client = self.client(url).map_err(status)?;
        let req = pb::DropBlobRequest { name: name.into() };
        transport::unary(self.deadline, client.drop_blob(self.request(req)))
            .await
            .map(|r| r.existed)
    }
}

fn status(e: ReplicationError) -> tonic::Status {
    tonic::Status::unavailable(e.to_string())
}
