//! Tasks: their rows, ground truth per task, an active version per task, and label counts.

use crate::{
    Catalog, CatalogError, GroundTruth, ModelVersion, OTHER_CLASS, Prediction, Split, Task,
    TaskName,
};

fn name(s: &str) -> TaskName {
    s.parse().unwrap()
}

fn version(id: &str, task: &str, active: bool) -> ModelVersion {
    ModelVersion {
        id: id.into(),
        task: name(task),
        backbone: "b".repeat(64),
        parent: None,
        metrics: serde_json::json!({}),
        created_ms: 10,
        active,
    }
}

/// Runs after the photo and model cases: photos 1, 4 and 5 exist; `m2` serves `default`.
pub(super) fn run(c: &dyn Catalog) {
    tasks_are_created_once_and_keep_their_floor(c);
    ground_truth_is_kept_per_task(c);
    each_task_has_its_own_active_version(c);
    label_counts_tell_the_other_share(c);
}

fn tasks_are_created_once_and_keep_their_floor(c: &dyn Catalog) {
    let builtin: Vec<String> = c
        .tasks()
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(builtin, vec!["default", "general"]);
    let fashion = Task {
        name: name("fashion"),
        floor: None,
        created_ms: 7,
    };
    c.create_task(&fashion).unwrap();
    assert!(matches!(
        c.create_task(&fashion),
        Err(CatalogError::Conflict { .. })
    ));
    c.set_task_floor(&name("fashion"), Some(0.25)).unwrap();
    let back = c.task(&name("fashion")).unwrap().unwrap();
    assert_eq!((back.floor, back.created_ms), (Some(0.25), 7));
    assert!(c.task(&name("nope")).unwrap().is_none());
    assert!(matches!(
        c.set_task_floor(&name("nope"), None),
        Err(CatalogError::NotFound { .. })
    ));
    assert!(
        "Fashion".parse::<TaskName>().is_err(),
        "names are lower case"
    );
    assert!("".parse::<TaskName>().is_err());
    assert!("-x".parse::<TaskName>().is_err());
}

fn ground_truth_is_kept_per_task(c: &dyn Catalog) {
    let trouser = GroundTruth {
        task: name("fashion"),
        ..GroundTruth::new("Trouser", Split::Train)
    };
    c.set_ground_truth(4, &GroundTruth::new("dog", Split::Train))
        .unwrap();
    c.set_ground_truth(4, &trouser).unwrap();
    let photo = c.photo(4).unwrap().unwrap();
    assert_eq!(
        photo.meta.ground_truth,
        Some(GroundTruth::new("dog", Split::Train)),
        "the default task's label, as clients of before tasks read it"
    );
    assert_eq!(photo.ground_truths.len(), 2);
    assert!(photo.ground_truths.contains(&trouser));
    let ids: Vec<u64> = c
        .ground_truths(&name("fashion"))
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, vec![4]);
    let bag = GroundTruth {
        task: name("fashion"),
        ..GroundTruth::new("Bag", Split::Val)
    };
    let written = c
        .set_ground_truths(&[(1, bag.clone()), (999, bag.clone()), (5, bag)])
        .unwrap();
    assert_eq!(written, vec![1, 5], "photos that do not exist are skipped");
    assert_eq!(
        c.labelled(&name("fashion"), Split::Val).unwrap(),
        vec![(1, "Bag".to_string()), (5, "Bag".to_string())]
    );
    assert!(c.clear_ground_truth(4, &name("fashion")).unwrap());
    assert_eq!(
        c.photo(4).unwrap().unwrap().ground_truths,
        vec![GroundTruth::new("dog", Split::Train)],
        "clearing one task leaves the others"
    );
}

fn each_task_has_its_own_active_version(c: &dyn Catalog) {
    c.register_model(&version("g1", "general", true)).unwrap();
    c.register_model(&version("f1", "fashion", true)).unwrap();
    c.register_model(&version("f2", "fashion", false)).unwrap();
    assert!(
        matches!(
            c.register_model(&version("x1", "nope", false)),
            Err(CatalogError::NotFound { .. })
        ),
        "a version of an unknown task is refused"
    );
    let active = |c: &dyn Catalog| -> Vec<String> {
        c.active_models()
            .unwrap()
            .into_iter()
            .map(|m| format!("{}={}", m.task, m.id))
            .collect()
    };
    assert_eq!(active(c), vec!["default=m2", "fashion=f1", "general=g1"]);
    c.set_active_model("f2").unwrap();
    assert_eq!(
        active(c),
        vec!["default=m2", "fashion=f2", "general=g1"],
        "activating a version changes only its task"
    );
    assert_eq!(
        c.active_model(&name("fashion")).unwrap().map(|m| m.id),
        Some("f2".into())
    );
    assert!(c.deactivate_task(&name("fashion")).unwrap());
    assert!(!c.deactivate_task(&name("fashion")).unwrap());
    assert_eq!(c.active_model(&name("fashion")).unwrap(), None);
    assert_eq!(active(c), vec!["default=m2", "general=g1"]);
    assert_eq!(c.model("f2").unwrap().unwrap().task, name("fashion"));
}

fn label_counts_tell_the_other_share(c: &dyn Catalog) {
    let p = |label: &str, score| Prediction {
        label: label.into(),
        score,
    };
    c.put_predictions_many(
        "f1",
        &[
            (1, vec![p(OTHER_CLASS, 0.9)]),
            (4, vec![p("Trouser", 0.8), p(OTHER_CLASS, 0.1)]),
            (5, vec![p(OTHER_CLASS, 0.6)]),
        ],
    )
    .unwrap();
    assert_eq!(c.label_counts("f1").unwrap(), (3, 2));
    assert_eq!(c.label_counts("nothing").unwrap(), (0, 0));
}
