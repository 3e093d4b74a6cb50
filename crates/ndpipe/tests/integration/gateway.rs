//! A gateway in front of three PipeStores on one PostgreSQL catalog with two copies of every
//! photo, all real processes behind a cluster secret: uploads through the gateway land on two
//! nodes each and read back byte for byte through it, its listing and cluster status cover
//! them, a delete through it removes every copy, a client without its token gets 401, with
//! one PipeStore killed, uploads go to the survivors and every photo still reads back, a
//! gateway without the cluster secret is refused, and an access key made on a PipeStore works
//! at the gateway. Beside it, the Tuner's repair job failing when a removal leaves too few nodes
//! for the copies.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::{Instance, TunerProcess, cli, jpeg, on_postgres, sha256};
use crate::replication::replicated_node;

const NAMES: [&str; 3] = ["gw-a", "gw-b", "gw-c"];
const TOKEN: &str = "the-gateway-token";
/// Pause between two tries of something the cluster settles in the background.
const POLL: Duration = Duration::from_millis(200);
/// Tries before a wait counts as a hang (a bounded count, not a clock).
const POLLS: u32 = 300;

/// Uploads photo number `seed` through `gateway` with `token`: (status, JSON body, checksum).
async fn upload(
    gateway: &Instance,
    seed: u32,
    token: Option<&str>,
) -> (u16, serde_json::Value, String) {
    let bytes = jpeg(40 + seed % 16, 40 + seed / 16, seed);
    let sum = sha256(&bytes);
    let mut req = gateway
        .client()
        .post(format!("{}/v1/photos", gateway.url))
        .body(bytes);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, body, sum)
}

