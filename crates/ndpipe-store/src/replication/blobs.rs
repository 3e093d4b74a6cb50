//! Plain objects' files (S3 objects that are not photos) replicated like photos: placed on
//! `replicas` live nodes by the rendezvous hashing of their SHA-256, written to every one
//! before the object row names them, read from any holder with the checksum verified (a
//! damaged copy is replaced from an intact one), dropped on every holder, and brought back to
//! `replicas` copies by the node that holds one with the lowest name. What a failed upload or a
//! delete that could not reach a node leaves behind goes in a sweep: a file no object names,
//! older than a grace period, is removed. Files carry no tensor or features: every copy is the
//! same bytes.

use std::time::Duration;

use bytes::Bytes;
use ndpipe_catalog::{BlobHolders, PlacementNode};
use ndpipe_proto::pb;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::copies::CopyError;
use super::front::FrontDoor;
use super::{Replication, ReplicationError, placement};
use crate::storage::blobs;

/// Files looked at per catalog query.
const PAGE: usize = 256;
/// A file younger than this that no object names may still be named by an upload in flight.
const ORPHAN_GRACE_MS: i64 = 10 * 60_000;
/// How often a node sweeps its files again after the one at start.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// A plain object's file as stored on its holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredBlob {
    /// The file's name, which the object row names.
    pub(crate) name: String,
    /// The bytes' hex SHA-256.
    pub(crate) sha256: String,
}

/// What a sweep of the local files did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlobSweep {
    /// Files an object names that were not recorded as held here, recorded.
    pub(crate) recorded: u64,
    /// Files no object names, removed.
    pub(crate) removed: u64,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl FrontDoor {
    /// Writes a plain object's `bytes` to `replicas` live nodes chosen by placement; answers
    /// once every copy is durable and recorded. When one fails, the copies made are dropped
    /// and the write fails.
    pub(crate) async fn put_blob(&self, bytes: Bytes) -> Result<StoredBlob, ReplicationError> {
        self.put_blob_with(bytes, None::<fn(pb::BlobCopy) -> std::future::Ready<_>>)
            .await
    }

    /// [`FrontDoor::put_blob`], with this node's own copy written by `local` instead of over
    /// gRPC when placement chooses it.
    pub(super) async fn put_blob_with<F, Fut>(
        &self,
        bytes: Bytes,
        local: Option<F>,
    ) -> Result<StoredBlob, ReplicationError>
    where
        F: Fn(pb::BlobCopy) -> Fut,
        Fut: std::future::Future<Output = Result<(), tonic::Status>>,
    {
        let sha256 = sha256_hex(&bytes);
        let nodes = self.placement_nodes().await?;
        let wanted = self.config.replicas as usize;
        let chosen = placement::place(placement::key_of(&sha256), &nodes, wanted);
        if chosen.len() < wanted || chosen.is_empty() {
            return Err(ReplicationError::NotEnoughNodes {
                wanted: self.config.replicas,
                live: chosen.len(),
            });
        }
        let stored = StoredBlob {
            name: blobs::new_name(&sha256),
            sha256,
        };
        let copy = pb::BlobCopy {
            name: stored.name.clone(),
            sha256: stored.sha256.clone(),
            bytes: bytes.to_vec(),
        };
        let writes = chosen.iter().map(|node| match &local {
            Some(write) if Some(&node.name) == self.here() => {
                futures::future::Either::Left(write(copy.clone()))
            }
            _ => futures::future::Either::Right(self.peers.put_blob(&node.url, copy.clone())),
        });
        let results = futures::future::join_all(writes).await;
        let failed = chosen
            .iter()
            .zip(&results)
            .find_map(|(node, r)| r.as_ref().err().map(|e| (node, e.clone())));
        if let Some((node, e)) = failed {
            let written: Vec<&PlacementNode> = chosen
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|(n, _)| n)
                .collect();
            self.drop_blob_on(&stored.name, written).await;
            return Err(ReplicationError::Peer {
                url: node.url.clone(),
                reason: format!("cannot store a plain object's copy: {}", e.message()),
            });
        }
        Ok(stored)
    }

    /// Drops file `name` on each of `nodes`; a node that cannot be reached now removes it in
    /// its next sweep (no object names it).
    async fn drop_blob_on(&self, name: &str, nodes: Vec<&PlacementNode>) {
        for node in nodes {
            if let Err(e) = self.peers.drop_blob(&node.url, name).await {
                warn!(blob = name, node = %node.name, error = %e.message(),
                    "a holder could not drop a plain object's file now; its sweep will");
            }
        }
    }

    /// The bytes of file `name` from the first holder (other than `skip`) whose copy matches
    /// `sha256`, live holders first; holders found with a damaged copy get the intact one.
    pub(crate) async fn read_blob(
        &self,
        name: &str,
        sha256: &str,
        skip: Option<&str>,
    ) -> Result<Vec<u8>, ReplicationError> {
        let holders = self.blob_holders(name).await?;
        let nodes = self.placement_nodes().await?;
        let mut candidates: Vec<&PlacementNode> = nodes
            .iter()
            .filter(|n| holders.contains(&n.name) && Some(n.name.as_str()) != skip)
            .collect();
        candidates.sort_by_key(|n| !n.live);
        let (mut tried, mut damaged) = (Vec::new(), Vec::new());
        for node in candidates {
            match self.peers.read_blob(&node.url, name, sha256).await {
                Ok(copy) if sha256_hex(&copy.bytes) == sha256 => {
                    self.replace_damaged(name, sha256, &copy.bytes, damaged)
                        .await;
                    return Ok(copy.bytes);
                }
                Ok(_) => tried.push(format!("{}: damaged in transit", node.name)),
                Err(e) => {
                    if e.code() == tonic::Code::DataLoss {
                        damaged.push(node);
                    }
                    tried.push(format!("{}: {}", node.name, e.message()));
                }
            }
        }
        if tried.is_empty() {
            tried.push("no other node holds a copy".into());
        }
        Err(ReplicationError::NoIntactFile {
            name: name.to_string(),
            reason: tried.join("; "),
        })
    }

    /// Writes the intact `bytes` of file `name` over the damaged copies of `nodes`.
    async fn replace_damaged(
        &self,
        name: &str,
        sha256: &str,
        bytes: &[u8],
        nodes: Vec<&PlacementNode>,
    ) {
        for node in nodes {
            let copy = pb::BlobCopy {
                name: name.into(),
                sha256: sha256.into(),
                bytes: bytes.to_vec(),
            };
            match self.peers.put_blob(&node.url, copy).await {
                Ok(()) => {
                    self.metrics.replication.repaired.inc();
                }
                Err(e) => warn!(blob = name, node = %node.name, error = %e.message(),
                    "a damaged copy of a plain object could not be replaced yet"),
            }
        }
    }

    /// Drops file `name` on every holder but this node (the caller drops its own).
    pub(crate) async fn delete_blob(&self, name: &str) -> Result<(), ReplicationError> {
        let holders = self.blob_holders(name).await?;
        let nodes = self.placement_nodes().await?;
        let others = nodes
            .iter()
            .filter(|n| holders.contains(&n.name) && Some(&n.name) != self.here())
            .collect();
        self.drop_blob_on(name, others).await;
        Ok(())
    }

    async fn blob_holders(&self, name: &str) -> Result<Vec<String>, ReplicationError> {
        let (catalog, name) = (self.catalog.clone(), name.to_string());
        Ok(tokio::task::spawn_blocking(move || catalog.blob_holders(&name)).await??)
    }
}

