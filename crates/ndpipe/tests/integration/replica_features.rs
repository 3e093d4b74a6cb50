//! Features travel with copies: three PipeStores with the model and two copies of each photo;
//! every holder of an uploaded photo keeps its features, byte for byte the same (the primary
//! labels it once and the copy carries them), and so does the new holder repair picks after a
//! node is removed. Time limits are hang guards.

use std::collections::BTreeMap;

use ndpipe_store::{DEFAULT_FEATURE_CACHE_BYTES, FeatureStore};

use crate::common::{Instance, cli, jpeg, on_postgres};
use crate::replication::{POLL, POLLS, cluster_of, copies as holders};

const NAMES: [&str; 3] = ["rf-a", "rf-b", "rf-c"];

#[test]
fn copies_carry_the_features_of_their_photo() {
    on_postgres(
        "replica_features",
        |url| async move { features_on(&url).await },
    );
}

/// Every backbone's features of each photo of `ids` in the stopped `node`'s feature store.
pub(crate) fn features_of(node: &Instance, ids: &[u64]) -> BTreeMap<u64, Vec<(String, Vec<u8>)>> {
    let store = FeatureStore::open(
        &node.data.join("store").join("features.redb"),
        DEFAULT_FEATURE_CACHE_BYTES,
    )
    .unwrap();
    ids.iter()
        .map(|id| (*id, store.photo_features(*id).unwrap()))
        .collect()
}

async fn features_on(url: &str) {
    let (tuner, mut nodes, _) = cluster_of(url, &NAMES, &[]);
    tuner.wait_for_nodes(3).await;
    let mut ids = Vec::new();
    for seed in 0..24 {
        let (status, reply) = nodes[0].upload(jpeg(64, 48, seed), "").await;
        assert_eq!(status, 201, "{reply}\n{}", nodes[0].log());
        ids.push(reply["id"].as_u64().unwrap());
    }
    let mut before = BTreeMap::new();
    for id in &ids {
        before.insert(*id, holders(&nodes[0], *id).await);
    }
    // rf-c goes; repair gives each of its photos a new copy on the other survivor.
    nodes[2].kill9();
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "remove", NAMES[2]]);
    assert!(ok, "{out}{err}");
    let mut polls = 0;
    loop {
        let mut both = 0;
        for id in &ids {
            both += usize::from(holders(&nodes[0], *id).await.len() == 2);
        }
        let a = nodes[0].json("/healthz").await["photos"].as_u64().unwrap();
        let b = nodes[1].json("/healthz").await["photos"].as_u64().unwrap();
        if both == ids.len() && a == ids.len() as u64 && b == ids.len() as u64 {
            break;
        }
        polls += 1;
        assert!(
            polls < POLLS,
            "repair does not finish: {a} and {b} of {}",
            ids.len()
        );
        tokio::time::sleep(POLL).await;
    }
    for node in &mut nodes {
        node.kill9();
    }
    let stored: Vec<_> = nodes.iter().map(|n| features_of(n, &ids)).collect();
    let mut repaired = 0;
    for id in &ids {
        let first: Vec<&String> = before[id].iter().collect();
        let mut seen = Vec::new();
        for (i, name) in NAMES.iter().enumerate() {
            let held = first.contains(&&name.to_string()) || i < 2;
            if !held {
                continue;
            }
            let f = &stored[i][id];
            assert_eq!(
                f.len(),
                1,
                "photo {id} on {name}: features of {} backbones",
                f.len()
            );
            assert!(
                f[0].1.len() > 1000,
                "photo {id} on {name}: {} bytes",
                f[0].1.len()
            );
            seen.push(f[0].clone());
        }
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "photo {id}: the holders' features differ"
        );
        repaired += usize::from(first.iter().any(|h| *h == NAMES[2]));
    }
    assert!(
        repaired > 0,
        "no photo had a copy on {}: {before:?}",
        NAMES[2]
    );
    drop(tuner);
}
