//! The replica map on a real PostgreSQL server: copies recorded per node, counted only on
//! registered nodes, a removed node's photos passed to their other holder (or lost), tombstones
//! that remove the row for every node, free space for placement, and the copies of plain
//! objects' files.

use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::photo;
use std::collections::BTreeMap;

use ndpipe_catalog::{
    BlobCatalog, Bucket, ModelRegistry, ModelVersion, NodeRegistry, ObjectAttributes, ObjectBody,
    ObjectCatalog, ObjectRecord, PgCatalog, PgOptions, PhotoCatalog, Prediction, PutCondition,
    ReplicaCatalog, TaskName,
};

fn node(url: &str, name: &str) -> PgCatalog {
    let options = PgOptions {
        node: name.into(),
        ..PgOptions::default()
    };
    PgCatalog::connect_with(url, &options).unwrap()
}

fn register(catalog: &PgCatalog, name: &str) {
    catalog
        .register_node(name, &format!("http://{name}"), None, i64::MAX, 0)
        .unwrap();
}

#[test]
fn copies_are_counted_on_registered_nodes_and_survive_a_removal() {
    let Some(db) = support::database("replicas") else {
        return;
    };
    let (a, b, c) = (node(&db.url, "a"), node(&db.url, "b"), node(&db.url, "c"));
    for (handle, name) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        register(handle, name);
    }
    // Photo 1 on a and b, photo 2 on a only, photo 3 on b and c.
    a.upsert_photo(&photo(1, None)).unwrap();
    a.upsert_photo(&photo(2, None)).unwrap();
    b.upsert_photo(&photo(3, None)).unwrap();
    b.add_copy(1, "b").unwrap();
    c.add_copy(3, "c").unwrap();
    b.add_copy(3, "c").unwrap(); // recording twice is one copy

    let one = a.copies(1).unwrap().unwrap();
    assert_eq!(
        (one.primary.as_str(), one.holders.clone()),
        ("a", vec!["a".to_string(), "b".to_string()])
    );
    assert_eq!(b.held_here().unwrap(), [1, 3]);
    let many: Vec<(u64, usize)> = c
        .copies_many(&[3, 9, 1])
        .unwrap()
        .iter()
        .map(|p| (p.id, p.holders.len()))
        .collect();
    assert_eq!(many, [(1, 2), (3, 2)], "in id order, photo 9 has no row");
    // Any node reads the labels of any photo; its own view holds only its own photos'.
    let cat = vec![Prediction {
        label: "cat".into(),
        score: 0.75,
    }];
    a.put_predictions_many("v1", &[(1, cat.clone())]).unwrap();
    assert_eq!(c.cluster_predictions(1).unwrap(), [("v1".to_string(), cat)]);
    assert!(c.predictions(1).unwrap().is_empty(), "photo 1 is a's");
    assert!(c.cluster_predictions(9).unwrap().is_empty());
    let short: Vec<u64> = a
        .under_replicated(2, 10)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(short, [2], "photo 2 has one copy; photo 3 is b's");
    let counts = c.replication_counts(2).unwrap();
    assert_eq!(
        (counts.at_target, counts.under_replicated, counts.lost),
        (2, 1, 0)
    );
    let listed: Vec<(u64, String)> = c
        .list_cluster(Some(1), 10)
        .unwrap()
        .into_iter()
        .map(|p| (p.id, p.primary))
        .collect();
    assert_eq!(
        listed,
        [(2, "a".to_string()), (3, "b".to_string())],
        "every node's, after 1"
    );

    // Rebalancing walks a's own photos, and hands one over only to a holder.
    let mine: Vec<u64> = a
        .primaries_after(Some(1), 10)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(mine, [2], "a's photos after 1");
    assert!(!a.hand_over(2, "b").unwrap(), "b holds no copy of photo 2");
    assert!(
        !b.hand_over(1, "b").unwrap(),
        "photo 1 is not b's to hand over"
    );
    assert!(a.hand_over(1, "b").unwrap());
    assert_eq!(a.copies(1).unwrap().unwrap().primary, "b");
    assert!(b.hand_over(1, "a").unwrap());

    // a is removed: photo 1 passes to b, photo 2 (a's alone) is lost.
    assert!(a.remove_node("a").unwrap());
    let one = b.copies(1).unwrap().unwrap();
    assert_eq!(
        (one.primary.as_str(), one.holders.clone()),
        ("b", vec!["b".to_string()])
    );
    assert_eq!(
        b.photo(1).unwrap().unwrap().id,
        1,
        "b's view now has photo 1"
    );
    let counts = c.replication_counts(2).unwrap();
    assert_eq!(
        (counts.at_target, counts.under_replicated, counts.lost),
        (1, 1, 1)
    );
    let short: Vec<u64> = b
        .under_replicated(2, 10)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(short, [1]);

    // c stops answering: photo 3 (b's) stays; c's own photo 4, copied to b, moves to b;
    // photo 5, c's alone, is stranded.
    c.upsert_photo(&photo(4, None)).unwrap();
    c.upsert_photo(&photo(5, None)).unwrap();
    b.add_copy(4, "b").unwrap();
    let failed = b.fail_over("c").unwrap();
    assert_eq!(
        (failed.moved, failed.stranded.clone(), failed.stranded_total),
        (1, vec![5], 1)
    );
    assert_eq!(b.copies(4).unwrap().unwrap().primary, "b");
    assert_eq!(
        b.copies(4).unwrap().unwrap().holders,
        ["b", "c"],
        "c's copy is kept"
    );

    // A tombstone removes the row whichever node's it is, for good.
    c.add_tombstone(3).unwrap();
    assert!(b.copies(3).unwrap().is_none());
    assert!(b.photo(3).unwrap().is_none());
    assert_eq!(a.tombstoned(&[1, 3, 9]).unwrap(), [3]);
    let recent: Vec<u64> = a.tombstones_since(0).unwrap().iter().map(|t| t.0).collect();
    assert_eq!(recent, [3]);
    assert!(a.tombstones_since(i64::MAX).unwrap().is_empty());
    assert_eq!(c.replication_counts(2).unwrap().tombstones, 1);
}

