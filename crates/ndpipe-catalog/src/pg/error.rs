//! PostgreSQL errors as [`CatalogError`]s, with the server's message kept: the driver's own
//! `Display` stops at "db error" or "error connecting to server".

use std::error::Error as _;

use crate::CatalogError;

/// A driver error shown with its cause (the server's message and SQLSTATE, or the I/O error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PgFailure(String);

impl PgFailure {
    pub(crate) fn new(e: &postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            return PgFailure(format!("{db} (SQLSTATE {})", db.code().code()));
        }
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        PgFailure(text)
    }
}

/// Why a connection could not be opened, naming the server (never the password).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to PostgreSQL at {target}: {reason}")]
pub(crate) struct ConnectFailure {
    pub(crate) target: String,
    pub(crate) reason: PgFailure,
}

/// The pool gave no connection in time (the server is down, or every connection is busy).
#[derive(Debug, thiserror::Error)]
#[error("no PostgreSQL connection available from the pool: {0}")]
pub(crate) struct PoolFailure(#[source] pub(crate) r2d2::Error);

/// Maps a driver error to [`CatalogError::Database`] for the operation `op`.
pub(crate) fn db(op: &'static str) -> impl FnOnce(postgres::Error) -> CatalogError {
    move |e| CatalogError::Database {
        op,
        source: Box::new(PgFailure::new(&e)),
    }
}
