//! The embedded SQLite catalog: one file in WAL mode, one connection behind a mutex (SQLite
//! serialises writers anyway), every trait method one transaction.
//!
//! - [`schema`]: the numbered migrations;
//! - `photos`: photos, predictions and search ([`PhotoCatalog`](crate::PhotoCatalog));
//! - `truths`: ground truth per task ([`TruthCatalog`](crate::TruthCatalog));
//! - `tasks`: tasks ([`TaskCatalog`](crate::TaskCatalog));
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
mod tasks;
mod truths;

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

    /// A catalog file with the first `n` migrations applied, as an older build left it.
    fn older_catalog(path: &Path, n: usize) -> Connection {
        let conn = Connection::open(path).unwrap();
        for sql in &schema::MIGRATIONS[..n] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", n).unwrap();
        conn
    }

    fn migration_creating(table: &str) -> usize {
        schema::MIGRATIONS
            .iter()
            .position(|m| m.contains(&format!("CREATE TABLE {table} ")))
            .unwrap()
    }

    #[test]
    fn the_migration_indexes_the_labels_already_stored() {
        let written = {
            let c = SqliteCatalog::in_memory().unwrap();
            crate::test_suite::store_index_labels(&c);
            crate::test_suite::index_label_answers(&c)
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.sqlite");
        {
            let conn = older_catalog(&path, migration_creating("photo_labels"));
            for (i, label) in crate::test_suite::INDEX_LABELS.iter().enumerate() {
                let id = i as i64 + 1;
                conn.execute(
                    "INSERT INTO photos VALUES (?1, ?2, 100, 640, 480, 'image/jpeg', 0)",
                    rusqlite::params![id, format!("{id:064x}")],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO predictions VALUES (?1, 'v', 0, 'other', 0.9), (?1, 'v', 1, ?2, 0.5)",
                    rusqlite::params![id, label],
                )
                .unwrap();
            }
        }
        let migrated = SqliteCatalog::open(&path).unwrap();
        assert_eq!(crate::test_suite::index_label_answers(&migrated), written);
    }

    #[test]
    fn the_tasks_migration_keeps_labels_heads_and_ground_truth() {
        use crate::{ModelRegistry, TaskCatalog, TaskName, TruthCatalog};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.sqlite");
        {
            let conn = older_catalog(&path, migration_creating("tasks"));
            conn.execute_batch(
                "INSERT INTO photos VALUES (1, 'aa', 100, 640, 480, 'image/png', 0);
                 INSERT INTO photos VALUES (2, 'bb', 100, 640, 480, 'image/png', 0);
                 INSERT INTO ground_truth VALUES (1, 'Trouser', 'train');
                 INSERT INTO model_versions VALUES
                   ('eff-1', 'b1', NULL, '{\"head\":\"pretrained\"}', 1, 0),
                   ('ft-1', 'b1', 'eff-1', '{\"val_top1\":0.8}', 2, 1);
                 INSERT INTO predictions VALUES (2, 'eff-1', 0, 'tabby, tabby cat', 0.4),
                                                (2, 'ft-1', 0, 'Dress', 0.2);",
            )
            .unwrap();
        }
        let c = SqliteCatalog::open(&path).unwrap();
        let active: Vec<(String, String)> = c
            .active_models()
            .unwrap()
            .into_iter()
            .map(|m| (m.task.to_string(), m.id))
            .collect();
        assert_eq!(
            active,
            [
                ("default".to_string(), "ft-1".to_string()),
                ("general".to_string(), "eff-1".to_string())
            ],
            "the active head is the default task's; general serves its backbone's own classifier"
        );
        assert_eq!(c.tasks().unwrap().len(), 2);
        let truths = c.ground_truths(&TaskName::default_task()).unwrap();
        assert_eq!((truths[0].id, truths[0].label.as_str()), (1, "Trouser"));
        assert_eq!(c.predictions(2).unwrap().len(), 2, "nothing is re-labelled");
    }
}
