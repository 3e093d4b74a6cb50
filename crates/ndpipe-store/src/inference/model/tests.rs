use ndpipe_catalog::{ModelRegistry, SqliteCatalog, Task, TaskCatalog};
use ndpipe_model::FakeBackend;

use super::*;

fn pretrained() -> ActiveModel {
    ActiveModel::pretrained(Arc::new(FakeBackend::new(3, 4)))
}

fn head(task: &str, id: &str, backbone: &str) -> (HeadWeights, HeadVersion) {
    let head = HeadWeights::new(
        vec!["a".into(), "b".into()],
        3,
        vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        vec![0.0, 0.0],
    )
    .unwrap();
    let version = HeadVersion {
        id: id.into(),
        task: task.into(),
        backbone: backbone.into(),
        parent: None,
        metrics: serde_json::json!({"val_top1": 0.5}),
    };
    (head, version)
}

fn registry(dir: &std::path::Path) -> Arc<SqliteCatalog> {
    let catalog = Arc::new(SqliteCatalog::open(&dir.join("c.sqlite")).unwrap());
    catalog
        .create_task(&Task {
            name: "fashion".parse().unwrap(),
            floor: None,
            created_ms: 1,
        })
        .unwrap();
    catalog
}

fn serving(models: &Models) -> String {
    models.active().get().serving().to_string()
}

#[test]
fn commits_persist_per_task_and_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = registry(dir.path());
    let backbone = pretrained().info().backbone_version.clone();
    let open = || {
        Models::open(
            pretrained(),
            catalog.clone(),
            HeadDir::open(dir.path().join("heads")).unwrap(),
        )
        .unwrap()
    };
    let models = open();
    let general = pretrained().general_version().to_string();
    assert_eq!(serving(&models), format!("general={general}"));
    assert!(matches!(
        models.commit("ft-9"),
        Err(InferenceError::NotStaged { .. })
    ));

    let (weights, v1) = head("default", "ft-1", &backbone);
    models.stage(&weights, &v1).unwrap();
    assert!(models.abort("ft-1").unwrap());
    assert!(matches!(
        models.commit("ft-1"),
        Err(InferenceError::NotStaged { .. })
    ));
    // Heads of two tasks staged before a restart can be committed after it.
    let (fashion, f1) = head("fashion", "fa-1", &backbone);
    models.stage(&weights, &v1).unwrap();
    models.stage(&fashion, &f1).unwrap();
    let models = open();
    models.commit("ft-1").unwrap();
    models.commit("fa-1").unwrap();
    assert_eq!(
        serving(&models),
        format!("default=ft-1,fashion=fa-1,general={general}"),
        "one backbone, a head per task"
    );
    assert!(
        !models.abort("ft-1").unwrap(),
        "the commit used up the staged file"
    );
    let registered = catalog.model("fa-1").unwrap().unwrap();
    assert!(registered.active);
    assert_eq!(registered.task, "fashion".parse::<TaskName>().unwrap());

    // A restart loads every task's committed head.
    let reopened = open();
    assert_eq!(serving(&reopened), serving(&models));
    // Rolling a task back to an earlier head leaves the other tasks alone.
    let (weights2, v2) = head("default", "ft-2", &backbone);
    reopened.stage(&weights2, &v2).unwrap();
    reopened.commit("ft-2").unwrap();
    assert_eq!(
        reopened.previous(&TaskName::default_task()).as_deref(),
        Some("ft-1")
    );
    reopened.commit("ft-1").unwrap();
    reopened.commit("ft-1").unwrap();
    assert_eq!(
        serving(&reopened),
        format!("default=ft-1,fashion=fa-1,general={general}")
    );
    assert_eq!(
        reopened.previous(&TaskName::default_task()).as_deref(),
        Some("ft-2")
    );
    // A head of another backbone is refused.
    let (other, o1) = head("fashion", "fa-x", &"c".repeat(64));
    reopened.stage(&other, &o1).unwrap();
    assert!(matches!(
        reopened.commit("fa-x"),
        Err(InferenceError::OtherBackbone { .. })
    ));
    // An operator's floor reaches the task's classifier.
    catalog
        .set_task_floor(&"fashion".parse().unwrap(), Some(0.7))
        .unwrap();
    reopened.refresh_floors().unwrap();
    let fashion = reopened.active().get();
    assert_eq!(fashion.task("fashion").unwrap().floor, Some(0.7));
}

#[test]
fn a_switched_backbone_carries_the_heads_trained_for_it_and_drops_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = registry(dir.path());
    let heads = || HeadDir::open(dir.path().join("heads")).unwrap();
    let models = Models::open(pretrained(), catalog.clone(), heads()).unwrap();
    let old = pretrained().info().backbone_version.clone();
    for (task, id) in [("default", "ft-1"), ("fashion", "fa-1")] {
        let (w, v) = head(task, id, &old);
        models.stage(&w, &v).unwrap();
        models.commit(id).unwrap();
    }

    let other = ActiveModel::pretrained(Arc::new(FakeBackend::new(5, 4)));
    let new = other.info().backbone_version.clone();
    assert_ne!(new, old);
    models.register(&other).unwrap();
    let (w, v) = head("fashion", "fa-2", &new);
    models.stage(&w, &v).unwrap();
    models
        .switch_backbone(other.clone(), &["fa-2".to_string()])
        .unwrap();
    models
        .switch_backbone(other.clone(), &["fa-2".to_string()])
        .unwrap();
    assert_eq!(
        serving(&models),
        format!("fashion=fa-2,general={}", other.general_version()),
        "the default task had no head of the new backbone"
    );
    assert_eq!(
        models.pretrained().general_version(),
        other.general_version()
    );
    assert_eq!(
        models.previous(&"fashion".parse().unwrap()).as_deref(),
        Some("fa-1")
    );
    assert_eq!(
        catalog.active_model(&TaskName::default_task()).unwrap(),
        None
    );

    // A node that restarts on the old backbone while the registry names the new one's
    // versions serves the old backbone's own classifier and no head of another backbone.
    let reopened = Models::open(pretrained(), catalog.clone(), heads()).unwrap();
    assert_eq!(
        serving(&reopened),
        format!("general={}", pretrained().general_version())
    );
}
