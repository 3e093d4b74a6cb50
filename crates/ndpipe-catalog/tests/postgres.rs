//! `PgCatalog` against a real PostgreSQL server (see `ndpipe_catalog::test_postgres`): the shared suites, migrations,
//! many handles and threads, errors, node scope, photo id blocks and search.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Arc;

use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::{self, photo};
use ndpipe_catalog::{
    CatalogError, GroundTruth, JobLog, JobRecord, ModelRegistry, ModelVersion, NodeRegistry,
    PgCatalog, PgOptions, PhotoCatalog, PhotoIdBlocks, PhotoRecord, Prediction, SqliteCatalog,
    TaskName, TruthCatalog,
};

fn node(url: &str, name: &str) -> PgCatalog {
    let options = PgOptions {
        node: name.into(),
        ..PgOptions::default()
    };
    PgCatalog::connect_with(url, &options).unwrap()
}

fn p(label: &str, score: f32) -> Prediction {
    Prediction {
        label: label.into(),
        score,
    }
}

fn model(id: &str) -> ModelVersion {
    ModelVersion {
        task: TaskName::default_task(),
        id: id.into(),
        backbone: "b".repeat(64),
        parent: None,
        metrics: serde_json::json!({"top1": 0.25, "classes": ["a", "b"]}),
        created_ms: 1,
        active: false,
    }
}

