//! The PostgreSQL migration that adds tasks (see `ndpipe_catalog::test_postgres`): a cluster's
//! pretrained versions become the `general` task's, its heads and ground truth the `default`
//! task's, and every node's `general` serves the pretrained version of its head's backbone.

use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::{
    ModelRegistry, PgCatalog, PgOptions, PhotoCatalog, TaskCatalog, TaskName, TruthCatalog,
};

fn node(url: &str, name: &str) -> PgCatalog {
    let options = PgOptions {
        node: name.into(),
        ..PgOptions::default()
    };
    PgCatalog::connect_with(url, &options).unwrap()
}

#[test]
fn an_existing_cluster_keeps_its_labels_heads_and_ground_truth() {
    let Some(db) = support::database("tasks_migration") else {
        return;
    };
    drop(PgCatalog::connect(&db.url).unwrap());
    let mut client = db.client();
    client
        .execute(
            "DELETE FROM schema_migrations WHERE version >= $1",
            &[&support::TASKS_MIGRATION],
        )
        .unwrap();
    client.batch_execute(support::UNDO_TASKS).unwrap();
    client
        .batch_execute(
            r#"INSERT INTO photos VALUES (1, 'ps-a', 'aa', 100, 640, 480, 'image/png', 0),
                                        (2, 'ps-b', 'bb', 100, 640, 480, 'image/png', 0);
               INSERT INTO ground_truth VALUES (1, 'Trouser', 'train');
               INSERT INTO model_versions VALUES
                 ('eff-1', 'b1', NULL, '{"head": "pretrained"}', 1),
                 ('ft-1', 'b1', 'eff-1', '{"val_top1": 0.8}', 2);
               INSERT INTO active_models VALUES ('ps-a', 'ft-1'), ('ps-b', 'eff-1');
               INSERT INTO predictions VALUES (2, 'eff-1', 0, 'tabby, tabby cat', 0.4);"#,
        )
        .unwrap();
    let (a, b) = (node(&db.url, "ps-a"), node(&db.url, "ps-b"));
    let active = |c: &PgCatalog| -> Vec<String> {
        c.active_models()
            .unwrap()
            .into_iter()
            .map(|m| format!("{}={}", m.task, m.id))
            .collect()
    };
    assert_eq!(active(&a), ["default=ft-1", "general=eff-1"]);
    assert_eq!(active(&b), ["general=eff-1"]);
    assert_eq!(a.tasks().unwrap().len(), 2);
    let truths = a.ground_truths(&TaskName::default_task()).unwrap();
    assert_eq!((truths[0].id, truths[0].label.as_str()), (1, "Trouser"));
    assert_eq!(b.predictions(2).unwrap().len(), 1, "nothing is re-labelled");
}