/// The holders of photo `id`, from the gateway's `GET /v1/photos/{id}/meta`.
async fn holders(gateway: &Instance, id: u64) -> Vec<String> {
    let meta = gateway.json(&format!("/v1/photos/{id}/meta")).await;
    let mut names: Vec<String> = meta["copies"]
        .as_array()
        .unwrap_or_else(|| panic!("{meta}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Photos in a node's store, copies included.
async fn stored(node: &Instance) -> u64 {
    node.json("/healthz").await["photos"].as_u64().unwrap()
}

/// Every photo of `acked` read through `gateway`, byte for byte.
async fn all_read_back(gateway: &Instance, acked: &BTreeMap<u64, String>) {
    for (id, sum) in acked {
        let (status, body) = gateway.get(&format!("/v1/photos/{id}")).await;
        assert_eq!(status, 200, "photo {id}\n{}", gateway.log());
        assert_eq!(&sha256(&body), sum, "photo {id}");
    }
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn a_gateway_places_reads_and_deletes_and_outlives_a_node() {
    on_postgres("gateway", |url| async move { gateway_on(&url).await });
}

/// A Tuner and PipeStores with two copies of every photo behind a cluster secret.
pub(crate) struct SecuredCluster {
    pub(crate) tuner: TunerProcess,
    pub(crate) nodes: Vec<Instance>,
    /// Each node's S3 port.
    pub(crate) s3_ports: Vec<u16>,
    /// The Tuner's registry entries of the nodes, once all were registered.
    pub(crate) registered: serde_json::Value,
    /// The cluster secret's file.
    pub(crate) secret: String,
}

impl SecuredCluster {
    /// PipeStores `names` on catalog `url` with `extra` flags, the secret written in `dir`;
    /// waits until every node is registered.
    pub(crate) async fn start(url: &str, names: &[&str], dir: &Path, extra: &[&str]) -> Self {
        let secret = dir.join("cluster-secret");
        std::fs::write(&secret, "a cluster secret for the gateway tests\n").unwrap();
        let secret = secret.to_str().unwrap().to_string();
        let tuner = TunerProcess::start_with(&[
            "--catalog",
            url,
            "--node-lease-ms",
            "3000",
            "--cluster-secret-file",
            &secret,
        ]);
        let mut flags = vec!["--cluster-secret-file", secret.as_str()];
        flags.extend_from_slice(extra);
        let (nodes, s3_ports) = names
            .iter()
            .map(|name| replicated_node(url, &tuner, name, &flags))
            .unzip();
        let registered = tuner.wait_for_nodes(names.len()).await;
        SecuredCluster {
            tuner,
            nodes,
            s3_ports,
            registered,
            secret,
        }
    }

    /// A gateway in front of the cluster (two copies, the secret) with `extra` flags.
    pub(crate) fn gateway(&self, url: &str, extra: &[&str]) -> Instance {
        let mut flags = vec![
            "--catalog",
            url,
            "--replicas",
            "2",
            "--peer-timeout-ms",
            "5000",
            "--cluster-secret-file",
            &self.secret,
        ];
        flags.extend_from_slice(extra);
        Instance::start_gateway(&flags)
    }
}

async fn gateway_on(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SecuredCluster::start(url, &NAMES, dir.path(), &[]).await;
    let gateway = cluster.gateway(url, &["--token", TOKEN]);
    let SecuredCluster {
        tuner, mut nodes, ..
    } = cluster;
    assert_eq!(gateway.json("/readyz").await["live_nodes"], 3);

    // A stranger without the token, or with a wrong one, stores nothing.
    for token in [None, Some("not-the-token")] {
        let (status, body, _) = upload(&gateway, 0, token).await;
        assert_eq!(status, 401, "{body}");
    }

    // 60 uploads through the gateway: two copies each, on two distinct nodes.
    let mut acked = BTreeMap::new();
    for seed in 0..60 {
        let (status, body, sum) = upload(&gateway, seed, Some(TOKEN)).await;
        assert_eq!(status, 201, "upload {seed}: {body}\n{}", gateway.log());
        acked.insert(body["id"].as_u64().unwrap(), sum);
    }
    let mut total = 0;
    for node in &nodes {
        let n = stored(node).await;
        assert!(n > 0, "every node holds some copies");
        total += n;
    }
    assert_eq!(total, 120, "two copies of each of 60 photos");
    for id in acked.keys() {
        let on = holders(&gateway, *id).await;
        assert_eq!(on.len(), 2, "photo {id} on {on:?}");
        assert_ne!(on[0], on[1]);
    }
    all_read_back(&gateway, &acked).await;
    // Labels of every photo, through the gateway and through every node, whichever node's
    // photo it is: the primary labelled it before it was acknowledged.
    for id in acked.keys().take(10) {
        let path = format!("/v1/photos/{id}/labels");
        let labels = gateway.json(&path).await;
        let versions = labels.as_array().unwrap_or_else(|| panic!("{labels}"));
        assert!(
            versions
                .iter()
                .any(|v| !v["labels"].as_array().unwrap().is_empty()),
            "photo {id}: {labels}"
        );
        for node in &nodes {
            assert_eq!(
                node.json(&path).await,
                labels,
                "photo {id} through {}",
                node.url
            );
        }
    }
    let page = gateway.json("/v1/photos?limit=1000").await;
    assert_eq!(page["photos"].as_array().unwrap().len(), 60, "{page}");
    let status = gateway.json("/v1/cluster").await;
    assert_eq!(
        (status["replicas"].as_u64(), status["at_target"].as_u64()),
        (Some(2), Some(60)),
        "{status}"
    );

    // A delete through the gateway removes both copies.
    let (gone, _) = acked.pop_first().unwrap();
    let resp = gateway
        .client()
        .delete(format!("{}/v1/photos/{gone}", gateway.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(gateway.get(&format!("/v1/photos/{gone}")).await.0, 404);
    let mut total = 0;
    for node in &nodes {
        total += stored(node).await;
    }
    assert_eq!(total, 118, "both copies of photo {gone} are dropped");

    // gw-c is killed: uploads that need it answer 503 until its lease runs out, then go to
    // gw-a and gw-b; every photo, old and new, reads back through the gateway.
    nodes[2].kill9();
    let mut after_kill = 0;
    for seed in 100..100 + POLLS {
        let (status, body, sum) = upload(&gateway, seed, Some(TOKEN)).await;
        match status {
            201 => {
                let id = body["id"].as_u64().unwrap();
                assert_eq!(holders(&gateway, id).await, ["gw-a", "gw-b"], "photo {id}");
                acked.insert(id, sum);
                after_kill += 1;
            }
            503 => tokio::time::sleep(POLL).await,
            other => panic!("upload {seed}: {other} {body}\n{}", gateway.log()),
        }
        if after_kill == 20 {
            break;
        }
    }
    assert_eq!(after_kill, 20, "uploads after the kill\n{}", gateway.log());
    assert_eq!(gateway.json("/readyz").await["live_nodes"], 2);
    all_read_back(&gateway, &acked).await;

    // A gateway without the cluster secret is refused by every PipeStore: 503, nothing stored.
    let stranger = Instance::start_gateway(&["--catalog", url, "--replicas", "2"]);
    let (status, body, _) = upload(&stranger, 999, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        stranger
            .get(&format!("/v1/photos/{}", acked.keys().next().unwrap()))
            .await
            .0,
        503
    );

    // An access key made on a PipeStore (the catalog is shared) lets a client through the
    // gateway; once a key exists, a call without one is 401 there too (the gateway checks the
    // keys it holds in memory, reloaded every `key_refresh_ms`: it sees the new key within a
    // refresh).
    let created = nodes[0]
        .client()
        .post(format!("{}/v1/admin/keys", nodes[0].url))
        .json(&serde_json::json!({"name": "uploader", "role": "write"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let key: serde_json::Value = created.json().await.unwrap();
    let secret = key["secret_key"].as_str().unwrap();
    let mut polls = 0;
    while gateway.get("/v1/photos").await.0 != 401 {
        polls += 1;
        assert!(polls < POLLS, "the gateway never saw the new key");
        tokio::time::sleep(POLL).await;
    }
    let (status, body, _) = upload(&gateway, 1000, Some(secret)).await;
    assert_eq!(status, 201, "{body}");
    drop(tuner);
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn a_repair_that_cannot_finish_fails_its_job() {
    on_postgres(
        "repair_stall",
        |url| async move { repair_stall_on(&url).await },
    );
}

/// Two PipeStores with two copies of every photo; one is killed and removed, so no node can
/// take the second copies: the Tuner's repair job fails with `repair_stalled` once nothing has
/// moved for `--repair-stall-ms`, naming what is short, and the CLI says so (exit code 1).
async fn repair_stall_on(url: &str) {
    let tuner = TunerProcess::start_with(&[
        "--catalog",
        url,
        "--node-lease-ms",
        "3000",
        "--repair-stall-ms",
        "2000",
    ]);
    let mut nodes: Vec<Instance> = ["st-a", "st-b"]
        .iter()
        .map(|name| replicated_node(url, &tuner, name, &[]).0)
        .collect();
    tuner.wait_for_nodes(2).await;
    for seed in 0..5 {
        let bytes = jpeg(40, 40, seed);
        let (status, body) = nodes[0].upload(bytes, "").await;
        assert_eq!(status, 201, "{body}");
    }
    nodes[1].kill9();
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "remove", "st-b", "--wait"]);
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains("repair stalled: 5 photos and 0 plain objects are still short of 2 copies")
            && err.contains("(repair_stalled)"),
        "{out}{err}"
    );
}
