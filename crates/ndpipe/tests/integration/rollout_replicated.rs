//! A rollout on a replicated cluster: three PipeStores with two copies of every photo; each
//! photo is extracted once, by its primary (the other holder leaves its copy out), every photo
//! gets labels from the new backbone, and a fine-tune afterwards reads every training photo's
//! features, computing none. Time limits are hang guards.

use crate::common::on_postgres;
use crate::replication::{copies, replicated_node};
use crate::rollout::{finetune_computes_no_features, rolled_out, serves_new_labels, tuner_on};

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
    let tuner = tuner_on(url);
    let nodes: Vec<_> = NAMES
        .iter()
        .map(|name| replicated_node(url, &tuner, name, &[]).0)
        .collect();
    tuner.wait_for_nodes(3).await;
    let mut ids = Vec::new();
    for seed in 0..PHOTOS {
        let png = crate::common::jpeg(64, 48, seed as u32);
        let split = if seed % 5 == 4 { "val" } else { "train" };
        let query = format!("?label=cls{}&split={split}", seed % 2);
        let (status, reply) = nodes[0].upload(png, &query).await;
        assert_eq!(status, 201, "{reply}\n{}", nodes[0].log());
        ids.push(reply["id"].as_u64().unwrap());
    }
    // A replicated upload is labelled by its primary before it is copied and acknowledged.
    for id in &ids {
        assert_eq!(copies(&nodes[0], *id).await.len(), 2, "photo {id}");
    }
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

    let listed = nodes[0].json("/v1/photos?limit=1000").await;
    let listed = listed["photos"].as_array().unwrap().len() as u64;
    for node in &nodes {
        assert_eq!(node.active_versions().await, [new.as_str()]);
    }
    serves_new_labels(&nodes[0], &new, listed).await;
    finetune_computes_no_features(&tuner).await;
}
