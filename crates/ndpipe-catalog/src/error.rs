/// Errors of catalog operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The database failed or refused the operation.
    #[error("catalog database error during {op}: {source}")]
    Database {
        /// What the catalog was doing.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database did not answer in time, or the connection to it was lost: the caller may
    /// try again later (HTTP 503 `catalog_unavailable`).
    #[error("the catalog database is unavailable during {op}: {source}")]
    Unavailable {
        /// What the catalog was doing.
        op: &'static str,
        /// The driver's or the pool's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A referenced row does not exist.
    #[error("{what} not found")]
    NotFound {
        /// The missing thing, e.g. "photo 12".
        what: String,
    },
    /// The row exists already.
    #[error("{what} already exists")]
    Conflict {
        /// The duplicate thing.
        what: String,
    },
    /// A conditional write's condition does not hold (S3's `If-None-Match`/`If-Match`).
    #[error("precondition failed: {what}")]
    PreconditionFailed {
        /// Why, e.g. "object photos/a.jpg exists".
        what: String,
    },
    /// The thing still holds others (a bucket with objects).
    #[error("{what} is not empty")]
    NotEmpty {
        /// The thing, e.g. "bucket photos".
        what: String,
    },
    /// The database holds a value this code cannot interpret.
    #[error("catalog holds an invalid value: {0}")]
    Invalid(String),
}

impl CatalogError {
    /// A SQLite error for the operation `op`: [`CatalogError::Unavailable`] when the database
    /// stayed locked past its busy timeout (5 s), [`CatalogError::Database`] otherwise.
    pub(crate) fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
        move |e| {
            let busy = matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            );
            let source = Box::new(e);
            if busy {
                CatalogError::Unavailable { op, source }
            } else {
                CatalogError::Database { op, source }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_sqlite_database_is_unavailable() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(matches!(
            CatalogError::db("test")(busy),
            CatalogError::Unavailable { .. }
        ));
        assert!(matches!(
            CatalogError::db("test")(rusqlite::Error::InvalidQuery),
            CatalogError::Database { .. }
        ));
    }
}