#[test]
fn placement_sees_leases_states_and_reported_space() {
    let Some(db) = support::database("placement") else {
        return;
    };
    let (a, b) = (node(&db.url, "a"), node(&db.url, "b"));
    register(&a, "a");
    b.register_node("b", "http://b", None, 0, 0).unwrap(); // its lease ran out long ago
    a.report_free_space(5 << 30).unwrap();
    let nodes = b.placement_nodes().unwrap();
    let (na, nb) = (&nodes[0], &nodes[1]);
    assert_eq!(
        (na.name.as_str(), na.live, na.active, na.free_bytes),
        ("a", true, true, Some(5 << 30))
    );
    assert_eq!(
        (nb.name.as_str(), nb.live, nb.free_bytes),
        ("b", false, None)
    );
    a.report_free_space(0).unwrap();
    assert_eq!(b.placement_nodes().unwrap()[0].free_bytes, Some(0));
    // The status page's view: each node's last heartbeat and the photos it holds.
    b.add_copy(7, "b").unwrap();
    b.add_copy(8, "b").unwrap();
    a.add_copy(8, "a").unwrap();
    b.register_node("b", "http://b", None, 0, 1234).unwrap();
    let overview = a.node_overview().unwrap();
    let seen: Vec<_> = (overview.iter())
        .map(|o| (o.name.as_str(), o.last_seen_ms, o.photos))
        .collect();
    assert_eq!(seen, [("a", 0, 1), ("b", 1234, 2)]);
}

fn blob_object(key: &str, blob: &str) -> ObjectRecord {
    ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        body: ObjectBody::Blob(blob.into()),
        bytes: 3,
        etag: "e".into(),
        sha256: format!("{blob:0>64}"),
        content_type: "text/plain".into(),
        modified_ms: 0,
        metadata: BTreeMap::new(),
        attributes: ObjectAttributes::default(),
        tags: BTreeMap::new(),
    }
}

