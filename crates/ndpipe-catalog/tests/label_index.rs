//! The PostgreSQL label index: the migration that adds it (the last one) indexes the
//! predictions already stored exactly as new writes are indexed (see
//! `ndpipe_catalog::test_postgres`).

use ndpipe_catalog::PgCatalog;
use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::{index_label_answers, store_index_labels};

#[test]
fn the_migration_indexes_the_labels_already_stored() {
    let Some(db) = support::database("label_backfill") else {
        return;
    };
    let written = {
        let c = PgCatalog::connect(&db.url).unwrap();
        store_index_labels(&c);
        index_label_answers(&c)
    };
    let mut client = db.client();
    let last: i32 = client
        .query_one("SELECT MAX(version) FROM schema_migrations", &[])
        .unwrap()
        .get(0);
    client
        .execute("DELETE FROM schema_migrations WHERE version = $1", &[&last])
        .unwrap();
    client.batch_execute("DROP TABLE photo_labels").unwrap();
    let migrated = PgCatalog::connect(&db.url).unwrap();
    assert_eq!(index_label_answers(&migrated), written);
}
