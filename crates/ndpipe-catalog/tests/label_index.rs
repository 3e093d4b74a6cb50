//! The PostgreSQL label index: the migration that adds it (number 6) indexes the predictions
//! already stored exactly as new writes are indexed (see `ndpipe_catalog::test_postgres`).

use ndpipe_catalog::PgCatalog;
use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::{index_label_answers, store_index_labels};

/// The number of the migration that adds the label index.
const LABEL_MIGRATION: i32 = 6;

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
    // Back to the schema before the label index: its migration and the later ones undone.
    let mut client = db.client();
    client
        .execute(
            "DELETE FROM schema_migrations WHERE version >= $1",
            &[&LABEL_MIGRATION],
        )
        .unwrap();
    client.batch_execute(support::UNDO_TASKS).unwrap();
    client
        .batch_execute("DROP TABLE photo_labels; DROP TABLE blob_copies; DROP INDEX objects_blob")
        .unwrap();
    let migrated = PgCatalog::connect(&db.url).unwrap();
    assert_eq!(index_label_answers(&migrated), written);
}
