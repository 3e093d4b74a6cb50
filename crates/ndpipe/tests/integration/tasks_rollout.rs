//! A backbone rollout carries every task (issue 22): each custom task's head is trained again
//! on the new backbone's features, gated, and committed with the backbone; every photo is
//! labelled for every task by the new versions.

use serde_json::{Value, json};

use crate::common::{Instance, cli, sha256};
use crate::rollout::second_backbone;
use crate::tasks::{import_for, job, post, task_labels};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_carries_two_tasks_to_the_new_backbone() {
    let inst = Instance::start_with_model(&[]);
    for task in ["fashion", "tops"] {
        assert_eq!(post(&inst, "/v1/tasks", json!({"name": task})).await.0, 201);
    }
    import_for(&inst, "fashion", 140);
    inst.wait_labelled(140).await;
    let page = inst.json("/v1/photos?limit=1000").await;
    let of = |class: &str| -> Vec<u64> {
        page["photos"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                p["ground_truths"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|t| t["label"] == class))
            })
            .map(|p| p["id"].as_u64().unwrap())
            .collect()
    };
    for (class, ids) in [("top", of("Shirt")), ("shoe", of("Sandal"))] {
        let (status, reply) = post(
            &inst,
            "/v1/tasks/tops/labels",
            json!({"class": class, "ids": ids}),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
    }
    let mut old = Vec::new();
    for task in ["fashion", "tops"] {
        let done = job(
            &inst,
            "/v1/tuner/finetune",
            json!({"task": task, "runs": 1, "epochs": 10, "batch": 64}),
        )
        .await;
        assert_eq!(done["phase"], "done", "{done}\n{}", inst.log());
        old.push(
            done["result"]["finetune"]["version"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }

    let tmp = tempfile::tempdir().unwrap();
    let second = second_backbone(tmp.path());
    let sha = sha256(&std::fs::read(&second).unwrap());
    let (ok, _, err) = cli(&[
        "models",
        "--server",
        &inst.url,
        "add",
        "--onnx",
        second.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let done = job(&inst, &format!("/v1/tuner/rollout/{sha}"), json!({})).await;
    assert_eq!(done["phase"], "done", "{done}\n{}", inst.log());
    let report = &done["result"]["rollout"];
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{report}");
    assert!(tasks.iter().all(|t| t["carried"] == true), "{report}");

    let versions = inst.json("/v1/tuner/versions").await;
    let active: Vec<&Value> = versions
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["active"] == true)
        .collect();
    assert_eq!(active.len(), 3, "general and two tasks: {versions}");
    assert!(
        active.iter().all(|v| v["backbone"] == sha.as_str()),
        "{versions}"
    );
    for task in &old {
        assert!(
            active.iter().all(|v| v["id"] != task.as_str()),
            "{task} was replaced"
        );
    }
    // The node serves them, and every photo has labels of both tasks' new versions.
    let photo = of("Shirt")[0];
    let labels = inst.json(&format!("/v1/photos/{photo}/labels")).await;
    for task in ["fashion", "tops", "general"] {
        let version = active.iter().find(|v| v["task"] == task).unwrap()["id"].clone();
        let served = labels
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["model_version"] == version)
            .unwrap_or_else(|| panic!("no labels of {version}: {labels}"));
        assert_eq!(served["active"], true, "{labels}");
        assert!(task_labels(&labels, task).is_some_and(|l| !l.is_empty()));
    }
}
