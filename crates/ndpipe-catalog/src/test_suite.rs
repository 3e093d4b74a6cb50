//! Behaviour every [`Catalog`] implementation must show, run by each implementation's tests
//! ([`run`]), and every [`NodeRegistry`] ([`run_nodes`]).

mod conditions;
mod duplicates;
mod objects;
mod search;
mod tasks;

pub use conditions::racing_writers_of_one_key_have_one_winner;
pub use search::{INDEX_LABELS, index_label_answers, store_index_labels};

use crate::{
    AccessKeyRecord, Bucket, Catalog, CatalogError, GroundTruth, JobRecord, ModelVersion,
    NodeRegistry, NodeState, ObjectBody, ObjectRecord, PhotoMeta, PhotoRecord, Prediction,
    PutCondition, Role, Split, TaskName, TaskTruth,
};

/// A photo record with predictable fields (the default task's ground truth), for tests.
pub fn photo(id: u64, truth: Option<(&str, Split)>) -> PhotoRecord {
    PhotoRecord::new(
        id,
        PhotoMeta {
            sha256: format!("{id:064x}"),
            bytes: 100 + id,
            width: 640,
            height: 480,
            content_type: "image/jpeg".into(),
            created_ms: 1_700_000_000_000 + id.cast_signed(),
            ground_truth: truth.map(|(label, split)| GroundTruth::new(label, split)),
        },
    )
}

/// `photo` as the catalog reads it back: its ground truth listed per task too.
fn read_back(id: u64, truth: Option<(&str, Split)>) -> PhotoRecord {
    let mut p = photo(id, truth);
    p.ground_truths = p.meta.ground_truth.iter().cloned().collect();
    p
}

fn model(id: &str, active: bool, created_ms: i64) -> ModelVersion {
    ModelVersion {
        task: TaskName::default_task(),
        id: id.into(),
        backbone: "b".repeat(64),
        parent: None,
        metrics: serde_json::json!({"top1": 0.5}),
        created_ms,
        active,
    }
}

/// Runs the whole suite against an empty catalog; panics on the first deviation.
pub fn run(c: &dyn Catalog) {
    photos_round_trip_and_page(c);
    existing_photo_ids_answer_a_batch(c);
    ground_truth_updates(c);
    predictions_replace_per_version(c);
    models_have_one_active(c);
    tasks::run(c);
    search::run(c);
    duplicates::run(c);
    jobs_round_trip(c);
    buckets_create_list_and_delete_only_when_empty(c);
    objects_replace_list_by_prefix_and_follow_their_photo(c);
    objects::run(c);
    access_keys_are_unique_by_name_id_and_secret(c);
    conditions::run(c);
}

fn jobs_round_trip(c: &dyn Catalog) {
    let mut job = JobRecord {
        id: "j1".into(),
        kind: "relabel".into(),
        status: "running".into(),
        state: serde_json::json!({"done": 1}),
        created_ms: 5,
        updated_ms: 5,
    };
    c.put_job(&job).unwrap();
    job.status = "done".into();
    job.state = serde_json::json!({"done": 9});
    job.updated_ms = 6;
    c.put_job(&job).unwrap();
    assert_eq!(c.jobs().unwrap(), vec![job]);
}

fn photos_round_trip_and_page(c: &dyn Catalog) {
    for id in 1..=5 {
        c.upsert_photo(&photo(id, (id % 2 == 0).then_some(("dog", Split::Train))))
            .unwrap();
    }
    assert_eq!(c.count_photos().unwrap(), 5);
    let default = TaskName::default_task();
    assert_eq!(
        c.labelled(&default, Split::Train).unwrap(),
        vec![(2, "dog".to_string()), (4, "dog".to_string())]
    );
    assert!(c.labelled(&default, Split::Val).unwrap().is_empty());
    c.set_ground_truth(5, &GroundTruth::new("cat", Split::Test))
        .unwrap();
    let truth = |id: u64, label: &str, split| TaskTruth {
        id,
        label: label.into(),
        split,
        sha256: format!("{id:064x}"),
    };
    assert_eq!(
        c.ground_truths(&default).unwrap(),
        vec![
            truth(2, "dog", Split::Train),
            truth(4, "dog", Split::Train),
            truth(5, "cat", Split::Test)
        ]
    );
    assert!(c.clear_ground_truth(5, &default).unwrap());
    assert!(!c.clear_ground_truth(5, &default).unwrap());
    assert_eq!(
        c.photo(2).unwrap().unwrap(),
        read_back(2, Some(("dog", Split::Train)))
    );
    assert_eq!(c.photo(3).unwrap().unwrap().meta.ground_truth, None);
    let page: Vec<u64> = c
        .list_photos(Some(2), 2)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(page, vec![3, 4]);
    assert!(c.delete_photo(3).unwrap());
    assert!(!c.delete_photo(3).unwrap());
    assert_eq!(c.photo(3).unwrap(), None);
    let all: Vec<u64> = c
        .list_photos(None, 100)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(all, vec![1, 2, 4, 5]);
}

