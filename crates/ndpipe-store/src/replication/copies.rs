//! Copies of one photo: sending them (the primary), receiving, reading and dropping them (every
//! holder), and replacing a damaged one from an intact one. A copy carries the photo's features
//! for the sender's backbone version; a receiver that runs the same version keeps them, so any
//! holder serves near-data fine-tuning without running the backbone over the photo again.

use std::collections::HashSet;

use ndpipe_catalog::PhotoMeta;
use ndpipe_proto::pb;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::front::peer_of;
use super::{Replication, ReplicationError, detour, placement};
use crate::ingest::{IngestError, StoredPhoto};
use crate::storage::features::check_encoded;
use crate::storage::{NewPhoto, StoreError};

/// Metadata sent with a copy, from its JSON form.
pub(super) fn meta_from_json(json: &str) -> Result<PhotoMeta, String> {
    serde_json::from_str(json).map_err(|e| format!("malformed photo metadata: {e}"))
}

fn meta_to_json(meta: &PhotoMeta) -> String {
    serde_json::to_string(meta).expect("metadata serialises; this is a bug")
}

/// Whether `original` is the photo `meta` describes.
pub(super) fn intact(meta: &PhotoMeta, original: &[u8]) -> bool {
    original.len() as u64 == meta.bytes && hex::encode(Sha256::digest(original)) == meta.sha256
}

