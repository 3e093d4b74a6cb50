//! One `--catalog` value to a catalog: a PostgreSQL URL, or else a SQLite file.

use std::path::Path;
use std::sync::Arc;

use super::{PgCatalog, PgOptions, PhotoIdBlocks};
use crate::{Catalog, CatalogError, NodeRegistry, ReplicaCatalog, SqliteCatalog};

/// A catalog opened by [`open`], with what only a shared catalog offers.
pub struct OpenedCatalog {
    /// The catalog.
    pub catalog: Arc<dyn Catalog>,
    /// Where the node must take new photo ids from: `Some` on PostgreSQL, where many nodes share
    /// the catalog; `None` on SQLite, where the store numbers its photos itself.
    pub photo_ids: Option<Arc<dyn PhotoIdBlocks>>,
    /// The replica map: `Some` on PostgreSQL, the only catalog several nodes share.
    pub replicas: Option<Arc<dyn ReplicaCatalog>>,
    /// The node registry in the same database (what a Tuner keeps).
    pub nodes: Arc<dyn NodeRegistry>,
}

/// Whether `spec` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// `spec` as it may be logged: a PostgreSQL URL without its password, the SQLite path that
/// [`open`] would use otherwise.
pub fn describe(spec: &str, default_sqlite_path: &Path) -> String {
    if is_postgres_url(spec) {
        return without_password(spec);
    }
    if spec.is_empty() {
        return default_sqlite_path.display().to_string();
    }
    spec.to_string()
}

/// `scheme://user:password@rest` as `scheme://user@rest`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    format!("{scheme}://{user}@{host}")
}

/// Opens the catalog that `spec` names: a PostgreSQL URL, seen as node `node` (see
/// [`PgCatalog::connect_with`]); the SQLite file at `default_sqlite_path` when `spec` is empty;
/// otherwise the SQLite file at path `spec`.
pub fn open(
    spec: &str,
    node: &str,
    default_sqlite_path: &Path,
) -> Result<OpenedCatalog, CatalogError> {
    let options = PgOptions {
        node: node.into(),
        ..PgOptions::default()
    };
    open_with(spec, &options, default_sqlite_path)
}

/// [`open`] with the PostgreSQL connection's `options` (its node, pool and deadlines); a
/// SQLite file ignores them.
pub fn open_with(
    spec: &str,
    options: &PgOptions,
    default_sqlite_path: &Path,
) -> Result<OpenedCatalog, CatalogError> {
    if is_postgres_url(spec) {
        let pg = Arc::new(PgCatalog::connect_with(spec, options)?);
        return Ok(OpenedCatalog {
            catalog: pg.clone(),
            photo_ids: Some(pg.clone()),
            replicas: Some(pg.clone()),
            nodes: pg,
        });
    }
    let path = if spec.is_empty() {
        default_sqlite_path
    } else {
        Path::new(spec)
    };
    let sqlite = Arc::new(SqliteCatalog::open(path)?);
    Ok(OpenedCatalog {
        catalog: sqlite.clone(),
        photo_ids: None,
        replicas: None,
        nodes: sqlite,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_postgres_and_anything_else_sqlite() {
        assert!(is_postgres_url("postgres://u@h/db"));
        assert!(is_postgres_url("postgresql://u@h/db"));
        assert!(!is_postgres_url("/data/catalog.sqlite"));
        assert!(!is_postgres_url("postgres"));
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("catalog.sqlite");
        let opened = open("", "n1", &default).unwrap();
        assert!(opened.photo_ids.is_none());
        assert_eq!(opened.catalog.count_photos().unwrap(), 0);
        assert!(default.exists());
        let other = dir.path().join("other.sqlite");
        open(other.to_str().unwrap(), "n1", &default).unwrap();
        assert!(other.exists());
    }

    #[test]
    fn descriptions_never_show_a_password() {
        let default = Path::new("/d/catalog.sqlite");
        assert_eq!(
            describe("postgres://ndpipe:s3cr@t@db:5432/ndpipe", default),
            "postgres://ndpipe@db:5432/ndpipe"
        );
        assert_eq!(describe("postgres://db/x", default), "postgres://db/x");
        assert_eq!(describe("", default), "/d/catalog.sqlite");
        assert_eq!(describe("/x.sqlite", default), "/x.sqlite");
    }
}