/// After [`photos_round_trip_and_page`]: photos 1, 2, 4 and 5 exist, 3 was deleted.
fn existing_photo_ids_answer_a_batch(c: &dyn Catalog) {
    let found = |ids: &[u64]| {
        let mut found: Vec<u64> = c.existing_photo_ids(ids).unwrap().into_iter().collect();
        found.sort_unstable();
        found
    };
    assert_eq!(found(&[]), Vec::<u64>::new());
    assert_eq!(
        found(&[3, 99, 1 << 40]),
        Vec::<u64>::new(),
        "deleted or never stored"
    );
    assert_eq!(found(&[5, 3, 1, 99, 5]), vec![1, 5]);
    let many: Vec<u64> = (1..=5000).rev().collect();
    assert_eq!(found(&many), vec![1, 2, 4, 5]);
}

fn ground_truth_updates(c: &dyn Catalog) {
    let truth = GroundTruth::new("cat", Split::Test);
    c.set_ground_truth(1, &truth).unwrap();
    assert_eq!(c.photo(1).unwrap().unwrap().meta.ground_truth, Some(truth));
    assert!(c.clear_ground_truth(1, &TaskName::default_task()).unwrap());
    assert_eq!(c.photo(1).unwrap().unwrap().meta.ground_truth, None);
    assert!(matches!(
        c.set_ground_truth(999, &GroundTruth::new("cat", Split::Test)),
        Err(CatalogError::NotFound { .. })
    ));
    let unknown = GroundTruth {
        task: "no-such-task".parse().unwrap(),
        ..GroundTruth::new("cat", Split::Test)
    };
    assert!(
        matches!(c.set_ground_truth(1, &unknown), Err(CatalogError::NotFound { what }) if what.contains("task")),
        "a label of an unknown task is refused"
    );
}

fn predictions_replace_per_version(c: &dyn Catalog) {
    let p = |label: &str, score| Prediction {
        label: label.into(),
        score,
    };
    c.put_predictions(2, "v1", &[p("tabby", 0.7), p("tiger cat", 0.2)])
        .unwrap();
    c.put_predictions(2, "v2", &[p("tiger cat", 0.9)]).unwrap();
    c.put_predictions(2, "v1", &[p("lynx", 0.6)]).unwrap();
    let got = c.predictions(2).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], ("v1".to_string(), vec![p("lynx", 0.6)]));
    assert_eq!(got[1], ("v2".to_string(), vec![p("tiger cat", 0.9)]));
    assert!(c.put_predictions(999, "v1", &[p("x", 0.1)]).is_err());
    let many = vec![
        (1, vec![p("a", 0.5)]),
        (999, vec![p("b", 0.5)]),
        (2, vec![p("c", 0.4)]),
    ];
    assert_eq!(
        c.put_predictions_many("v3", &many).unwrap(),
        2,
        "missing photos are skipped"
    );
    assert_eq!(
        c.predictions(1).unwrap(),
        vec![("v3".to_string(), vec![p("a", 0.5)])]
    );
    assert!(c.delete_photo(2).unwrap());
    assert!(c.predictions(2).unwrap().is_empty());
}

fn models_have_one_active(c: &dyn Catalog) {
    c.register_model(&model("m1", true, 1)).unwrap();
    c.register_model(&model("m2", false, 2)).unwrap();
    assert!(matches!(
        c.register_model(&model("m1", false, 3)),
        Err(CatalogError::Conflict { .. })
    ));
    c.set_active_model("m2").unwrap();
    let active: Vec<String> = c
        .models()
        .unwrap()
        .into_iter()
        .filter(|m| m.active)
        .map(|m| m.id)
        .collect();
    assert_eq!(active, vec!["m2".to_string()]);
    assert_eq!(
        c.active_model(&TaskName::default_task())
            .unwrap()
            .map(|m| m.id),
        Some("m2".into())
    );
    assert_eq!(c.model("m1").unwrap().map(|m| m.created_ms), Some(1));
    assert_eq!(c.model("nope").unwrap(), None);
    assert!(matches!(
        c.set_active_model("nope"),
        Err(CatalogError::NotFound { .. })
    ));
    assert_eq!(c.models().unwrap().iter().filter(|m| m.active).count(), 1);
}

