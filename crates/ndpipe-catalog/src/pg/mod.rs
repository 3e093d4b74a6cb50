//! The PostgreSQL catalog: one database that every node of a cluster shares.
//!
//! The client is the synchronous `postgres` crate behind an `r2d2` pool. The catalog traits are
//! synchronous and the PipeStore calls them from blocking threads (`spawn_blocking`, the
//! labeller and job threads), so an async driver (`sqlx`, `tokio-postgres`) would only add a
//! bridge back to blocking code on every call; the pool gives each such thread its own
//! connection, where SQLite serialises them on one. The pool's manager is ours rather than
//! `r2d2_postgres`'s (`connect.rs`), so that the pool's errors keep the server's message.
//! `postgres` blocks on a small Tokio runtime of its own, which Tokio forbids inside another
//! runtime's task: on a multi-threaded runtime the methods step out with `block_in_place` (the
//! Tuner calls its registry from async handlers); on a current-thread runtime, call them from
//! `spawn_blocking`.
//!
//! A handle belongs to one node ([`PgOptions::node`]): photos (with their ground truth and
//! predictions) and jobs are that node's, so each PipeStore sees what it stores, as with its own
//! SQLite file; model versions and the node registry are the cluster's. Photo ids are unique
//! across the cluster: nodes take them from blocks that [`PhotoIdBlocks`](crate::PhotoIdBlocks)
//! reserves, and a photo whose id another node holds is refused as a conflict.
//!
//! - `connect`: URLs, the first connection and the pool's manager;
//! - `schema`: the numbered migrations and `schema_migrations`;
//! - `photos`: [`PhotoCatalog`](crate::PhotoCatalog);
//! - `truths`: [`TruthCatalog`](crate::TruthCatalog), ground truth per task;
//! - `tasks`: [`TaskCatalog`](crate::TaskCatalog), the cluster's tasks;
//! - `search`: label search by the label index, of one node or of the cluster;
//! - `duplicates`: [`DuplicateCatalog`](crate::DuplicateCatalog), perceptual hashes and
//!   exact-duplicate sets of the whole cluster;
//! - `models`: [`ModelRegistry`](crate::ModelRegistry), each node's active version per task;
//! - `jobs`: [`JobLog`](crate::JobLog);
//! - `nodes`: [`NodeRegistry`](crate::NodeRegistry), the cluster's PipeStores and their leases;
//! - `objects`: [`ObjectCatalog`](crate::ObjectCatalog), the S3 buckets and objects, shared by
//!   the cluster (one key names one object cluster-wide);
//! - `keys`: [`AccessKeys`](crate::AccessKeys), the cluster's access keys;
//! - `ids`: [`PhotoIdBlocks`](crate::PhotoIdBlocks);
//! - `replicas`: [`ReplicaCatalog`](crate::ReplicaCatalog), every photo's copies, tombstones
//!   and the nodes placement chooses from;
//! - `blob_copies`: [`BlobCatalog`](crate::BlobCatalog), the copies of plain objects' files;
//! - `open`: [`open`](crate::open), SQLite or PostgreSQL from one `--catalog` value;
//! - `error`: driver errors as [`CatalogError`]s.

mod blob_copies;
mod connect;
mod duplicates;
mod error;
mod ids;
mod jobs;
mod keys;
mod models;
mod nodes;
mod objects;
mod open;
mod photos;
mod replicas;
mod schema;
mod search;
mod tasks;
mod truths;

use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, Transaction};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::block_in_place;

use self::error::{PoolFailure, db};
use crate::{CatalogError, PhotoId};

pub use ids::PhotoIdBlocks;
pub use open::{OpenedCatalog, describe, is_postgres_url, open, open_with};

/// How [`PgCatalog::connect_with`] connects, and the deadlines that keep a stalled or lost
/// server from holding a caller for longer than a few seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// The node whose photos and jobs the handle sees, e.g. the PipeStore's name.
    pub node: String,
    /// Connections kept open at most.
    pub pool_size: u32,
    /// How long to wait for the server to accept a new connection before failing.
    pub connect_timeout: Duration,
    /// The server's `statement_timeout` on every connection, and the TCP user timeout (sent
    /// data unacknowledged that long closes the connection); TCP keepalive probes go every
    /// third of it, so a silent peer is noticed in about that time.
    pub statement_timeout: Duration,
    /// How long a call waits for a connection of the pool (a free one, checked alive within
    /// this time) before failing with [`CatalogError::Unavailable`].
    pub checkout_timeout: Duration,
}