#[test]
fn plain_objects_copies_are_counted_repaired_by_one_node_and_forgotten_with_it() {
    let Some(db) = support::database("blob_copies") else {
        return;
    };
    let (a, b, c) = (node(&db.url, "a"), node(&db.url, "b"), node(&db.url, "c"));
    for (handle, name) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        register(handle, name);
    }
    a.create_bucket(&Bucket {
        name: "b".into(),
        created_ms: 0,
    })
    .unwrap();
    // x on b and c; y on c only; z held by a but named by no object (a failed upload).
    b.add_blob_copy("x").unwrap();
    c.add_blob_copy("x").unwrap();
    assert!(
        !c.add_blob_copy("x").unwrap(),
        "recording twice is one copy"
    );
    c.add_blob_copy("y").unwrap();
    a.add_blob_copy("z").unwrap();
    a.put_object(&blob_object("x.json", "x"), &PutCondition::Always)
        .unwrap();
    a.put_object(&blob_object("y.json", "y"), &PutCondition::Always)
        .unwrap();
    assert_eq!(a.blob_holders("x").unwrap(), ["b", "c"]);
    assert!(a.blob_holders("nothing").unwrap().is_empty());
    let names = ["x", "y", "z"].map(String::from);
    assert_eq!(a.referenced_blobs(&names).unwrap(), ["x", "y"]);

    // Only y is short of two copies, and c, its one live holder, repairs it.
    let short = |n: &PgCatalog| -> Vec<(String, Vec<String>)> {
        n.under_replicated_blobs(2, 10)
            .unwrap()
            .into_iter()
            .map(|h| (h.name, h.holders))
            .collect()
    };
    assert_eq!(short(&c), [("y".to_string(), vec!["c".to_string()])]);
    assert_eq!(
        c.under_replicated_blobs(2, 10).unwrap()[0].sha256,
        format!("{:0>64}", "y")
    );
    assert!(short(&a).is_empty() && short(&b).is_empty());
    let counts = a.blob_counts(2).unwrap();
    assert_eq!(
        (counts.at_target, counts.under_replicated, counts.lost),
        (1, 1, 0),
        "z is named by no object"
    );

    // c walks its files a page at a time; a holds z, which no object names.
    let walk = |n: &PgCatalog, after: Option<&str>| -> Vec<(String, Vec<String>)> {
        n.held_blobs_after(after, 1)
            .unwrap()
            .into_iter()
            .map(|h| (h.name, h.holders))
            .collect()
    };
    assert_eq!(
        walk(&c, None),
        [("x".to_string(), vec!["b".to_string(), "c".to_string()])]
    );
    assert_eq!(
        walk(&c, Some("x")),
        [("y".to_string(), vec!["c".to_string()])]
    );
    assert!(walk(&c, Some("y")).is_empty());
    assert!(walk(&a, None).is_empty());

    // b's lease runs out: c, the lowest live holder of x, repairs x too once c is removed...
    b.register_node("b", "http://b", None, 0, 0).unwrap();
    assert!(c.remove_node("c").unwrap());
    assert_eq!(
        a.blob_holders("x").unwrap(),
        ["b"],
        "c's copies are forgotten"
    );
    assert!(short(&b).is_empty(), "b is not live: no node repairs x yet");
    b.register_node("b", "http://b", None, i64::MAX, 0).unwrap();
    assert_eq!(short(&b), [("x".to_string(), vec!["b".to_string()])]);
    b.drop_blob_copy("x").unwrap();
    assert!(a.blob_holders("x").unwrap().is_empty());
    assert_eq!(
        a.blob_counts(2).unwrap().lost,
        2,
        "y went with c, x with b's copy"
    );
}

#[test]
fn any_node_reads_a_photo_s_labels_under_its_primary_s_active_model() {
    let Some(db) = support::database("active_labels") else {
        return;
    };
    let (a, b) = (node(&db.url, "a"), node(&db.url, "b"));
    for v in ["v1", "v2"] {
        a.register_model(&ModelVersion {
            task: TaskName::default_task(),
            id: v.into(),
            backbone: "b".repeat(64),
            parent: None,
            metrics: serde_json::json!({}),
            created_ms: 0,
            active: false,
        })
        .unwrap();
    }
    a.upsert_photo(&photo(1, None)).unwrap();
    let label = |l: &str| Prediction {
        label: l.into(),
        score: 0.5,
    };
    a.put_predictions_many("v1", &[(1, vec![label("cat")])])
        .unwrap();
    a.put_predictions_many("v2", &[(1, vec![label("dog"), label("fox")])])
        .unwrap();
    assert!(
        b.cluster_active_predictions(1).unwrap().is_empty(),
        "a has no active model yet"
    );
    a.set_active_model("v1").unwrap();
    b.set_active_model("v2").unwrap();
    let default = TaskName::default_task;
    assert_eq!(
        b.cluster_active_predictions(1).unwrap(),
        [(default(), vec![label("cat")])]
    );
    a.set_active_model("v2").unwrap();
    assert_eq!(
        b.cluster_active_predictions(1).unwrap(),
        [(default(), vec![label("dog"), label("fox")])]
    );
    assert!(b.cluster_active_predictions(9).unwrap().is_empty());
}