/// Runs the node registry's suite against an empty registry; panics on the first deviation.
pub fn run_nodes(c: &dyn NodeRegistry) {
    let a = c
        .register_node("ps-a", "http://a:1", None, 1_000, 100)
        .unwrap();
    let b = c
        .register_node("ps-b", "http://b:1", Some("v1"), 2_000, 200)
        .unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(
        (a.state, a.lease_expires_ms, a.version.as_deref()),
        (NodeState::Active, 1_000, None)
    );
    assert_eq!((a.registered_ms, a.last_seen_ms), (100, 100));

    // The same name keeps its id, state and registration time; url, version and lease change.
    c.set_node_state("ps-a", NodeState::Draining).unwrap();
    let again = c
        .register_node("ps-a", "http://a:2", Some("v1"), 3_000, 300)
        .unwrap();
    assert_eq!(
        (again.id, again.state, again.registered_ms),
        (a.id, NodeState::Draining, 100)
    );
    assert_eq!(
        (
            again.url.as_str(),
            again.version.as_deref(),
            again.lease_expires_ms
        ),
        ("http://a:2", Some("v1"), 3_000)
    );
    assert_eq!(again.last_seen_ms, 300);

    let renewed = c
        .renew_node_lease(b.id, "ps-b", Some("v2"), 4_000, 400)
        .unwrap();
    assert_eq!(
        (
            renewed.lease_expires_ms,
            renewed.last_seen_ms,
            renewed.version.as_deref()
        ),
        (4_000, 400, Some("v2"))
    );
    assert!(
        matches!(
            c.renew_node_lease(b.id, "ps-a", None, 1, 1),
            Err(CatalogError::NotFound { .. })
        ),
        "the id must be registered under that name"
    );
    c.set_node_version(b.id, "v3").unwrap();
    assert!(matches!(
        c.set_node_version(9_999, "v3"),
        Err(CatalogError::NotFound { .. })
    ));
    let state = c.set_node_state("ps-a", NodeState::Active).unwrap();
    assert_eq!(state.state, NodeState::Active);
    assert!(matches!(
        c.set_node_state("nope", NodeState::Draining),
        Err(CatalogError::NotFound { .. })
    ));

    let listed = c.nodes().unwrap();
    let names: Vec<(&str, Option<&str>)> = listed
        .iter()
        .map(|n| (n.name.as_str(), n.version.as_deref()))
        .collect();
    assert_eq!(names, [("ps-a", Some("v1")), ("ps-b", Some("v3"))]);
    assert!(listed[0].id < listed[1].id, "id order");

    // A removed node is forgotten: its lease cannot be renewed, and it comes back as new.
    assert!(c.remove_node("ps-b").unwrap());
    assert!(!c.remove_node("ps-b").unwrap());
    assert!(matches!(
        c.renew_node_lease(b.id, "ps-b", None, 5_000, 500),
        Err(CatalogError::NotFound { .. })
    ));
    let back = c
        .register_node("ps-b", "http://b:1", None, 6_000, 600)
        .unwrap();
    assert!(back.id > b.id, "ids are never reused");
    assert_eq!(back.registered_ms, 600);
    assert_eq!(c.nodes().unwrap().len(), 2);
}

/// An object of `bucket` named `key`: a photo when `photo` is given, else a blob.
pub fn object(bucket: &str, key: &str, photo: Option<u64>) -> ObjectRecord {
    ObjectRecord {
        bucket: bucket.into(),
        key: key.into(),
        body: match photo {
            Some(id) => ObjectBody::Photo(id),
            None => ObjectBody::Blob(format!("blob-{key}")),
        },
        bytes: 42,
        etag: "0".repeat(32),
        sha256: "1".repeat(64),
        content_type: "application/json".into(),
        modified_ms: 1_700_000_000_000,
        metadata: [("mtime".to_string(), "12".to_string())].into(),
        attributes: crate::ObjectAttributes::default(),
        tags: std::collections::BTreeMap::new(),
    }
}

