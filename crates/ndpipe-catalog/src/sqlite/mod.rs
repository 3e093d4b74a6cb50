//! The embedded SQLite catalog: one file in WAL mode, one connection behind a mutex (SQLite
//! serialises writers anyway), every trait method one transaction.
//!
//! - [`schema`]: the numbered migrations;
//! - `photos`: photos, ground truth, predictions and search ([`PhotoCatalog`](crate::PhotoCatalog));
//! - `models`: the model registry ([`ModelRegistry`](crate::ModelRegistry));
//! - `jobs`: the job log ([`JobLog`](crate::JobLog));
//! - `objects`: buckets and objects of the S3 API ([`ObjectCatalog`](crate::ObjectCatalog));
//! - `keys`: access keys ([`AccessKeys`](crate::AccessKeys));
//! - `duplicates`: perceptual hashes and exact-duplicate sets
//!   ([`DuplicateCatalog`](crate::DuplicateCatalog));
//! - `nodes`: the Tuner's node registry ([`NodeRegistry`](crate::NodeRegistry)).

mod duplicates;
mod jobs;
mod keys;
mod models;
mod nodes;
mod objects;
mod photos;
mod schema;

use std::path::Path;
use std::sync::Mutex;

use ndpipe_util::sync::lock;
use rusqlite::Connection;

use crate::{CatalogError, PhotoId};

/// A catalog in one SQLite file (WAL mode), safe to share between threads.
pub struct SqliteCatalog {
    conn: Mutex<Connection>,
}

impl SqliteCatalog {
    /// Opens or creates the catalog at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, CatalogError> {
        let conn = Connection::open(path).map_err(CatalogError::db("open"))?;
        Self::init(conn)
    }

    /// A private in-memory catalog, for tests and tools.
    pub fn in_memory() -> Result<Self, CatalogError> {
        let conn = Connection::open_in_memory().map_err(CatalogError::db("open"))?;
        Self::init(conn)
    }

    fn init(mut conn: Connection) -> Result<Self, CatalogError> {
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA busy_timeout = 5000;",
        )
        .map_err(CatalogError::db("configure"))?;
        let applied: usize = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(CatalogError::db("read schema version"))?;
        if applied > schema::MIGRATIONS.len() {
            return Err(CatalogError::Invalid(format!(
                "catalog schema version {applied} is newer than this build ({})",
                schema::MIGRATIONS.len()
            )));
        }
        for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(applied) {
            let tx = conn.transaction().map_err(CatalogError::db("migrate"))?;
            tx.execute_batch(sql).map_err(CatalogError::db("migrate"))?;
            tx.pragma_update(None, "user_version", i + 1)
                .map_err(CatalogError::db("migrate"))?;
            tx.commit().map_err(CatalogError::db("migrate"))?;
        }
        Ok(SqliteCatalog {
            conn: Mutex::new(conn),
        })
    }

    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        f(&mut lock(&self.conn))
    }
}

pub(super) fn sql_id(id: PhotoId) -> Result<i64, CatalogError> {
    i64::try_from(id).map_err(|_| CatalogError::Invalid(format!("photo id {id} out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PhotoCatalog, Split};

    #[test]
    fn sqlite_passes_the_catalog_suite() {
        crate::test_suite::run(&SqliteCatalog::in_memory().unwrap());
    }

    #[test]
    fn sqlite_passes_the_node_registry_suite() {
        crate::test_suite::run_nodes(&SqliteCatalog::in_memory().unwrap());
    }

    #[test]
    fn data_survives_reopen_and_schema_is_not_reapplied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.sqlite");
        {
            let c = SqliteCatalog::open(&path).unwrap();
            c.upsert_photo(&crate::test_suite::photo(7, Some(("cat", Split::Val))))
                .unwrap();
        }
        let c = SqliteCatalog::open(&path).unwrap();
        let p = c.photo(7).unwrap().unwrap();
        assert_eq!(p.meta.ground_truth.unwrap().label, "cat");
    }

    fn p(label: &str, score: f32) -> crate::Prediction {
        crate::Prediction {
            label: label.into(),
            score,
        }
    }

    /// The query plan of a search, one line per step.
    fn search_plan(c: &SqliteCatalog) -> Vec<String> {
        c.with(|conn| {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {}", photos::SEARCH))
                .unwrap();
            let rows = stmt
                .query_map(
                    rusqlite::params!["v", 0, "sandal", 1, "sandal", 10, 0],
                    |r| r.get::<_, String>(3),
                )
                .unwrap();
            Ok(rows.map(Result::unwrap).collect())
        })
        .unwrap()
    }

    #[test]
    fn search_reads_the_label_index_and_scans_nothing() {
        let c = SqliteCatalog::in_memory().unwrap();
        for id in 1..=200 {
            c.upsert_photo(&crate::test_suite::photo(id, None)).unwrap();
            c.put_predictions(id, "v", &[p("sandal", 0.5), p("jersey, T-shirt", 0.4)])
                .unwrap();
        }
        let plan = search_plan(&c);
        let uses_index = |line: &String| {
            line.starts_with(
                "SEARCH photo_labels USING PRIMARY KEY (model_version=? AND kind=? AND term=?)",
            )
        };
        assert_eq!(
            plan.iter().filter(|l| uses_index(l)).count(),
            2,
            "{plan:#?}"
        );
        assert!(plan.iter().any(|l| l == "MERGE (UNION ALL)"), "{plan:#?}");
        let scans_a_table = |l: &String| {
            [
                "SCAN photo_labels",
                "SCAN predictions",
                "SCAN photos",
                "SCAN pr",
            ]
            .iter()
            .any(|scan| l.starts_with(scan))
        };
        assert!(
            !plan.iter().any(scans_a_table) && !plan.iter().any(|l| l.contains("TEMP B-TREE")),
            "no table is scanned, nothing sorted: {plan:#?}"
        );
    }

    #[test]
    fn the_migration_indexes_the_labels_already_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.sqlite");
        let written = {
            let c = SqliteCatalog::open(&path).unwrap();
            crate::test_suite::store_index_labels(&c);
            crate::test_suite::index_label_answers(&c)
        };
        {
            let conn = Connection::open(&path).unwrap();
            let before = schema::MIGRATIONS
                .iter()
                .position(|m| m.contains("CREATE TABLE photo_labels"))
                .unwrap();
            conn.execute_batch(&format!(
                "DROP TABLE photo_labels; PRAGMA user_version = {before};"
            ))
            .unwrap();
        }
        let migrated = SqliteCatalog::open(&path).unwrap();
        assert_eq!(crate::test_suite::index_label_answers(&migrated), written);
    }
}
