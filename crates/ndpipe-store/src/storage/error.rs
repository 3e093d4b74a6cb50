//! The error of the storage engine.

use std::path::{Path, PathBuf};

/// Why a storage operation (volumes, index, feature store) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A file-system operation failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Stored bytes failed their checksum or do not parse.
    #[error("corrupt data in {what}: {reason}")]
    Corrupt {
        /// Which file and where.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A volume was removed by compaction between an index lookup and the read.
    #[error("volume {volume} no longer exists")]
    VolumeGone {
        /// The volume number.
        volume: u32,
    },
    /// The embedded index or the feature store (redb) failed.
    #[error("index error: {source}")]
    Index {
        /// redb's error.
        #[source]
        source: Box<redb::Error>,
    },
    /// A feature vector has more values than the feature store's u16 dimension can say.
    #[error("a feature vector of {len} values is too long to store")]
    FeaturesTooLong {
        /// Its length.
        len: usize,
    },
    /// The group commit this write was part of failed and was rolled back; nothing of it is
    /// stored.
    #[error("write failed: {reason}")]
    WriteFailed {
        /// Why the batch failed.
        reason: String,
    },
    /// The disk has too little free space for this write: below the configured reserve, or the
    /// file system reported it full. Nothing of the write is stored; reads and deletes go on.
    #[error("not enough free disk space: {reason}")]
    InsufficientStorage {
        /// What was short.
        reason: String,
    },
    /// No photo id could be had from the catalog this node shares with others (it is
    /// unreachable, or its ids are unusable here); nothing of the put is stored.
    #[error("no photo id from the shared catalog: {reason}")]
    NoPhotoId {
        /// Why.
        reason: String,
    },
    /// The writer has stopped (the store is shutting down).
    #[error("the store is shut down")]
    Closed,
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.to_path_buf();
        move |source| StoreError::Io { op, path, source }
    }

    pub(crate) fn index<E: Into<redb::Error>>(e: E) -> StoreError {
        StoreError::Index {
            source: Box::new(e.into()),
        }
    }

    /// Whether the error means the disk (or the user's quota) is full.
    pub(crate) fn is_no_space(&self) -> bool {
        match self {
            StoreError::InsufficientStorage { .. } => true,
            StoreError::Io { source, .. } => is_full(source),
            StoreError::Index { source } => matches!(&**source, redb::Error::Io(e) if is_full(e)),
            _ => false,
        }
    }

    /// Whether redb failed on I/O, after which it refuses every operation until the database is
    /// opened again.
    pub(crate) fn needs_reopen(&self) -> bool {
        matches!(self, StoreError::Index { source }
            if matches!(
            &**source,
            redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::DatabaseClosed
        ))
    }
}

/// Whether an I/O error says that no space (or no quota) is left.
fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}
