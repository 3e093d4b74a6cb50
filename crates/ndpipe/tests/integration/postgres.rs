//! A Tuner and three PipeStores on one PostgreSQL catalog, as real processes: photo ids unique
//! across the cluster, a fine-tune and deploy that leave every node on one version, a search on
//! any node that finds every node's photos (and says which are unavailable), a Tuner restart that
//! needs no PipeStore restart, and a node removed with the CLI. Time limits are hang guards.

use std::collections::{BTreeSet, HashSet};

use crate::common::{Instance, TunerProcess, cli, import_fashion, on_postgres};

const NAMES: [&str; 3] = ["ps-a", "ps-b", "ps-c"];

/// Every photo id a node lists.
async fn photo_ids(node: &Instance) -> Vec<u64> {
    let page = node.json("/v1/photos?limit=1000").await;
    page["photos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect()
}

/// The nodes holding a Trouser hit, from a search on `node`, with each hit's availability.
async fn trouser_holders(node: &Instance) -> BTreeSet<(String, bool)> {
    holders(&node.json("/v1/search?label=Trouser&limit=500").await)
}

/// The (node, available) pairs of a search reply's hits.
fn holders(found: &serde_json::Value) -> BTreeSet<(String, bool)> {
    found["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("{found}"))
        .iter()
        .map(|h| {
            (
                h["node"].as_str().unwrap().to_string(),
                h["available"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Runs a job to its end and checks that it succeeded.
async fn finished(tuner: &TunerProcess, path: &str, body: serde_json::Value) -> serde_json::Value {
    let (status, job) = tuner.run_job(path, body).await;
    assert_eq!(
        (status, &job["phase"]),
        (202, &serde_json::json!("done")),
        "{job}\n{}",
        tuner.log()
    );
    job
}

fn finetune() -> serde_json::Value {
    serde_json::json!({"runs": 1, "epochs": 3, "load_balance": false, "deploy": true})
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn three_pipestores_on_postgres_share_ids_search_and_one_version() {
    on_postgres("cluster", |url| async move { cluster_on(&url).await });
}

async fn cluster_on(url: &str) {
    // One copy of each photo: the node a photo was uploaded to keeps it.
    let catalog = ["--catalog", url, "--replicas", "1"];
    let mut tuner = TunerProcess::start_with(&["--catalog", url]);
    let nodes: Vec<Instance> = NAMES
        .iter()
        .map(|name| Instance::start_pipestore(&tuner.grpc, name, &catalog))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        import_fashion(node, i * 70, 70);
    }
    tuner.wait_for_nodes(3).await;

    let mut seen = HashSet::new();
    for node in &nodes {
        for id in photo_ids(node).await {
            assert!(seen.insert(id), "photo id {id} is given twice");
        }
    }
    assert_eq!(seen.len(), 210);

    let job = finished(&tuner, "/v1/tuner/finetune", finetune()).await;
    let report = &job["result"]["finetune"];
    assert_eq!(report["deploy"]["nodes"], 3, "{report}");
    let version = report["version"].as_str().unwrap();
    let listed = tuner.get("/v1/tuner/nodes").await;
    for n in listed.as_array().unwrap() {
        let serving = n["version"].as_str().unwrap_or_default();
        assert!(
            serving.starts_with(&format!("default={version},")) && n["in_sync"] == true,
            "{listed}"
        );
    }
    for node in &nodes {
        assert_eq!(
            node.task_version("default").await.as_deref(),
            Some(version),
            "each node's own"
        );
    }

    // A search on any node finds the photos of all three, each on the node that holds it.
    let everyone: BTreeSet<(String, bool)> = NAMES.iter().map(|n| (n.to_string(), true)).collect();
    for node in &nodes {
        assert_eq!(trouser_holders(node).await, everyone);
    }
    let from_tuner = tuner.get("/v1/search?label=Trouser&limit=500").await;
    let tuner_holders = holders(&from_tuner);
    assert_eq!(tuner_holders, everyone, "the Tuner answers too");
    let trouser_versions: BTreeSet<&str> = (from_tuner["hits"].as_array().unwrap().iter())
        .filter(|h| h["label"] == "Trouser")
        .map(|h| h["model_version"].as_str().unwrap())
        .collect();
    assert_eq!(trouser_versions, BTreeSet::from([version]), "{from_tuner}");
    let (ok, out, err) = cli(&["photos", "--server", &nodes[2].url, "search", "Trouser"]);
    assert!(
        ok && out.contains("on ps-a") && out.contains("on ps-b"),
        "{out}{err}"
    );

    // The Tuner restarts: the registry is in PostgreSQL, the nodes heartbeat again by themselves.
    tuner.restart();
    tuner.wait_for_nodes(3).await;
    let job = finished(
        &tuner,
        "/v1/tuner/finetune",
        serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false, "deploy": false}),
    )
    .await;
    assert_eq!(
        job["result"]["finetune"]["nodes"].as_array().unwrap().len(),
        3,
        "{job}"
    );

    // ps-c goes for good and is removed: its photos are still found, as unavailable, and jobs
    // run on the other two.
    let mut gone = nodes.into_iter();
    let (a, b, mut c) = (
        gone.next().unwrap(),
        gone.next().unwrap(),
        gone.next().unwrap(),
    );
    c.kill9();
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "remove", "ps-c"]);
    assert!(ok, "{out}{err}");
    let holders = trouser_holders(&a).await;
    assert!(
        holders.contains(&("ps-c".to_string(), false)),
        "{holders:?}"
    );
    assert!(holders.contains(&("ps-b".to_string(), true)), "{holders:?}");
    let job = finished(&tuner, "/v1/tuner/finetune", finetune()).await;
    assert_eq!(job["result"]["finetune"]["deploy"]["nodes"], 2, "{job}");
    drop(b);
}
