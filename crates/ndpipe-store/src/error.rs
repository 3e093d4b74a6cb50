use std::path::{Path, PathBuf};

/// Errors of the storage engine.
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
    /// The embedded index failed.
    #[error("index error: {0}")]
    Index(String),
    /// The writer has stopped (the store is shutting down or failed).
    #[error("the store is shut down")]
    Closed,
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.to_path_buf();
        move |source| StoreError::Io { op, path, source }
    }

    pub(crate) fn index<E: Into<redb::Error>>(e: E) -> StoreError {
        StoreError::Index(e.into().to_string())
    }
}
