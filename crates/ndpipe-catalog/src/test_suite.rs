//! Behaviour every [`Catalog`] implementation must show, run by each implementation's tests.

use crate::{Catalog, CatalogError, GroundTruth, ModelVersion, PhotoRecord, Prediction, Split};

/// A photo record with predictable fields, for tests.
pub fn photo(id: u64, truth: Option<(&str, Split)>) -> PhotoRecord {
    PhotoRecord {
        id,
        sha256: format!("{id:064x}"),
        bytes: 100 + id,
        width: 640,
        height: 480,
        content_type: "image/jpeg".into(),
        created_ms: 1_700_000_000_000 + id as i64,
        ground_truth: truth.map(|(label, split)| GroundTruth {
            label: label.into(),
            split,
        }),
    }
}

fn model(id: &str, active: bool, created_ms: i64) -> ModelVersion {
    ModelVersion {
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
    ground_truth_updates(c);
    predictions_replace_per_version(c);
    models_have_one_active(c);
}

fn photos_round_trip_and_page(c: &dyn Catalog) {
    for id in 1..=5 {
        c.upsert_photo(&photo(id, (id % 2 == 0).then_some(("dog", Split::Train))))
            .unwrap();
    }
    assert_eq!(c.count_photos().unwrap(), 5);
    assert_eq!(
        c.photo(2).unwrap().unwrap(),
        photo(2, Some(("dog", Split::Train)))
    );
    assert_eq!(c.photo(3).unwrap().unwrap().ground_truth, None);
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

fn ground_truth_updates(c: &dyn Catalog) {
    let truth = GroundTruth {
        label: "cat".into(),
        split: Split::Test,
    };
    c.set_ground_truth(1, Some(&truth)).unwrap();
    assert_eq!(c.photo(1).unwrap().unwrap().ground_truth, Some(truth));
    c.set_ground_truth(1, None).unwrap();
    assert_eq!(c.photo(1).unwrap().unwrap().ground_truth, None);
    assert!(matches!(
        c.set_ground_truth(999, None),
        Err(CatalogError::NotFound { .. })
    ));
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
    assert!(matches!(
        c.set_active_model("nope"),
        Err(CatalogError::NotFound { .. })
    ));
    assert_eq!(c.models().unwrap().iter().filter(|m| m.active).count(), 1);
}