impl Replication {
    /// Stores a plain object's copy sent by a front door or a repairing node: its bytes must
    /// match its checksum and its name be one a front door makes; written durably (over a
    /// damaged copy), then recorded.
    pub(crate) async fn receive_blob(&self, copy: pb::BlobCopy) -> Result<(), CopyError> {
        if !blobs::valid_name(&copy.name) {
            return Err(CopyError::Invalid(format!(
                "{:?} is not the name of a plain object's file",
                copy.name
            )));
        }
        if sha256_hex(&copy.bytes) != copy.sha256 {
            return Err(CopyError::Invalid(format!(
                "the bytes of file {} do not match its checksum",
                copy.name
            )));
        }
        self.store.check_space(copy.bytes.len() as u64)?;
        let (files, catalog) = (self.blobs.clone(), self.catalog.clone());
        tokio::task::spawn_blocking(move || {
            files.write(&copy.name, &copy.bytes)?;
            catalog.add_blob_copy(&copy.name)?;
            Ok::<_, CopyError>(())
        })
        .await??;
        self.metrics.replication.copies_received.inc();
        Ok(())
    }

    /// This node's copy of file `name`, verified against `sha256`.
    pub(crate) async fn read_local_blob(
        &self,
        name: &str,
        sha256: &str,
    ) -> Result<pb::BlobCopy, CopyError> {
        let (files, n) = (self.blobs.clone(), name.to_string());
        let bytes = tokio::task::spawn_blocking(move || files.read(&n)).await??;
        let Some(bytes) = bytes else {
            return Err(CopyError::NoFile(name.to_string()));
        };
        if sha256_hex(&bytes) != sha256 {
            self.metrics.replication.damaged.inc();
            return Err(CopyError::DamagedFile(name.to_string()));
        }
        Ok(pb::BlobCopy {
            name: name.into(),
            sha256: sha256.into(),
            bytes,
        })
    }

    /// Removes this node's copy of file `name` and its record; whether it had one.
    pub(crate) async fn drop_local_blob(&self, name: &str) -> Result<bool, ReplicationError> {
        let (files, catalog, name) = (self.blobs.clone(), self.catalog.clone(), name.to_string());
        tokio::task::spawn_blocking(move || {
            let existed = files.remove(&name);
            catalog.drop_blob_copy(&name)?;
            Ok::<_, ReplicationError>(existed)
        })
        .await?
    }