fn buckets_create_list_and_delete_only_when_empty(c: &dyn Catalog) {
    let b = |name: &str| Bucket {
        name: name.into(),
        created_ms: 7,
    };
    c.create_bucket(&b("zeta")).unwrap();
    c.create_bucket(&b("alpha")).unwrap();
    assert!(matches!(
        c.create_bucket(&b("alpha")),
        Err(CatalogError::Conflict { .. })
    ));
    let names: Vec<String> = c.buckets().unwrap().into_iter().map(|b| b.name).collect();
    assert_eq!(names, vec!["alpha", "zeta"]);
    assert_eq!(c.bucket("zeta").unwrap(), Some(b("zeta")));
    assert_eq!(c.bucket("nope").unwrap(), None);
    assert!(matches!(
        c.put_object(&object("nope", "k", None), &PutCondition::Always),
        Err(CatalogError::NotFound { .. })
    ));
    c.put_object(&object("zeta", "k", None), &PutCondition::Always)
        .unwrap();
    assert!(matches!(
        c.delete_bucket("zeta"),
        Err(CatalogError::NotEmpty { .. })
    ));
    assert!(c.delete_object("zeta", "k").unwrap().is_some());
    assert!(c.delete_object("zeta", "k").unwrap().is_none());
    c.delete_bucket("zeta").unwrap();
    assert!(matches!(
        c.delete_bucket("zeta"),
        Err(CatalogError::NotFound { .. })
    ));
}

fn objects_replace_list_by_prefix_and_follow_their_photo(c: &dyn Catalog) {
    c.upsert_photo(&photo(30, None)).unwrap();
    c.upsert_photo(&photo(31, None)).unwrap();
    assert_eq!(
        c.put_object(&object("alpha", "a/1.jpg", Some(30)), &PutCondition::Always)
            .unwrap(),
        None
    );
    let replaced = c
        .put_object(&object("alpha", "a/1.jpg", Some(31)), &PutCondition::Always)
        .unwrap()
        .expect("the first object is returned when replaced");
    assert_eq!(replaced.photo_id(), Some(30));
    assert_eq!(
        c.object_of_photo(31).unwrap().map(|o| o.key),
        Some("a/1.jpg".into())
    );
    assert_eq!(c.object_of_photo(30).unwrap(), None);
    for key in ["a/2.xmp", "a/b/3.json", "b/4.json", "a", "a0", "\u{e9}"] {
        c.put_object(&object("alpha", key, None), &PutCondition::Always)
            .unwrap();
    }
    let keys = |prefix: &str, after: Option<&str>, limit: usize| -> Vec<String> {
        c.list_objects("alpha", prefix, after, limit)
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    };
    assert_eq!(
        keys("a/", None, 100),
        vec!["a/1.jpg", "a/2.xmp", "a/b/3.json"]
    );
    assert_eq!(keys("a/", Some("a/1.jpg"), 1), vec!["a/2.xmp"]);
    assert_eq!(keys("", Some("a0"), 100), vec!["b/4.json", "\u{e9}"]);
    assert_eq!(keys("", None, 2), vec!["a", "a/1.jpg"]);
    assert!(keys("c", None, 10).is_empty());
    assert_eq!(
        c.object("alpha", "a/2.xmp").unwrap(),
        Some(object("alpha", "a/2.xmp", None))
    );
    c.delete_photo(31).unwrap();
    assert_eq!(
        c.object("alpha", "a/1.jpg").unwrap(),
        None,
        "deleting a photo deletes its object"
    );
}

fn access_keys_are_unique_by_name_id_and_secret(c: &dyn Catalog) {
    let key = |id: &str, name: &str, role| AccessKeyRecord {
        access_key: id.into(),
        name: name.into(),
        role,
        secret_sha256: format!("{id:0>64}"),
        sealed_secret: vec![0, 1, 2, 255],
        created_ms: 9,
    };
    assert_eq!(c.count_keys().unwrap(), 0);
    c.create_key(&key("AK2", "uploader", Role::Write)).unwrap();
    c.create_key(&key("AK1", "reader", Role::Read)).unwrap();
    for dup in [
        key("AK3", "reader", Role::Admin),
        key("AK1", "other", Role::Admin),
    ] {
        assert!(matches!(
            c.create_key(&dup),
            Err(CatalogError::Conflict { .. })
        ));
    }
    assert_eq!(c.count_keys().unwrap(), 2);
    assert_eq!(
        c.key("AK2").unwrap(),
        Some(key("AK2", "uploader", Role::Write))
    );
    assert_eq!(
        c.key_by_secret(&format!("{:0>64}", "AK1"))
            .unwrap()
            .map(|k| k.name),
        Some("reader".into())
    );
    assert_eq!(c.key("nope").unwrap(), None);
    let names: Vec<String> = c.keys().unwrap().into_iter().map(|k| k.name).collect();
    assert_eq!(names, vec!["reader", "uploader"]);
    assert!(c.delete_key("reader").unwrap());
    assert!(!c.delete_key("reader").unwrap());
    assert_eq!(c.count_keys().unwrap(), 1);
}
