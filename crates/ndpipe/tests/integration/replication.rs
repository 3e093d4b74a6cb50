//! Three PipeStores on one PostgreSQL catalog with two copies of every photo, as real
//! processes: uploads through one front door land on two nodes each, spread evenly; a node
//! killed during continuous uploads loses no acknowledged photo; after its removal repair
//! brings every photo back to two copies; a delete while a node is away stays a delete when it
//! returns; a flipped byte in one copy is read around and repaired; S3 objects go through the
//! front door (a fine-tune losing a node: `replicated_finetune`). Time limits are hang
//! guards.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::{Instance, TunerProcess, cli, free_port, jpeg, on_postgres, sha256};
use crate::replica_features::features_of;
use crate::s3::{boto3_at, unsigned_aws};

const NAMES: [&str; 3] = ["rp-a", "rp-b", "rp-c"];
/// Pause between two looks at something the cluster does in the background.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// Looks before a wait counts as a hang (a bounded count, not a clock).
pub(crate) const POLLS: u32 = 1500;

/// A metric's value from a node's `/metrics` (0 when absent).
pub(crate) async fn metric(node: &Instance, name: &str) -> f64 {
    let (_, body) = node.get("/metrics").await;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Photos in a node's store (copies included), from `/healthz`.
async fn stored(node: &Instance) -> u64 {
    node.json("/healthz").await["photos"].as_u64().unwrap()
}

/// The nodes holding photo `id`, from a node's `GET /v1/photos/{id}/meta`.
pub(crate) async fn copies(node: &Instance, id: u64) -> Vec<String> {
    let meta = node.json(&format!("/v1/photos/{id}/meta")).await;
    meta["copies"]
        .as_array()
        .unwrap_or_else(|| panic!("{meta}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

/// Reads every photo of `acked` through `node` and checks its bytes.
async fn all_read_back(node: &Instance, acked: &BTreeMap<u64, String>) {
    for (id, sum) in acked {
        let (status, body) = node.get(&format!("/v1/photos/{id}")).await;
        assert_eq!(
            status,
            200,
            "photo {id} through {}\n{}",
            node.url,
            node.log()
        );
        assert_eq!(&sha256(&body), sum, "photo {id} through {}", node.url);
    }
}

/// Uploads photo number `seed` through `node`: its id and checksum on a 201.
pub(crate) async fn upload(
    node: &Instance,
    seed: u32,
) -> Result<(u64, String), (u16, serde_json::Value)> {
    // Distinct bytes for every seed (the pattern repeats every 256 seeds).
    let bytes = jpeg(48 + seed % 16, 40 + seed / 256, seed);
    let sum = sha256(&bytes);
    match node.upload(bytes, "").await {
        (201, reply) => Ok((reply["id"].as_u64().unwrap(), sum)),
        other => Err(other),
    }
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn two_copies_survive_a_lost_node_and_a_flipped_byte() {
    on_postgres(
        "replication",
        |url| async move { replicated_on(&url).await },
    );
}

/// A Tuner and the three PipeStores with two copies of every photo, each with S3 on the port
/// returned beside it.
pub(crate) fn replicated_cluster(url: &str) -> (TunerProcess, Vec<Instance>, Vec<u16>) {
    cluster_of(url, &NAMES, &[])
}

/// A Tuner and PipeStores `names` with two copies of every photo, each with S3 on the port
/// returned beside it; `extra` goes to the Tuner and to every PipeStore.
pub(crate) fn cluster_of(
    url: &str,
    names: &[&str],
    extra: &[&str],
) -> (TunerProcess, Vec<Instance>, Vec<u16>) {
    let mut tuner_flags = vec!["--catalog", url, "--node-lease-ms", "3000"];
    tuner_flags.extend_from_slice(extra);
    let tuner = TunerProcess::start_with(&tuner_flags);
    let (nodes, s3_ports) = names
        .iter()
        .map(|name| replicated_node(url, &tuner, name, extra))
        .unzip();
    (tuner, nodes, s3_ports)
}

/// PipeStore `name` of a cluster with two copies of every photo, with `extra` flags (which
/// take the place of the same two-copy settings) and S3 on the port returned beside it.
pub(crate) fn replicated_node(
    url: &str,
    tuner: &TunerProcess,
    name: &str,
    extra: &[&str],
) -> (Instance, u16) {
    let port = free_port();
    let s3 = format!("127.0.0.1:{port}");
    let mut flags = vec!["--catalog", url, "--s3-listen", s3.as_str()];
    // The two-copy settings, but those `extra` gives otherwise.
    for setting in faultbench::TWO_COPIES.chunks(2) {
        if !extra.contains(&setting[0]) {
            flags.extend(setting);
        }
    }
    flags.extend_from_slice(extra);
    (Instance::start_pipestore(&tuner.grpc, name, &flags), port)
}

async fn replicated_on(url: &str) {
    let (tuner, mut nodes, s3_ports) = replicated_cluster(url);
    tuner.wait_for_nodes(3).await;

    // Placement: 300 uploads through one front door, two copies each, spread within 15%.
    let mut acked = BTreeMap::new();
    for seed in 0..300 {
        let (id, sum) = upload(&nodes[0], seed)
            .await
            .unwrap_or_else(|e| panic!("upload {seed}: {e:?}\n{}", nodes[0].log()));
        acked.insert(id, sum);
    }
    let mut per_node = Vec::new();
    for node in &nodes {
        per_node.push(stored(node).await);
    }
    assert_eq!(per_node.iter().sum::<u64>(), 600, "{per_node:?}");
    for n in &per_node {
        assert!((170..=230).contains(n), "copies per node {per_node:?}");
    }
    let first = *acked.keys().next().unwrap();
    let holders = copies(&nodes[1], first).await;
    assert_eq!(holders.len(), 2, "{holders:?}");
    // Any node lists every node's photos, each with its two holders.
    let page = nodes[2].json("/v1/photos?limit=1000").await;
    let listed = page["photos"].as_array().unwrap();
    assert_eq!(listed.len(), 300, "{page}");
    assert!(
        listed
            .iter()
            .all(|p| p["copies"].as_array().unwrap().len() == 2),
        "{page}"
    );

    // S3 through the front door: an object put through rp-a reads back through every node,
    // and a delete through rp-c removes it everywhere.
    let endpoints: Vec<String> = s3_ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let object = jpeg(300, 200, 77);
    let file = dir.path().join("cat.jpg");
    std::fs::write(&file, &object).unwrap();
    aws(&endpoints[0], &["s3", "mb", "s3://photos"]);
    aws(
        &endpoints[0],
        &["s3", "cp", file.to_str().unwrap(), "s3://photos/cat.jpg"],
    );
    for (i, endpoint) in endpoints.iter().enumerate() {
        let back = dir.path().join(format!("back-{i}.jpg"));
        aws(
            endpoint,
            &["s3", "cp", "s3://photos/cat.jpg", back.to_str().unwrap()],
        );
        assert_eq!(std::fs::read(&back).unwrap(), object, "through {endpoint}");
    }
    aws(&endpoints[2], &["s3", "rm", "s3://photos/cat.jpg"]);
    let gone = unsigned_aws(
        &endpoints[1],
        &[
            "s3api",
            "head-object",
            "--bucket",
            "photos",
            "--key",
            "cat.jpg",
        ],
    );
    assert!(!gone.0, "the object is deleted: {gone:?}");
    let total: u64 = futures::future::join_all(nodes.iter().map(stored))
        .await
        .iter()
        .sum();
    assert_eq!(total, 600, "the object's two copies are gone");

    // rp-c is killed during continuous uploads through rp-a and rp-b: uploads that need it fail
    // with a 503 until its lease runs out, then go on without it; every 201 reads back.
    let mut failed = HashMap::new();
    let mut after_kill = 0;
    for seed in 300..3000u32 {
        if seed == 330 {
            nodes[2].kill9();
        }
        let door = &nodes[(seed % 2) as usize];
        match upload(door, seed).await {
            Ok((id, sum)) => {
                acked.insert(id, sum);
                after_kill += u32::from(seed > 330);
            }
            Err((status, body)) => {
                assert_eq!(status, 503, "{body}");
                let kind = body["error"].as_str().unwrap().to_string();
                *failed.entry(kind).or_insert(0) += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if after_kill == 60 {
            break;
        }
    }
    assert_eq!(
        after_kill, 60,
        "uploads after the kill; failures {failed:?}"
    );
    all_read_back(&nodes[0], &acked).await;
    all_read_back(&nodes[1], &acked).await;

    // rp-c is removed: repair copies what it held to the survivors, two copies each, and the
    // Tuner's repair job follows it to the end.
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "remove", "rp-c", "--wait"]);
    assert!(ok, "{out}{err}");
    let report = out.lines().last().unwrap_or_default();
    assert!(
        report.starts_with("repair after removing rp-c done in ")
            && report.ends_with("back at 2 copies; 0 photos and 0 plain objects lost"),
        "{out}"
    );
    let short: u64 = report
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        short > 100,
        "rp-c held about two thirds of the photos: {report}"
    );
    let jobs = tuner.get("/v1/tuner/jobs").await;
    let repair = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["kind"] == "repair")
        .unwrap_or_else(|| panic!("{jobs}"));
    assert_eq!(
        (
            repair["phase"].as_str(),
            repair["result"]["repair"]["photos_lost"].as_u64()
        ),
        (Some("done"), Some(0)),
        "{repair}"
    );
    for attempt in 0.. {
        let (a, b) = (stored(&nodes[0]).await, stored(&nodes[1]).await);
        if a == acked.len() as u64 && b == acked.len() as u64 {
            break;
        }
        assert!(
            attempt < POLLS,
            "after repair {a} and {b} of {}",
            acked.len()
        );
        tokio::time::sleep(POLL).await;
    }
    let under = "ndpipe_store_replication_photos_under_replicated";
    let mut polls = 0;
    while metric(&nodes[0], under).await > 0.0
        || metric(&nodes[0], "ndpipe_store_replication_photos_lost").await > 0.0
    {
        polls += 1;
        assert!(polls < POLLS, "copy counts do not settle");
        tokio::time::sleep(POLL).await;
    }
    assert!(
        metric(&nodes[0], "ndpipe_store_replication_copies_made_total").await
            + metric(&nodes[1], "ndpipe_store_replication_copies_made_total").await
            > 0.0
    );
    all_read_back(&nodes[1], &acked).await;
    let (ok, out, err) = cli(&["cluster", "--server", &nodes[0].url, "status"]);
    assert!(ok, "{out}{err}");
    let line = format!(
        "replicas 2: {} photos at target, 0 under-replicated, 0 lost",
        acked.len()
    );
    assert!(out.starts_with(&line), "{out}");

    // A delete while rp-b is away: when it returns, the photo stays deleted.
    let (gone, _) = acked.pop_first().unwrap();
    nodes[1].kill9();
    let resp = nodes[0]
        .client()
        .delete(format!("{}/v1/photos/{gone}", nodes[0].url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    nodes[1].restart();
    for node in &nodes[..2] {
        assert_eq!(node.get(&format!("/v1/photos/{gone}")).await.0, 404);
        assert_eq!(node.get(&format!("/v1/photos/{gone}/meta")).await.0, 404);
        assert_eq!(stored(node).await, acked.len() as u64, "{}", node.log());
    }
    // The same while rp-b is stopped (SIGSTOP), not restarted: its worker drops the copy soon
    // after it runs again.
    let (gone, _) = acked.pop_first().unwrap();
    nodes[1].signal("STOP");
    let resp = nodes[0]
        .client()
        .delete(format!("{}/v1/photos/{gone}", nodes[0].url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    nodes[1].signal("CONT");
    let mut polls = 0;
    while stored(&nodes[1]).await != acked.len() as u64 {
        polls += 1;
        assert!(
            polls < POLLS,
            "rp-b keeps a deleted photo\n{}",
            nodes[1].log()
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(nodes[1].get(&format!("/v1/photos/{gone}")).await.0, 404);

    // One byte flipped in rp-b's copy of a photo: the read through rp-b is still right, and
    // the copy is repaired (it reads right with rp-a gone).
    let (victim, sum) = acked
        .iter()
        .next_back()
        .map(|(i, s)| (*i, s.clone()))
        .unwrap();
    let original = nodes[0].get(&format!("/v1/photos/{victim}")).await.1;
    flip_a_byte(&nodes[1], &original);
    let (status, body) = nodes[1].get(&format!("/v1/photos/{victim}")).await;
    assert_eq!((status, sha256(&body)), (200, sum.clone()));
    assert!(metric(&nodes[1], "ndpipe_store_replication_repaired_total").await >= 1.0);
    nodes[0].kill9();
    let (status, body) = nodes[1].get(&format!("/v1/photos/{victim}")).await;
    assert_eq!((status, sha256(&body)), (200, sum), "{}", nodes[1].log());
    drop(tuner);
}

#[test]
fn a_new_node_takes_its_share_of_the_photos() {
    on_postgres("rebalance", |url| async move { rebalanced_on(&url).await });
}

/// Two nodes hold 100 photos with two copies each; a third joins and rebalancing moves its
/// share to it: every node within 15% of an even share, every photo at exactly two copies, and
/// every photo reads back through every node. Drained, the third node gives its copies back.
async fn rebalanced_on(url: &str) {
    let (tuner, mut nodes, s3_ports) = cluster_of(url, &NAMES[..2], &[]);
    tuner.wait_for_nodes(2).await;
    let mut acked = BTreeMap::new();
    for seed in 0..100 {
        let (id, sum) = upload(&nodes[0], seed)
            .await
            .unwrap_or_else(|e| panic!("upload {seed}: {e:?}\n{}", nodes[0].log()));
        acked.insert(id, sum);
    }
    // And 60 plain objects (sidecars) through rp-a's S3 API, on both nodes.
    let s3_a = format!("http://127.0.0.1:{}", s3_ports[0]);
    let put = boto3_at(
        &[&s3_a],
        "s3.create_bucket(Bucket='side')\n\
         for i in range(60):\n\
         \x20   s3.put_object(Bucket='side', Key=f'{i}.json', Body=json.dumps({'n': i}).encode())\n\
         print('{}')",
    );
    assert!(put.is_ok(), "{put:?}\n{}", nodes[0].log());
    let (node_c, s3_c) = replicated_node(url, &tuner, NAMES[2], &[]);
    nodes.push(node_c);
    tuner.wait_for_nodes(3).await;
    // 200 copies on three nodes: 66.7 each, within 15%.
    let even = 200.0 / 3.0;
    let mut polls = 0;
    loop {
        let counts = futures::future::join_all(nodes.iter().map(stored)).await;
        let shared = counts.iter().sum::<u64>() == 200
            && counts
                .iter()
                .all(|&c| (c as f64 - even).abs() <= 0.15 * even);
        let page = nodes[2].json("/v1/photos?limit=1000").await;
        let listed = page["photos"].as_array().unwrap();
        let two_each = listed.len() == 100
            && listed
                .iter()
                .all(|p| p["copies"].as_array().unwrap().len() == 2);
        if shared && two_each {
            break;
        }
        polls += 1;
        assert!(
            polls < POLLS,
            "copies per node {counts:?}\n{}",
            nodes[0].log()
        );
        tokio::time::sleep(POLL).await;
    }
    // The plain objects spread too: 120 files, two per object, a share of them on rp-c (40
    // on average; fewer than 20 would be five standard deviations below), every one intact
    // through rp-c.
    let mut polls = 0;
    loop {
        let files: Vec<usize> = nodes.iter().map(|n| n.plain_object_files().len()).collect();
        if files.iter().sum::<usize>() == 120 && files[2] >= 20 {
            break;
        }
        polls += 1;
        assert!(polls < POLLS, "plain objects per node {files:?}");
        tokio::time::sleep(POLL).await;
    }
    let read = boto3_at(
        &[&format!("http://127.0.0.1:{s3_c}")],
        "print(json.dumps([json.loads(s3.get_object(Bucket='side', Key=f'{i}.json')['Body'].read())['n'] for i in range(60)]))",
    );
    assert_eq!(read, Ok(serde_json::json!((0..60).collect::<Vec<_>>())));
    let mut moved = 0.0;
    for node in &nodes {
        moved += metric(node, "ndpipe_store_replication_rebalanced_total").await;
    }
    assert!(moved >= 70.0, "{moved} photos and plain objects moved");
    for node in &nodes {
        all_read_back(node, &acked).await;
    }
    let (ok, out, err) = cli(&["cluster", "--server", &nodes[2].url, "status"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("replicas 2: 100 photos at target, 0 under-replicated, 0 lost"),
        "{out}"
    );

    // The third node drained: its copies move back to the other two.
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "drain", NAMES[2]]);
    assert!(ok, "{out}{err}");
    let mut polls = 0;
    loop {
        let counts = futures::future::join_all(nodes.iter().map(stored)).await;
        let files: Vec<usize> = nodes.iter().map(|n| n.plain_object_files().len()).collect();
        if counts == [100, 100, 0] && files == [60, 60, 0] {
            break;
        }
        polls += 1;
        assert!(
            polls < POLLS,
            "copies per node {counts:?}, plain objects {files:?} after the drain"
        );
        tokio::time::sleep(POLL).await;
    }
    all_read_back(&nodes[0], &acked).await;
    // Rebalancing's copies carry the features too: a copy released to rp-c came back with
    // them (a released copy's features go with it).
    for node in &mut nodes {
        node.kill9();
    }
    let ids: Vec<u64> = acked.keys().copied().collect();
    let (a, b) = (features_of(&nodes[0], &ids), features_of(&nodes[1], &ids));
    for id in &ids {
        assert_eq!(a[id].len(), 1, "photo {id} on rp-a: {:?}", a[id].len());
        assert_eq!(a[id], b[id], "photo {id}: the holders' features differ");
    }
}

/// [`unsigned_aws`], which must succeed.
fn aws(endpoint: &str, args: &[&str]) {
    let (ok, out, err) = unsigned_aws(endpoint, args);
    assert!(ok, "aws {args:?} at {endpoint}: {out}{err}");
}

/// Flips one byte in the middle of `original` where it lies in `node`'s photo volumes.
fn flip_a_byte(node: &Instance, original: &[u8]) {
    for path in node.volumes("photos") {
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(original.len()).position(|w| w == original) {
            bytes[at + original.len() / 2] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
            return;
        }
    }
    panic!("the photo is in none of {}'s volumes", node.url);
}