fn applied_migrations(db: &support::TestDb) -> (i64, i32) {
    let row = db
        .client()
        .query_one(
            "SELECT COUNT(*), COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn postgres_passes_the_catalog_suite() {
    let Some(db) = support::database("suite") else {
        return;
    };
    test_suite::run(&PgCatalog::connect(&db.url).unwrap());
}

/// Two nodes' handles on one database, as two front doors of a cluster: of the writers that
/// race through both to create one key, or to replace it if unchanged, exactly one wins.
#[test]
fn conditional_writes_through_two_nodes_have_one_winner() {
    let Some(db) = support::database("conditional") else {
        return;
    };
    let (a, b) = (node(&db.url, "a"), node(&db.url, "b"));
    test_suite::racing_writers_of_one_key_have_one_winner(&[&a, &b], "shared");
}

#[test]
fn postgres_passes_the_node_registry_suite() {
    let Some(db) = support::database("nodes") else {
        return;
    };
    test_suite::run_nodes(&PgCatalog::connect(&db.url).unwrap());
}

#[test]
fn migrating_twice_is_a_no_op_and_keeps_the_data() {
    let Some(db) = support::database("migrate_twice") else {
        return;
    };
    PgCatalog::connect(&db.url)
        .unwrap()
        .upsert_photo(&photo(7, None))
        .unwrap();
    let first = applied_migrations(&db);
    let again = PgCatalog::connect(&db.url).unwrap();
    assert_eq!(applied_migrations(&db), first);
    assert!(first.0 >= 1 && first.0 == i64::from(first.1));
    assert_eq!(again.photo(7).unwrap(), Some(photo(7, None)));
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let Some(db) = support::database("newer") else {
        return;
    };
    drop(PgCatalog::connect(&db.url).unwrap());
    db.client()
        .execute(
            "INSERT INTO schema_migrations (version, applied_ms) VALUES (1000, 0)",
            &[],
        )
        .unwrap();
    match PgCatalog::connect(&db.url) {
        Err(CatalogError::Invalid(why)) => assert!(why.contains("newer than this build"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn two_handles_on_one_database_see_each_others_writes() {
    let Some(db) = support::database("two_handles") else {
        return;
    };
    let (a, b) = (node(&db.url, "ps-1"), node(&db.url, "ps-1"));
    a.upsert_photo(&photo(1, Some(("cat", ndpipe_catalog::Split::Val))))
        .unwrap();
    assert_eq!(b.count_photos().unwrap(), 1);
    b.put_predictions(1, "m1", &[p("tabby", 0.5)]).unwrap();
    assert_eq!(a.search("tabby", "m1", 0, 10).unwrap()[0].id, 1);
    a.register_model(&model("m1")).unwrap();
    b.set_active_model("m1").unwrap();
    assert_eq!(
        a.active_model(&TaskName::default_task())
            .unwrap()
            .unwrap()
            .id,
        "m1"
    );
    let job = JobRecord {
        id: "j".into(),
        kind: "relabel".into(),
        status: "running".into(),
        state: serde_json::json!({"done": 3}),
        created_ms: 1,
        updated_ms: 2,
    };
    b.put_job(&job).unwrap();
    assert_eq!(a.jobs().unwrap(), vec![job]);
    assert!(a.delete_photo(1).unwrap());
    assert_eq!(b.photo(1).unwrap(), None);
}

#[test]
fn eight_threads_writing_at_once_lose_no_rows() {
    let Some(db) = support::database("eight_threads") else {
        return;
    };
    let catalog = Arc::new(PgCatalog::connect(&db.url).unwrap());
    for id in ["m0", "m1", "m2", "m3"] {
        catalog.register_model(&model(id)).unwrap();
    }
    catalog.upsert_photo(&photo(1, None)).unwrap();
    let per_thread = 100;
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let catalog = catalog.clone();
            s.spawn(move || {
                let ids: Vec<u64> = (0..per_thread).map(|i| 1_000 * (t + 1) + i).collect();
                for &id in &ids {
                    catalog.upsert_photo(&photo(id, None)).unwrap();
                }
                let rows: Vec<_> = ids.iter().map(|&id| (id, vec![p("x", 0.5)])).collect();
                assert_eq!(
                    catalog.put_predictions_many("v", &rows).unwrap(),
                    rows.len()
                );
                for round in 0..10 {
                    catalog
                        .put_predictions(1, "shared", &[p(&format!("t{t}r{round}"), 0.5)])
                        .unwrap();
                    catalog
                        .set_active_model(&format!("m{}", (t + round) % 4))
                        .unwrap();
                }
                catalog
                    .put_job(&JobRecord {
                        id: format!("job-{t}"),
                        kind: "relabel".into(),
                        status: "done".into(),
                        state: serde_json::json!({}),
                        created_ms: t.cast_signed(),
                        updated_ms: 0,
                    })
                    .unwrap();
            });
        }
    });
    assert_eq!(catalog.count_photos().unwrap(), 1 + 8 * per_thread);
    assert_eq!(catalog.unlabelled("v").unwrap(), vec![1]);
    assert_eq!(catalog.predictions(1).unwrap()[0].1.len(), 1);
    assert_eq!(
        catalog
            .models()
            .unwrap()
            .iter()
            .filter(|m| m.active)
            .count(),
        1
    );
    assert_eq!(catalog.jobs().unwrap().len(), 8);
}

#[test]
fn nodes_starting_together_migrate_once() {
    let Some(db) = support::database("start_together") else {
        return;
    };
    let url = &db.url;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| s.spawn(move || node(url, &format!("ps-{i}"))))
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    let (rows, version) = applied_migrations(&db);
    assert_eq!(rows, i64::from(version));
}

#[test]
fn bad_urls_and_unreachable_servers_give_clear_errors() {
    let Some(db) = support::database("errors") else {
        return;
    };
    let text = |url: &str| {
        let err = PgCatalog::connect(url).unwrap_err();
        assert!(matches!(err, CatalogError::Database { .. }), "{err:?}");
        err.to_string()
    };
    let bad = text("postgres://ndpipe@127.0.0.1:notaport/db");
    assert!(bad.contains("parse the PostgreSQL URL"), "{bad}");

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = text(&format!("postgres://ndpipe:secret@127.0.0.1:{port}/cat"));
    assert!(
        closed.contains(&format!(
            "cannot connect to PostgreSQL at ndpipe@127.0.0.1:{port}/cat"
        )),
        "{closed}"
    );
    assert!(closed.contains("refused"), "{closed}");
    assert!(!closed.contains("secret"), "{closed}");

    let (_, rest) = db.url.split_once('@').unwrap();
    let auth = text(&format!("postgres://nobody:wrong-pw@{rest}"));
    assert!(
        auth.contains("SQLSTATE 28"),
        "an authentication error: {auth}"
    );
    assert!(!auth.contains("wrong-pw"), "{auth}");

    let missing = text(&support::with_database(&db.url, "no_such_db"));
    assert!(missing.contains("SQLSTATE 3D000"), "{missing}");
}

#[test]
fn ids_beyond_i64_max_are_refused() {
    let Some(db) = support::database("big_ids") else {
        return;
    };
    let c = PgCatalog::connect(&db.url).unwrap();
    let big = u64::MAX;
    let invalid = |r: Result<(), CatalogError>| {
        assert!(matches!(r, Err(CatalogError::Invalid(_))), "{r:?}");
    };
    let with_id = |id| PhotoRecord::new(id, photo(1, None).meta);
    invalid(c.upsert_photo(&with_id(big)));
    invalid(c.photo(big).map(drop));
    invalid(c.existing_photo_ids(&[1, big]).map(drop));
    invalid(c.delete_photo(big).map(drop));
    invalid(c.list_photos(Some(big), 1).map(drop));
    invalid(c.set_ground_truth(big, &GroundTruth::new("x", ndpipe_catalog::Split::Train)));
    invalid(c.put_predictions(big, "v", &[]));
    invalid(c.put_predictions_many("v", &[(big, vec![])]).map(drop));
    invalid(c.predictions(big).map(drop));
    invalid(c.reserve_photo_ids(big).map(drop));
    invalid(c.reserve_photo_ids(0).map(drop));
    let top = i64::MAX.cast_unsigned();
    c.upsert_photo(&with_id(top)).unwrap();
    assert_eq!(c.photo(top).unwrap().unwrap().id, top);
}

#[test]
fn each_node_sees_its_own_photos_and_jobs_and_the_clusters_models() {
    let Some(db) = support::database("node_scope") else {
        return;
    };
    let (a, b) = (node(&db.url, "ps-a"), node(&db.url, "ps-b"));
    a.upsert_photo(&photo(1, Some(("cat", ndpipe_catalog::Split::Train))))
        .unwrap();
    b.upsert_photo(&photo(2, Some(("cat", ndpipe_catalog::Split::Train))))
        .unwrap();
    assert_eq!(
        (a.count_photos().unwrap(), b.count_photos().unwrap()),
        (1, 1)
    );
    assert_eq!(a.photo(2).unwrap(), None);
    for c in [&a, &b] {
        let mut found: Vec<u64> = c
            .existing_photo_ids(&[3, 2, 1])
            .unwrap()
            .into_iter()
            .collect();
        found.sort_unstable();
        assert_eq!(found, [1, 2], "either node's photos, not the missing one");
    }
    assert_eq!(
        a.labelled(&TaskName::default_task(), ndpipe_catalog::Split::Train)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(b.list_photos(None, 10).unwrap()[0].id, 2);
    assert!(matches!(
        b.upsert_photo(&photo(1, None)),
        Err(CatalogError::Conflict { what }) if what.contains("ps-a")
    ));
    assert!(!b.delete_photo(1).unwrap());
    assert!(matches!(
        b.set_ground_truth(1, &GroundTruth::new("x", ndpipe_catalog::Split::Train)),
        Err(CatalogError::NotFound { .. })
    ));
    assert!(matches!(
        b.put_predictions(1, "v", &[p("x", 0.1)]),
        Err(CatalogError::NotFound { .. })
    ));
    let rows = [(1, vec![p("dog", 0.9)]), (2, vec![p("dog", 0.8)])];
    assert_eq!(b.put_predictions_many("v", &rows).unwrap(), 1);
    a.put_predictions(1, "v", &[p("dog, doggy", 0.7)]).unwrap();
    assert_eq!(a.unlabelled("v").unwrap(), Vec::<u64>::new());
    assert!(b.predictions(1).unwrap().is_empty());
    assert_eq!(b.search("dog", "v", 0, 10).unwrap().len(), 1);
    let now = ndpipe_util::time::now_ms();
    a.register_node("ps-a", "http://a", None, now + 60_000, now)
        .unwrap();
    b.register_node("ps-b", "http://b", None, now - 1, now - 10_000)
        .unwrap();
    let cluster: Vec<(String, u64, bool)> = a
        .search_cluster("dog", "v", 0, 10)
        .unwrap()
        .into_iter()
        .map(|h| {
            let node = h.node.expect("a shared catalog names the node");
            (node, h.hit.id, h.available)
        })
        .collect();
    assert_eq!(
        cluster,
        [
            ("ps-b".to_string(), 2, false),
            ("ps-a".to_string(), 1, true)
        ],
        "ps-b's lease ran out"
    );

    let job = |status: &str| JobRecord {
        id: "relabel-1".into(),
        kind: "relabel".into(),
        status: status.into(),
        state: serde_json::json!(null),
        created_ms: 1,
        updated_ms: 1,
    };
    a.put_job(&job("running")).unwrap();
    b.put_job(&job("done")).unwrap();
    assert_eq!(a.jobs().unwrap(), vec![job("running")]);
    assert_eq!(b.jobs().unwrap(), vec![job("done")]);

    a.register_model(&model("m")).unwrap();
    b.set_active_model("m").unwrap();
    assert_eq!(
        b.active_model(&TaskName::default_task())
            .unwrap()
            .unwrap()
            .metrics,
        model("m").metrics
    );
    assert_eq!(
        a.active_model(&TaskName::default_task()).unwrap(),
        None,
        "b's active version is b's own"
    );
    assert_eq!(
        a.models().unwrap().len(),
        1,
        "the versions are the cluster's"
    );
    a.set_active_model("m").unwrap();
    a.register_model(&ModelVersion {
        active: true,
        ..model("m2")
    })
    .unwrap();
    assert_eq!(
        a.active_model(&TaskName::default_task())
            .unwrap()
            .unwrap()
            .id,
        "m2"
    );
    assert_eq!(
        b.active_model(&TaskName::default_task())
            .unwrap()
            .unwrap()
            .id,
        "m"
    );
}

#[test]
fn photo_id_blocks_never_overlap_and_skip_stored_ids() {
    let Some(db) = support::database("id_blocks") else {
        return;
    };
    let legacy = node(&db.url, "legacy");
    legacy.upsert_photo(&photo(5_000, None)).unwrap();
    let nodes: Vec<PgCatalog> = (0..4).map(|i| node(&db.url, &format!("ps-{i}"))).collect();
    let mut blocks: Vec<(String, std::ops::Range<u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let c = nodes[(t % 4) as usize].clone();
                s.spawn(move || {
                    (1..=10)
                        .map(|i| {
                            (
                                c.node().to_string(),
                                c.reserve_photo_ids(t * 10 + i).unwrap(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    blocks.sort_by_key(|(_, r)| r.start);
    assert!(blocks[0].1.start > 5_000, "above every stored id");
    for pair in blocks.windows(2) {
        assert!(pair[0].1.end <= pair[1].1.start, "{pair:?} overlap");
    }
    let sizes: u64 = blocks.iter().map(|(_, r)| r.end - r.start).sum();
    assert_eq!(sizes, (1..=80).sum::<u64>());
    for c in &nodes {
        let mine: Vec<_> = blocks
            .iter()
            .filter(|(n, _)| n == c.node())
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(c.photo_id_blocks().unwrap(), mine);
    }
    let ids: HashSet<u64> = blocks.iter().flat_map(|(_, r)| r.clone()).collect();
    assert_eq!(ids.len() as u64, sizes);
}

#[test]
fn search_treats_wildcards_and_backslashes_literally() {
    let Some(db) = support::database("search_literal") else {
        return;
    };
    let c = PgCatalog::connect(&db.url).unwrap();
    let labels = [
        "100% cotton",
        "snake_case, snake",
        "back\\slash, x",
        "plain, word",
    ];
    for (i, label) in labels.iter().enumerate() {
        let id = i as u64 + 1;
        c.upsert_photo(&photo(id, None)).unwrap();
        c.put_predictions(id, "v", &[p(label, 0.5)]).unwrap();
    }
    let hits = |q: &str| -> Vec<u64> {
        c.search(q, "v", 0, 10)
            .unwrap()
            .iter()
            .map(|h| h.id)
            .collect()
    };
    assert_eq!(hits("100% cotton"), [1]);
    assert_eq!(hits("100_ cotton"), Vec::<u64>::new());
    assert_eq!(hits("%"), Vec::<u64>::new());
    assert_eq!(hits("_"), Vec::<u64>::new());
    assert_eq!(hits("snake_case"), [2]);
    assert_eq!(hits("snake%case"), Vec::<u64>::new());
    assert_eq!(hits("snake_cas_"), Vec::<u64>::new());
    assert_eq!(hits("back\\slash"), [3]);
    assert_eq!(hits("pl%"), Vec::<u64>::new());
}

/// Search agrees with SQLite's on case, class-name boundaries, wildcards and non-ASCII text.
#[test]
fn search_agrees_with_sqlite() {
    let Some(db) = support::database("search_sqlite") else {
        return;
    };
    let pg = PgCatalog::connect(&db.url).unwrap();
    let lite = SqliteCatalog::in_memory().unwrap();
    let labels = [
        "tabby, tabby cat",
        "German shepherd, German shepherd dog, Alsatian",
        "Egyptian cat",
        "éclair, Éclair au chocolat",
        "comma,without space",
        "trailing, ",
        "tiger cat",
    ];
    for c in [&pg as &dyn PhotoCatalog, &lite] {
        for (i, label) in labels.iter().enumerate() {
            let id = i as u64 + 1;
            c.upsert_photo(&photo(id, None)).unwrap();
            c.put_predictions(id, "v", &[p(label, 0.9 - i as f32 / 10.0)])
                .unwrap();
        }
    }
    let queries = [
        "tabby",
        "Tabby",
        "TABBY CAT",
        "tabby cat",
        "cat",
        "german shepherd",
        "GERMAN SHEPHERD DOG",
        "alsatian",
        "Egyptian cat",
        "egyptian cat",
        "éclair",
        "Éclair",
        "éclair au chocolat",
        "ÉCLAIR AU CHOCOLAT",
        "comma",
        "without space",
        "",
        " ",
        "trailing",
        "tiger",
        "shepherd",
        "%",
        "_",
        "tab%",
        "t_bby",
    ];
    for q in queries {
        let ids = |c: &dyn PhotoCatalog| -> Vec<(u64, u32)> {
            c.search(q, "v", 0, 100)
                .unwrap()
                .iter()
                .map(|h| (h.id, h.rank))
                .collect()
        };
        assert_eq!(ids(&pg), ids(&lite), "query {q:?}");
    }
}

/// The Tuner calls its registry from async handlers; `postgres` must not panic there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_called_from_an_async_task_do_not_panic() {
    use tokio::task::spawn_blocking as blocking;
    let Some(db) = blocking(|| support::database("async")).await.unwrap() else {
        return;
    };
    let c = PgCatalog::connect(&db.url).unwrap();
    c.register_model(&model("m")).unwrap();
    assert_eq!(c.models().unwrap().len(), 1);
    blocking(move || drop((c, db))).await.unwrap();
}

#[test]
fn open_picks_postgres_for_postgres_urls() {
    let Some(db) = support::database("open") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().join("catalog.sqlite");
    let opened = ndpipe_catalog::open(&db.url, "ps-9", &default).unwrap();
    assert!(!default.exists(), "no SQLite file for a PostgreSQL URL");
    let ids = opened.photo_ids.expect("PostgreSQL hands out photo ids");
    let block = ids.reserve_photo_ids(10).unwrap();
    opened
        .catalog
        .upsert_photo(&photo(block.start, None))
        .unwrap();
    assert_eq!(node(&db.url, "ps-9").count_photos().unwrap(), 1);
    assert!(opened.nodes.nodes().unwrap().is_empty());
    let postgresql = db.url.replacen("postgres://", "postgresql://", 1);
    assert!(ndpipe_catalog::open(&postgresql, "ps-9", &default).is_ok());
}
