//! The replica map on a real PostgreSQL server: copies recorded per node, counted only on
//! registered nodes, a removed node's photos passed to their other holder (or lost), tombstones
//! that remove the row for every node, and free space for placement.

use ndpipe_catalog::test_postgres as support;
use ndpipe_catalog::test_suite::photo;
use ndpipe_catalog::{
    NodeRegistry, PgCatalog, PgOptions, PhotoCatalog, Prediction, ReplicaCatalog,
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
}