    /// Writes a plain object's bytes on `replicas` nodes ([`FrontDoor::put_blob`]), this node's
    /// copy (when placement chooses it) straight to its files.
    pub(crate) async fn upload_blob(&self, bytes: Bytes) -> Result<StoredBlob, ReplicationError> {
        let local = |copy: pb::BlobCopy| async move {
            self.receive_blob(copy)
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))
        };
        self.front.put_blob_with(bytes, Some(local)).await
    }

    /// The bytes of file `name`: this node's copy when it holds an intact one, else another
    /// holder's (replacing this node's damaged copy with it).
    pub(crate) async fn read_blob(
        &self,
        name: &str,
        sha256: &str,
    ) -> Result<Vec<u8>, ReplicationError> {
        let damaged = match self.read_local_blob(name, sha256).await {
            Ok(copy) => return Ok(copy.bytes),
            Err(CopyError::NoFile(_)) => false,
            Err(CopyError::DamagedFile(_)) => true,
            Err(e) => {
                warn!(blob = name, error = %e, "cannot read this node's copy of a plain object");
                false
            }
        };
        let bytes = self.front.read_blob(name, sha256, Some(&self.name)).await?;
        if damaged {
            let copy = pb::BlobCopy {
                name: name.into(),
                sha256: sha256.into(),
                bytes: bytes.clone(),
            };
            match self.receive_blob(copy).await {
                Ok(()) => {
                    self.metrics.replication.repaired.inc();
                }
                Err(e) => warn!(blob = name, error = %e, "cannot replace a damaged plain object"),
            }
        }
        Ok(bytes)
    }

    /// Drops file `name` on every holder, this node included.
    pub(crate) async fn delete_blob(&self, name: &str) -> Result<(), ReplicationError> {
        self.front.delete_blob(name).await?;
        self.drop_local_blob(name).await?;
        Ok(())
    }

    /// Records the local files an object names (files kept before replication covered them, or
    /// whose record was lost) and removes those no object names once past the grace period.
    pub(crate) async fn sweep_blobs(&self) -> Result<BlobSweep, ReplicationError> {
        let files = self.blobs.clone();
        let local = tokio::task::spawn_blocking(move || files.list()).await??;
        let mut report = BlobSweep::default();
        let now = ndpipe_util::time::now_ms();
        for chunk in local.chunks(PAGE) {
            let names: Vec<String> = chunk.iter().map(|(n, _)| n.clone()).collect();
            let (catalog, files) = (self.catalog.clone(), self.blobs.clone());
            let chunk = chunk.to_vec();
            let (recorded, removed) = tokio::task::spawn_blocking(move || {
                let named = catalog.referenced_blobs(&names)?;
                let known = catalog.recorded_here(&names)?;
                let (mut recorded, mut removed) = (0, 0);
                for (name, modified_ms) in chunk {
                    if named.contains(&name) {
                        if !known.contains(&name) {
                            recorded += u64::from(catalog.add_blob_copy(&name)?);
                        }
                    } else if now - modified_ms > ORPHAN_GRACE_MS {
                        files.remove(&name);
                        catalog.drop_blob_copy(&name)?;
                        removed += 1;
                    }
                }
                Ok::<_, ReplicationError>((recorded, removed))
            })
            .await??;
            report.recorded += recorded;
            report.removed += removed;
        }
        Ok(report)
    }

    /// Copies the files this node repairs until none is short or no node can take one.
    pub(super) async fn repair_blobs(&self) -> Result<(), ReplicationError> {
        loop {
            let (catalog, wanted) = (self.catalog.clone(), self.replicas());
            let short = tokio::task::spawn_blocking(move || {
                catalog.under_replicated_blobs(wanted, PAGE as u32)
            })
            .await??;
            if short.is_empty() {
                return Ok(());
            }
            let catalog = self.catalog.clone();
            let nodes = tokio::task::spawn_blocking(move || catalog.placement_nodes()).await??;
            let mut copied = 0;
            for file in &short {
                copied += u32::from(self.copy_blob_once(file, &nodes).await);
            }
            if copied == 0 {
                return Ok(());
            }
            info!(copied, "repaired under-replicated plain objects");
        }
    }

    /// Copies `file` to the best node that holds none; whether it did.
    async fn copy_blob_once(&self, file: &BlobHolders, nodes: &[PlacementNode]) -> bool {
        let key = placement::key_of(&file.sha256);
        let Some(target) = placement::targets(key, nodes, &file.holders)
            .into_iter()
            .next()
        else {
            return false;
        };
        // This node's copy, or (when it is damaged) another holder's, which then replaces it.
        let copy = match self.read_blob(&file.name, &file.sha256).await {
            Ok(bytes) => pb::BlobCopy {
                name: file.name.clone(),
                sha256: file.sha256.clone(),
                bytes,
            },
            Err(e) => {
                warn!(blob = %file.name, error = %e, "cannot read a plain object to copy it");
                return false;
            }
        };
        let bytes = copy.bytes.len() as u64;
        let sent = self.front.peers.put_blob(&target.url, copy).await;
        self.repair_sent(
            sent,
            bytes,
            &format!("plain object file {}", file.name),
            &target.name,
        )
    }
}
