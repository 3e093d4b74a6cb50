//! The migration that adds objects' attributes and user tags (PostgreSQL's 10th, SQLite's 9th):
//! objects stored before it read back with none, on both back ends (PostgreSQL: see
//! `ndpipe_catalog::test_postgres`).

use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::object;
use ndpipe_catalog::{
    Bucket, ObjectAttributes, ObjectCatalog, ObjectRecord, PgCatalog, PutCondition, SqliteCatalog,
};

/// The number of the PostgreSQL migration that adds the columns.
const PG_MIGRATION: i32 = 10;
/// How many SQLite migrations there were before it.
const SQLITE_BEFORE: i32 = 8;

/// Stores an object in bucket `b`; what it reads back as once the columns are gone and back.
fn stored(c: &dyn ObjectCatalog) -> ObjectRecord {
    c.create_bucket(&Bucket {
        name: "b".into(),
        created_ms: 1,
    })
    .unwrap();
    let o = object("b", "old.json", None);
    c.put_object(&o, &PutCondition::Always).unwrap();
    o
}

fn read_back(c: &dyn ObjectCatalog, o: &ObjectRecord) {
    let back = c.object("b", "old.json").unwrap().unwrap();
    assert_eq!(&back, o);
    assert_eq!(back.attributes, ObjectAttributes::default());
    assert!(back.tags.is_empty());
}

#[test]
fn postgres_objects_stored_before_read_back_with_no_attributes() {
    let Some(db) = support::database("object_attributes") else {
        return;
    };
    let o = stored(&PgCatalog::connect(&db.url).unwrap());
    let mut client = db.client();
    client
        .execute(
            "DELETE FROM schema_migrations WHERE version >= $1",
            &[&PG_MIGRATION],
        )
        .unwrap();
    client
        .batch_execute("ALTER TABLE objects DROP COLUMN attributes, DROP COLUMN tags")
        .unwrap();
    read_back(&PgCatalog::connect(&db.url).unwrap(), &o);
}

#[test]
fn sqlite_objects_stored_before_read_back_with_no_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.sqlite");
    let o = stored(&SqliteCatalog::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(&format!(
        "ALTER TABLE objects DROP COLUMN attributes; ALTER TABLE objects DROP COLUMN tags;
         PRAGMA user_version = {SQLITE_BEFORE};"
    ))
    .unwrap();
    drop(conn);
    read_back(&SqliteCatalog::open(&path).unwrap(), &o);
}
