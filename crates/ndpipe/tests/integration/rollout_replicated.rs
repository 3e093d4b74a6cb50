//! Rollouts on a replicated cluster: three PipeStores with two copies of every photo.
//! - Each photo is extracted once, by its primary (the other holder leaves its copy out), every
//!   photo gets labels from the new backbone, and a fine-tune afterwards reads every training
//!   photo's features, computing none.
//! - A node killed mid-extraction is lost to the job: its photos pass to the holders of their
//!   copies, whose commits extract them; the job finishes on the survivors with every photo
//!   labelled by the new backbone, and the node, restarted, is brought to it by the syncer.
//!
//! Time limits are hang guards.

use crate::common::{Instance, TunerProcess, jpeg, on_postgres};
use crate::replication::{copies, replicated_node};
use crate::rollout::{
    POLL, POLLS, added_backbone, finetune_computes_no_features, rolled_out, serves_new_labels,
    tuner_on, watch_rollout,
};

const NAMES: [&str; 3] = ["rr-a", "rr-b", "rr-c"];
/// Photos uploaded (through one front door).
const PHOTOS: u64 = 30;

#[test]
fn a_replicated_rollout_extracts_each_photo_once() {
    on_postgres("rollout_replicated", |url| async move {
        replicated_rollout_on(&url).await
    });
}

async fn replicated_rollout_on(url: &str) {
    let (tuner, nodes) = cluster(url, &[]).await;
    uploaded(&nodes[0], PHOTOS).await;
    let (new, report) = rolled_out(&tuner).await;
    let report = &report;
    // Each photo once: the passes and take-overs together did every photo, and each node left
    // out the copies whose primary is another node (one copy of each photo in all).
    assert_eq!(report["photos"], PHOTOS, "{report}");
    let of = |field: &str| -> u64 {
        let nodes = report["nodes"].as_array().unwrap();
        nodes.iter().map(|n| n[field].as_u64().unwrap()).sum()
    };
    assert_eq!(of("copies_left"), PHOTOS, "{report}");
    assert_eq!(of("photos") + of("taken"), PHOTOS + of("given"), "{report}");

    for node in &nodes {
        assert_eq!(node.task_version("general").await, Some(new.clone()));
    }
    serves_new_labels(&nodes[0], &new, PHOTOS).await;
    finetune_computes_no_features(&tuner).await;
}

/// A Tuner and three PipeStores with two copies of each photo and `extra` flags.
async fn cluster(url: &str, extra: &[&str]) -> (TunerProcess, Vec<Instance>) {
    let tuner = tuner_on(url);
    let nodes: Vec<_> = NAMES
        .iter()
        .map(|name| replicated_node(url, &tuner, name, extra).0)
        .collect();
    tuner.wait_for_nodes(3).await;
    (tuner, nodes)
}

/// Uploads `n` photos (every fifth a validation photo) through `front`; each is at two copies
/// once acknowledged, labelled by its primary before it was copied.
async fn uploaded(front: &Instance, n: u64) {
    for seed in 0..n {
        let split = if seed % 5 == 4 { "val" } else { "train" };
        let query = format!("?label=cls{}&split={split}", seed % 2);
        let (status, reply) = front.upload(jpeg(64, 48, seed as u32), &query).await;
        assert_eq!(status, 201, "{reply}\n{}", front.log());
        let id = reply["id"].as_u64().unwrap();
        assert_eq!(copies(front, id).await.len(), 2, "photo {id}");
    }
}

#[test]
fn a_rollout_that_loses_a_node_finishes_on_its_copies() {
    on_postgres(
        "rollout_lost",
        |url| async move { lost_node_on(&url).await },
    );
}

async fn lost_node_on(url: &str) {
    // Capped models and small batches: the extraction lasts some seconds, long enough to kill
    // a node in it.
    let capped = ["--model-rate-limit", "10", "--max-batch", "8"];
    let (tuner, mut nodes) = cluster(url, &capped).await;
    uploaded(&nodes[0], 3 * PHOTOS).await;
    let (sha, new) = added_backbone(&tuner);
    let mut killed = false;
    let job = watch_rollout(&tuner, &sha, async |job| {
        let c = of_node(&job["progress"], NAMES[2]);
        let (done, total) = (c["done"].as_u64(), c["total"].as_u64());
        if !killed && done > Some(0) && done < total {
            nodes[2].kill9();
            killed = true;
        }
    })
    .await;
    assert!(killed, "the node was killed mid-extraction: {job}");
    assert_eq!(job["phase"], "done", "{job}\n{}", tuner.log());
    let report = &job["result"]["rollout"];
    eprintln!("rollout report: {report}");
    let lost = of_node(&report["nodes"], NAMES[2]);
    assert!(lost["lost"].is_string(), "{report}");
    assert!(lost["moved"].as_u64().unwrap() > 0, "{report}");
    for name in &NAMES[..2] {
        assert!(
            of_node(&report["nodes"], name)["lost"].is_null(),
            "{report}"
        );
    }
    // Every photo, the lost node's too, has labels from the new backbone; the survivors serve
    // it, and their stored features cover every photo they answer for now.
    for node in &nodes[..2] {
        assert_eq!(node.task_version("general").await, Some(new.clone()));
    }
    serves_new_labels(&nodes[0], &new, 3 * PHOTOS).await;
    finetune_computes_no_features(&tuner).await;

    // The node comes back: the syncer commits the staged backbone there.
    nodes[2].restart();
    let mut polls = 0;
    while nodes[2].task_version("general").await != Some(new.clone()) {
        polls += 1;
        assert!(
            polls < POLLS,
            "the node is not brought to {new}\n{}",
            tuner.log()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The entry of node `name` in a job's per-node list (`"name (node N)"`).
fn of_node<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let prefix = format!("{name} ");
    list.as_array()
        .and_then(|l| {
            l.iter()
                .find(|n| n["node"].as_str().is_some_and(|s| s.starts_with(&prefix)))
        })
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}