/// Why a copy sent to this node is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    /// The copy is malformed or its bytes do not match its checksum.
    #[error("{0}")]
    Invalid(String),
    /// The photo was deleted meanwhile.
    #[error("photo {0} is deleted")]
    Deleted(u64),
    /// No such copy here.
    #[error("this node holds no copy of photo {0}")]
    NotHeld(u64),
    /// No copy of this plain object's file here.
    #[error("this node holds no copy of plain object file {0}")]
    NoFile(String),
    /// This node's copy of a plain object's file does not match its checksum.
    #[error("this node's copy of plain object file {0} is damaged")]
    DamagedFile(String),
    /// A plain object's file could not be read or written.
    #[error("plain object file: {0}")]
    Io(#[from] std::io::Error),
    /// The local store failed (a damaged copy is [`StoreError::Corrupt`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The rest failed.
    #[error(transparent)]
    Replication(#[from] ReplicationError),
}

impl From<ndpipe_catalog::CatalogError> for CopyError {
    fn from(e: ndpipe_catalog::CatalogError) -> Self {
        CopyError::Replication(e.into())
    }
}

impl From<tokio::task::JoinError> for CopyError {
    fn from(e: tokio::task::JoinError) -> Self {
        CopyError::Replication(e.into())
    }
}

impl Replication {
    /// Sends the new photo `id` to every node of `copies` at once; a node that cannot be
    /// reached within the copy deadline is replaced by the next node of the photo's
    /// placement ([`detour`](super::detour)). When the copies cannot all be made, takes back
    /// (again all at once) those that were.
    pub(super) async fn push_copies(
        &self,
        id: u64,
        photo: StoredPhoto,
        copies: Vec<pb::Peer>,
    ) -> Result<(), IngestError> {
        let key = placement::key_of(&photo.meta.sha256);
        let (backbone, features) = photo.features.unwrap_or_default();
        let copy = pb::PhotoCopy {
            id,
            meta_json: meta_to_json(&photo.meta),
            original: photo.original,
            tensor: photo.tensor,
            backbone,
            features,
        };
        let wanted = copies.len();
        let mut tried: HashSet<String> = copies.iter().map(|p| p.name.clone()).collect();
        tried.insert(self.name.clone());
        let (mut made, mut failed) = (Vec::new(), Vec::new());
        let mut pending = copies;
        while !pending.is_empty() {
            let refused = self
                .send_copies(&copy, pending, &mut made, &mut failed)
                .await;
            if made.len() == wanted {
                return Ok(());
            }
            if refused {
                break;
            }
            pending = self.spares(key, &tried, wanted - made.len()).await;
            tried.extend(pending.iter().map(|p| p.name.clone()));
        }
        self.take_back(id, &made).await;
        Err(IngestError::Copy(format!(
            "photo {id} could not be copied to {}",
            failed.join("; ")
        )))
    }

    /// Sends `copy` to every node of `peers` at once, adding those that took it to `made` and
    /// the others' errors to `failed`; whether one refused it (rather than was out of reach).
    async fn send_copies(
        &self,
        copy: &pb::PhotoCopy,
        peers: Vec<pb::Peer>,
        made: &mut Vec<pb::Peer>,
        failed: &mut Vec<String>,
    ) -> bool {
        let sends = peers
            .iter()
            .map(|peer| self.front.peers.put_copy(&peer.url, copy.clone()));
        let results = futures::future::join_all(sends).await;
        let mut refused = false;
        for (peer, result) in peers.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    self.front.health.answered(&peer.name);
                    made.push(peer);
                }
                Err(e) => {
                    if detour::unreachable(&e) {
                        self.front.health.failed(&peer.name);
                    } else {
                        refused = true;
                    }
                    failed.push(format!("{}: {}", peer.name, e.message()));
                }
            }
        }
        refused
    }

    /// Up to `n` nodes of the placement of the photo with `key` not `tried` yet, best first.
    async fn spares(&self, key: u64, tried: &HashSet<String>, n: usize) -> Vec<pb::Peer> {
        let Ok(order) = self.front.order(key).await else {
            return Vec::new();
        };
        order
            .into_iter()
            .filter(|node| !tried.contains(&node.name) && !self.front.health.suspect(&node.name))
            .take(n)
            .map(peer_of)
            .collect()
    }

    /// Takes back the copies of photo `id` on `made`, all at once.
    async fn take_back(&self, id: u64, made: &[pb::Peer]) {
        let drops = made.iter().map(|peer| async move {
            if let Err(e) = self.front.peers.drop_copy(&peer.url, id).await {
                warn!(photo = id, node = %peer.name, error = %e.message(),
                    "cannot take back a copy of an upload that failed; its next start drops it");
            }
        });
        futures::future::join_all(drops).await;
    }

    /// This node's backbone version and feature dimension; `None` without a model.
    fn backbone(&self) -> Option<(String, usize)> {
        let model = self.model.as_ref()?.get();
        let info = model.info();
        Some((info.backbone_version.clone(), info.feature_dim))
    }

    /// Whether `copy` carries features this node keeps (its backbone's), after checking that
    /// they are well formed.
    fn wanted_features(&self, copy: &pb::PhotoCopy) -> Result<bool, CopyError> {
        let Some((backbone, dim)) = self.backbone() else {
            return Ok(false);
        };
        if copy.features.is_empty() || copy.backbone != backbone {
            return Ok(false);
        }
        check_encoded(copy.id, &copy.features, dim)
            .map_err(|e| CopyError::Invalid(e.to_string()))?;
        Ok(true)
    }

    /// Stores the features `copy` carries (checked by [`Self::wanted_features`]). A failure only
    /// costs a backbone run later, so it is logged, not returned.
    async fn keep_features(&self, copy: &pb::PhotoCopy) {
        let Some((backbone, dim)) = self.backbone() else {
            return;
        };
        let features = self.features.clone();
        let (id, encoded) = (copy.id, copy.features.clone());
        let kept =
            tokio::task::spawn_blocking(move || features.put_encoded(&backbone, id, &encoded, dim))
                .await;
        if !matches!(kept, Ok(Ok(()))) {
            warn!(
                photo = id,
                "the features of a copy could not be stored; the backbone makes them when needed"
            );
        }
    }

    /// Stores a copy sent by a photo's primary (or by repair) and records it.
    pub(crate) async fn receive_copy(&self, copy: pb::PhotoCopy) -> Result<(), CopyError> {
        let meta = meta_from_json(&copy.meta_json).map_err(CopyError::Invalid)?;
        if !intact(&meta, &copy.original) {
            return Err(CopyError::Invalid(format!(
                "the bytes of photo {} do not match its checksum",
                copy.id
            )));
        }
        let id = copy.id;
        let catalog = self.catalog.clone();
        if !tokio::task::spawn_blocking(move || catalog.tombstoned(&[id]))
            .await??
            .is_empty()
        {
            return Err(CopyError::Deleted(id));
        }
        let with_features = self.wanted_features(&copy)?;
        let had = self.store.contains(id)?;
        self.store
            .put_copy(
                id,
                NewPhoto {
                    meta,
                    original: copy.original.clone(),
                    tensor: copy.tensor.clone(),
                },
            )
            .await?;
        if with_features {
            self.keep_features(&copy).await;
        }
        if !had {
            self.metrics.photos.inc();
        }
        let (catalog, name) = (self.catalog.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || catalog.add_copy(id, &name)).await??;
        self.metrics.replication.copies_received.inc();
        Ok(())
    }

    /// This node's copy of photo `id`, verified.
    pub(crate) async fn read_local_copy(&self, id: u64) -> Result<pb::PhotoCopy, CopyError> {
        let (store, features) = (self.store.clone(), self.features.clone());
        let backbone = self.backbone().map(|(b, _)| b);
        let (original, tensor, features) = tokio::task::spawn_blocking(move || {
            let original = store.original(id)?;
            let tensor = store.tensor(id)?;
            let features = match backbone {
                Some(b) => features.encoded(&b, id)?.map(|f| (b, f)),
                None => None,
            };
            Ok::<_, StoreError>((original, tensor, features))
        })
        .await??;
        let Some((entry, original)) = original else {
            return Err(CopyError::NotHeld(id));
        };
        let (backbone, features) = features.unwrap_or_default();
        Ok(pb::PhotoCopy {
            id,
            meta_json: meta_to_json(&entry.meta),
            original,
            tensor: tensor.map(|(_, t)| t).unwrap_or_default(),
            backbone,
            features,
        })
    }

    /// Removes this node's copy of photo `id`: from the store, its features and its record.
    /// Whether it had one.
    pub(crate) async fn drop_local(&self, id: u64) -> Result<bool, ReplicationError> {
        Ok(self.ingestor.delete(id).await?)
    }

    /// Removes this node's copy of photo `id` and its record, keeping the photo's catalog row
    /// (its other holders keep it). Whether this node had it.
    pub(super) async fn release_local(&self, id: u64) -> Result<bool, ReplicationError> {
        let (catalog, name) = (self.catalog.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || catalog.drop_copy(id, &name)).await??;
        Ok(self.ingestor.release(id).await?)
    }

    /// What another node's `DropCopy` does here: while the photo is catalogued (rebalancing
    /// moves it away), this node's copy and its record only, and never the primary's; once it
    /// is deleted or was never catalogued (an upload taken back), all of it. Whether this node
    /// had it.
    pub(crate) async fn drop_asked(&self, id: u64) -> Result<bool, ReplicationError> {
        match self.front.copies_of(id).await? {
            Some(c) if c.primary == self.name => Err(ReplicationError::IsPrimary {
                id,
                node: self.name.clone(),
            }),
            Some(_) => self.release_local(id).await,
            None => self.drop_local(id).await,
        }
    }

    /// Replaces this node's damaged or missing copy of photo `id` with `copy`.
    pub(super) async fn replace_local(
        &self,
        id: u64,
        copy: &pb::PhotoCopy,
    ) -> Result<(), ReplicationError> {
        let meta = meta_from_json(&copy.meta_json).map_err(|reason| ReplicationError::Peer {
            url: "a holder".into(),
            reason,
        })?;
        self.store.delete(id).await?;
        self.store
            .put_copy(
                id,
                NewPhoto {
                    meta,
                    original: copy.original.clone(),
                    tensor: copy.tensor.clone(),
                },
            )
            .await?;
        if matches!(self.wanted_features(copy), Ok(true)) {
            self.keep_features(copy).await;
        }
        self.metrics.replication.repaired.inc();
        tracing::info!(photo = id, "replaced a damaged copy with an intact one");
        Ok(())
    }

    /// Repairs this node's copy of photo `id` from another holder, when it is damaged.
    pub(crate) async fn repair_local(&self, id: u64) -> Result<(), ReplicationError> {
        let Some(copies) = self.front.copies_of(id).await? else {
            return Ok(());
        };
        let copy = self.front.fetch_intact(&copies).await?;
        self.metrics.replication.damaged.inc();
        self.replace_local(id, &copy).await
    }
}
