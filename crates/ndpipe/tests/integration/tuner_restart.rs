//! Jobs that survive a Tuner restart: a standalone Tuner and three PipeStores on one PostgreSQL
//! catalog; the Tuner is killed (SIGKILL) and started again on the same catalog
//! - mid-fine-tune, once a node streams features: the job ends `failed`, saying the features
//!   were in memory, counted `resumed` once;
//! - mid-rollout, once at least one node has switched to the new backbone and at least one has
//!   not (the nodes commit one after another, `--rollout-commit-interval-ms` apart): the job
//!   finishes, every node on the new backbone and its version, and reports the restart.
//!
//! The kills wait for those events, not for a time; time limits are hang guards.

use crate::common::{Instance, TunerProcess, cli, jpeg, on_postgres};
use crate::rollout::{POLL, POLLS, added_backbone, capped, ort_flags, serves_new_labels};
use crate::tuner::wait_extracting;

const NAMES: [&str; 3] = ["tr-a", "tr-b", "tr-c"];
/// Photos per node.
const PHOTOS: u64 = 20;

#[test]
fn running_jobs_survive_a_tuner_kill() {
    on_postgres("tuner_restart", |url| async move { restart_on(&url).await });
}

async fn restart_on(url: &str) {
    let mut flags = ort_flags();
    flags.extend(["--catalog", url, "--rollout-commit-interval-ms", "3000"].map(String::from));
    let mut tuner = TunerProcess::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let nodes: Vec<Instance> = NAMES
        .iter()
        .map(|name| Instance::start_pipestore(&tuner.grpc, name, &capped(url, "15")))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        uploaded(node, i as u32).await;
    }
    tuner.wait_for_nodes(3).await;

    finetune_fails_with_its_reason(&mut tuner).await;
    tuner.wait_for_nodes(3).await;
    rollout_resumes(&mut tuner, &nodes).await;
}

/// Uploads [`PHOTOS`] photos of two classes (every fifth a validation photo) to `node`, and
/// waits until they are labelled.
async fn uploaded(node: &Instance, salt: u32) {
    for seed in 0..PHOTOS as u32 {
        let split = if seed % 5 == 4 { "val" } else { "train" };
        let query = format!("?label=cls{}&split={split}", seed % 2);
        let (status, reply) = node.upload(jpeg(64, 48, salt * 1000 + seed), &query).await;
        assert_eq!(status, 201, "{reply}\n{}", node.log());
    }
    node.wait_labelled(PHOTOS).await;
}

/// A fine-tune whose features stream from a throttled node; the Tuner is killed once that
/// node has sent some: after the restart the job has failed with the reason.
async fn finetune_fails_with_its_reason(tuner: &mut TunerProcess) {
    let request = serde_json::json!({
        "runs": 1, "epochs": 1, "chunk_size": 4, "load_balance": false, "deploy": false,
        "throttle": {NAMES[2]: 4.0}
    });
    let (status, job) = tuner.post("/v1/tuner/finetune", request).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_extracting(tuner, &id, NAMES[2]).await;
    tuner.restart();
    let job = tuner.wait_job(&id).await;
    assert_eq!(
        (&job["phase"], &job["resumed"], &job["error"]["kind"]),
        (&"failed".into(), &1.into(), &"interrupted".into()),
        "{job}"
    );
    assert_eq!(
        job["error"]["message"],
        "the Tuner restarted while the fine-tune's features were in memory; start it again",
        "{job}"
    );
}

/// A rollout whose nodes commit 3 s apart; the Tuner is killed once the job shows a node
/// switched and another not (as the nodes themselves say): after the restart the job resumes
/// and finishes with every node on the new backbone.
async fn rollout_resumes(tuner: &mut TunerProcess, nodes: &[Instance]) {
    let (sha, new) = added_backbone(tuner);
    let (ok, out, err) = cli(&["rollout", "--server", &tuner.url, &sha, "--no-wait"]);
    assert!(ok, "{err}");
    let id = out.trim().to_string();
    let mut job = serde_json::Value::Null;
    for poll in 0.. {
        assert!(poll < POLLS, "the rollout hangs: {job}\n{}", tuner.log());
        job = tuner.get(&format!("/v1/tuner/jobs/{id}")).await;
        assert_ne!(
            job["phase"], "done",
            "the rollout ended before the kill: {job}"
        );
        assert_ne!(job["phase"], "failed", "{job}\n{}", tuner.log());
        if job["phase"] == "committing" {
            let rows = job["progress"].as_array().unwrap();
            let switched = rows.iter().filter(|r| r["done"] == 1).count();
            if switched >= 1 && switched < rows.len() {
                break;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    tuner.restart();
    // While the Tuner was down, some nodes served the new backbone and some the old one.
    let mut serving = Vec::new();
    for node in nodes {
        serving.push(node.task_version("general").await == Some(new.clone()));
    }
    assert!(
        serving.contains(&true) && serving.contains(&false),
        "{serving:?}: {job}"
    );

    let job = tuner.wait_job(&id).await;
    assert_eq!(
        (&job["phase"], &job["resumed"]),
        (&"done".into(), &1.into()),
        "{job}\n{}",
        tuner.log()
    );
    let report = &job["result"]["rollout"];
    eprintln!("resumed rollout: {report}");
    assert_eq!(report["version"], new.as_str(), "{report}");
    // The nodes that had switched were only committed again; the others did the rest.
    let before: Vec<bool> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["switched_before_restart"] == true)
        .collect();
    assert_eq!(
        before.iter().filter(|b| **b).count(),
        serving.iter().filter(|s| **s).count(),
        "{report}"
    );
    for node in nodes {
        assert_eq!(node.task_version("general").await, Some(new.clone()));
        serves_new_labels(node, &new, PHOTOS).await;
    }
    let listed = tuner.get("/v1/tuner/nodes").await;
    for n in listed.as_array().unwrap() {
        assert_eq!(
            (&n["version"], &n["in_sync"]),
            (
                &serde_json::json!(format!("general={new}")),
                &serde_json::json!(true)
            ),
            "{listed}"
        );
    }
}
