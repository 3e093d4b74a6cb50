//! A rollout's load balancing: of two PipeStores, one capped 4x slower, the slow one gives the
//! photos its pass has not reached to the fast one, which runs the staged backbone over them
//! and stores features and labels back; afterwards the slow node serves the new version for
//! every photo, and a fine-tune reads every feature, computing none.

use crate::common::{Instance, import_fashion, on_postgres};
use crate::rollout::{
    capped, finetune_computes_no_features, rolled_out, serves_new_labels, tuner_on,
};

/// Photos per node.
const PHOTOS: u64 = 64;

#[test]
fn a_rollout_moves_work_from_a_slow_node_to_a_fast_one() {
    on_postgres(
        "rollout_balance",
        |url| async move { balanced_on(&url).await },
    );
}

async fn balanced_on(url: &str) {
    let tuner = tuner_on(url);
    // Node 0 runs its model at 40 photos/s, node 1 at 10: a proportional split leaves node 1
    // a fifth of the work.
    let nodes: Vec<Instance> = [("ps-fast", "40"), ("ps-slow", "10")]
        .iter()
        .map(|(name, rate)| Instance::start_pipestore(&tuner.grpc, name, &capped(url, rate)))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        import_fashion(node, i * PHOTOS as usize, PHOTOS as usize);
        node.wait_labelled(PHOTOS).await;
    }
    tuner.wait_for_nodes(2).await;

    let (new, report) = rolled_out(&tuner).await;
    let report = &report;
    let named = |name: &str| {
        let nodes = report["nodes"].as_array().unwrap();
        let found = nodes
            .iter()
            .find(|n| n["node"].as_str().unwrap().starts_with(name));
        found
            .unwrap_or_else(|| panic!("no {name} in {report}"))
            .clone()
    };
    let (fast, slow) = (named("ps-fast "), named("ps-slow "));
    let given = slow["given"].as_u64().unwrap();
    assert!(given >= 8, "the slow node gave photos away: {report}");
    assert_eq!(
        fast["taken"], given,
        "the fast node stored them all: {report}"
    );
    assert_eq!((&fast["given"], &slow["taken"]), (&0.into(), &0.into()));
    assert_eq!(
        slow["photos"].as_u64().unwrap() + given,
        PHOTOS,
        "each of the slow node's photos once: {report}"
    );
    assert_eq!(report["photos"], 2 * PHOTOS, "{report}");

    // The slow node serves labels of the new version for every photo, the moved ones too, and
    // holds their features.
    serves_new_labels(&nodes[1], &new, PHOTOS).await;
    finetune_computes_no_features(&tuner).await;
}