impl Default for PgOptions {
    /// Node `default`, 8 connections, a 10 s connect, a 3 s statement timeout and a 2 s
    /// checkout.
    fn default() -> Self {
        PgOptions {
            node: "default".into(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(3),
            checkout_timeout: Duration::from_secs(2),
        }
    }
}

/// A catalog in a PostgreSQL database, seen as one node of the cluster; safe to share between
/// threads, cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct PgCatalog {
    pool: r2d2::Pool<connect::Manager>,
    node: Arc<str>,
}

impl std::fmt::Debug for PgCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCatalog")
            .field("node", &self.node)
            .field("pool_size", &self.pool.max_size())
            .finish_non_exhaustive()
    }
}

impl PgCatalog {
    /// Connects with [`PgOptions::default`].
    pub fn connect(url: &str) -> Result<Self, CatalogError> {
        Self::connect_with(url, &PgOptions::default())
    }

    /// Connects to `url` (`postgres://user:password@host:port/database`), brings the schema up
    /// to date in one transaction, and keeps a pool of connections. Fails with a
    /// [`CatalogError`] naming the server and the reason when the URL is malformed or the server
    /// refuses, and with [`CatalogError::Invalid`] when the database's schema is newer than this
    /// build.
    pub fn connect_with(url: &str, options: &PgOptions) -> Result<Self, CatalogError> {
        if options.node.is_empty() {
            return Err(CatalogError::Invalid("the node name is empty".into()));
        }
        if options.pool_size == 0 {
            return Err(CatalogError::Invalid("the pool size is 0".into()));
        }
        if options.statement_timeout.is_zero() || options.checkout_timeout.is_zero() {
            return Err(CatalogError::Invalid(
                "the statement and checkout timeouts must be above 0".into(),
            ));
        }
        let config = connect::parse(url, options.connect_timeout)?;
        outside_async(|| schema::migrate(&mut connect::connect_once(&config)?))?;
        let pool = r2d2::Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(1))
            .connection_timeout(options.checkout_timeout)
            .build_unchecked(connect::manager(
                connect::with_deadlines(config, options.statement_timeout),
                options.checkout_timeout,
            ));
        Ok(PgCatalog {
            pool,
            node: options.node.as_str().into(),
        })
    }

    /// The node this handle belongs to.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Runs `f` on a connection of the pool.
    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        let run = || {
            let mut conn = self.pool.get().map_err(|e| CatalogError::Unavailable {
                op: "get a connection",
                source: Box::new(PoolFailure(e)),
            })?;
            f(&mut conn)
        };
        outside_async(run)
    }

    /// Runs `f` in one transaction, committed when `f` succeeds and rolled back otherwise.
    pub(super) fn tx<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        self.with(|conn| {
            let mut tx = conn.transaction().map_err(db(op))?;
            let out = f(&mut tx)?;
            tx.commit().map_err(db(op))?;
            Ok(out)
        })
    }
}

/// Runs the blocking `f`, stepping out of the async task when called from one on a
/// multi-threaded Tokio runtime.
fn outside_async<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => block_in_place(f),
        _ => f(),
    }
}

/// A photo id as PostgreSQL's BIGINT; ids above `i64::MAX` are refused.
pub(super) fn sql_id(id: PhotoId) -> Result<i64, CatalogError> {
    i64::try_from(id).map_err(|_| CatalogError::Invalid(format!("photo id {id} out of range")))
}

/// `ids` as PostgreSQL ids, for `= ANY($1)`.
pub(super) fn sql_ids(ids: &[PhotoId]) -> Result<Vec<i64>, CatalogError> {
    ids.iter().map(|&id| sql_id(id)).collect()
}

/// Columns `0..N` of `row` as counts (of `what`, for the error).
pub(super) fn counts<const N: usize>(
    row: &postgres::Row,
    what: &str,
) -> Result<[u64; N], CatalogError> {
    let mut out = [0; N];
    for (i, n) in out.iter_mut().enumerate() {
        let v: i64 = row.try_get(i).map_err(db("read counts"))?;
        *n = from_sql(v, what)?;
    }
    Ok(out)
}

/// A BIGINT read back as an unsigned or narrower value; `what` names it in the error.
pub(super) fn from_sql<T: TryFrom<i64>>(value: i64, what: &str) -> Result<T, CatalogError> {
    T::try_from(value).map_err(|_| CatalogError::Invalid(format!("{what} {value} out of range")))
}
