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

/// Maps a driver error to a [`CatalogError`] for the operation `op`:
/// [`CatalogError::Unavailable`] when the server did not answer in time or the connection is
/// lost (worth a retry later), [`CatalogError::Database`] otherwise.
pub(crate) fn db(op: &'static str) -> impl FnOnce(postgres::Error) -> CatalogError {
    move |e| {
        let source = Box::new(PgFailure::new(&e));
        if unavailable(&e) {
            CatalogError::Unavailable { op, source }
        } else {
            CatalogError::Database { op, source }
        }
    }
}

/// Whether `e` says the server is out of reach rather than that it refused the operation: a
/// closed connection, an I/O error, a statement cancelled by its timeout, a connection
/// failure (SQLSTATE class 08), or a server shutting down or starting (57P01-57P03).
fn unavailable(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code == "57014" || code.starts_with("08") || code.starts_with("57P")
        }
        None => e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()),
    }
}
