//! Secure by default (issue 25): a cluster's processes refuse to run gRPC open unless told to,
//! `ndpipe serve`'s own gRPC needs the secret it made, and the Tuner's HTTP API, standalone or
//! embedded, answers to the same access keys and roles as a PipeStore's `/v1`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ndpipe_proto::pb;
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use serde_json::json;

use crate::common::{Instance, TunerProcess, channel, cli, exe, free_port};

/// Each of `pipestore`, `tuner` and `gateway` exits at once without a cluster secret (or mutual
/// TLS), naming the flag that would let it run open.
#[test]
fn cluster_processes_refuse_to_start_without_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    let starts: [&[&str]; 3] = [
        &["tuner", "--data", data, "--listen", "127.0.0.1:0"],
        &["pipestore", "--data", data, "--tuner", "http://127.0.0.1:9"],
        &["gateway", "--catalog", "postgres://nobody@127.0.0.1:9/none"],
    ];
    for args in starts {
        let (ok, _, err) = cli(args);
        assert!(!ok, "{args:?} started");
        assert!(err.contains("--insecure-cluster"), "{args:?}: {err}");
        assert!(err.contains("--cluster-secret-file"), "{args:?}: {err}");
    }
}

/// A node without a model runs no gRPC service, so it could never join a Tuner: refused.
#[test]
fn a_pipestore_without_a_model_cannot_join_a_tuner() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let (ok, _, err) = cli(&[
        "pipestore",
        "--data",
        data.to_str().unwrap(),
        "--no-model",
        "--tuner",
        "http://127.0.0.1:9",
        "--replicas",
        "2",
        "--insecure-cluster",
    ]);
    assert!(!ok);
    assert!(err.contains("--no-model cannot join a Tuner"), "{err}");
}

/// `--insecure-cluster` runs, says so in the log and in `/healthz`.
#[tokio::test]
async fn an_insecure_tuner_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut child = Command::new(exe())
        .args(["tuner", "--insecure-cluster", "--data"])
        .arg(dir.path().join("tuner"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--grpc-listen", "127.0.0.1:0"])
        .env_remove("NDPIPE_CLUSTER_SECRET_FILE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/healthz");
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        if let Ok(r) = reqwest::get(&url).await {
            break r.json::<serde_json::Value>().await.unwrap();
        }
        assert!(Instant::now() < deadline, "the tuner did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(health["insecure_cluster"], true, "{health}");
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        log.contains("insecure cluster (--insecure-cluster)"),
        "{log}"
    );
}

/// `ndpipe serve` makes a secret of its own (0600, kept across restarts) and its gRPC, bound to
/// loopback, refuses every call without it.
#[tokio::test]
async fn serve_makes_its_own_secret_and_its_grpc_refuses_calls_without_it() {
    use std::os::unix::fs::PermissionsExt;

    let mut inst = Instance::launch_with_own_secret(&[
        "--model-dir",
        crate::common::model_dir().to_str().unwrap(),
        "--intra-threads",
        "1",
    ]);
    let path = inst.data.join("cluster.secret");
    let secret = std::fs::read_to_string(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let health: serde_json::Value = inst.json("/healthz").await;
    assert_eq!(health["insecure_cluster"], false, "{health}");

    let url = grpc_url(&inst.log());
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let mut stranger = PipeStoreClient::new(channel(&url).await);
    let refused = stranger
        .inventory(pb::InventoryRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let mut request = tonic::Request::new(pb::InventoryRequest::default());
    request
        .metadata_mut()
        .insert("x-ndpipe-cluster-secret", secret.trim().parse().unwrap());
    assert!(stranger.inventory(request).await.is_ok(), "with the secret");

    inst.restart();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), secret, "reused");
}

/// The last gRPC URL a server's log announces.
fn grpc_url(log: &str) -> String {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("gRPC service listening"))
        .unwrap_or_else(|| panic!("no gRPC address in the log: {log}"));
    let start = line.find("http").unwrap();
    line[start..]
        .split(|c: char| c.is_whitespace() || c == '\u{1b}')
        .next()
        .unwrap()
        .to_string()
}

/// Who asks, and the statuses a read (`GET /v1/tuner/nodes`) and a write (draining a node that
/// does not exist: 404 once allowed) get.
type Row<'a> = (&'a str, Option<&'a str>, (u16, u16));

async fn check_matrix(base: &str, rows: &[Row<'_>]) {
    let client = reqwest::Client::new();
    for (who, bearer, expected) in rows {
        let with = |r: reqwest::RequestBuilder| match bearer {
            Some(b) => r.bearer_auth(b),
            None => r,
        };
        let read = with(client.get(format!("{base}/v1/tuner/nodes")))
            .send()
            .await
            .unwrap();
        let write = with(client.post(format!("{base}/v1/tuner/nodes/nobody/drain")))
            .send()
            .await
            .unwrap();
        let got = (read.status().as_u16(), write.status().as_u16());
        let body = write.text().await.unwrap();
        assert_eq!(got, *expected, "{who} at {base}: {body}");
        assert!(body.starts_with('{'), "{who}: a JSON body: {body}");
    }
}

/// A key made with `ndpipe keys --data DIR` (a read or admin role): its secret.
fn offline_key(data: &std::path::Path, name: &str, role: &str) -> String {
    let (ok, out, err) = cli(&[
        "keys",
        "--data",
        data.to_str().unwrap(),
        "create",
        "--name",
        name,
        "--role",
        role,
    ]);
    assert!(ok, "{err}");
    let key: serde_json::Value = serde_json::from_str(&out).unwrap();
    key["secret_key"].as_str().unwrap().to_string()
}

/// A standalone Tuner on the catalog that holds the keys: before any key, reads are open and
/// writes need the token; after, reads need a key, writes an admin key or the token.
#[tokio::test]
async fn a_standalone_tuner_applies_access_keys_and_roles() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let catalog = keys.join("catalog.sqlite");
    let token = dir.path().join("token");
    std::fs::write(&token, "the-admin-token\n").unwrap();
    let tuner = TunerProcess::start_with(&[
        "--catalog",
        catalog.to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
    ]);
    check_matrix(
        &tuner.url,
        &[
            ("no key, none exist", None, (200, 401)),
            ("the token", Some("the-admin-token"), (200, 404)),
        ],
    )
    .await;
    let reader = offline_key(&keys, "reader", "read");
    let writer = offline_key(&keys, "writer", "write");
    let admin = offline_key(&keys, "admin", "admin");
    // The Tuner holds the keys in memory and reloads them every few seconds: the first keys,
    // made by another process, close it within a refresh.
    let mut polls = 0;
    while reqwest::get(format!("{}/v1/tuner/nodes", tuner.url))
        .await
        .unwrap()
        .status()
        != 401
    {
        polls += 1;
        assert!(polls < 300, "the Tuner never saw the keys");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    check_matrix(
        &tuner.url,
        &[
            ("no key", None, (401, 401)),
            ("a wrong key", Some("guessed"), (401, 401)),
            ("a read key", Some(&reader), (200, 403)),
            ("a write key", Some(&writer), (200, 403)),
            ("an admin key", Some(&admin), (200, 404)),
            ("the token", Some("the-admin-token"), (200, 404)),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    for path in [
        "/v1/tuner/versions",
        "/v1/tuner/jobs",
        "/metrics",
        "/v1/search?label=x",
    ] {
        let status = client
            .get(format!("{}{path}", tuner.url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401, "{path} without a key");
    }
    for path in ["/healthz", "/readyz"] {
        let status = reqwest::get(format!("{}{path}", tuner.url))
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{path} stays open");
    }
}

/// The Tuner inside `ndpipe serve` answers to the same keys: an admin key drains as the token
/// does (it used to be refused), and a 405 there has a JSON body.
#[tokio::test]
async fn the_embedded_tuner_applies_access_keys_and_roles() {
    let inst = Instance::start_with_model(&["--token", "the-admin-token"]);
    check_matrix(
        &inst.url,
        &[
            ("no key, none exist", None, (200, 401)),
            ("the token", Some("the-admin-token"), (200, 404)),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let mut secrets = Vec::new();
    for (name, role) in [("reader", "read"), ("writer", "write"), ("admin", "admin")] {
        let key: serde_json::Value = client
            .post(format!("{}/v1/admin/keys", inst.url))
            .bearer_auth("the-admin-token")
            .json(&json!({"name": name, "role": role}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        secrets.push(key["secret_key"].as_str().unwrap().to_string());
    }
    check_matrix(
        &inst.url,
        &[
            ("no key", None, (401, 401)),
            ("a read key", Some(&secrets[0]), (200, 403)),
            ("a write key", Some(&secrets[1]), (200, 403)),
            ("an admin key", Some(&secrets[2]), (200, 404)),
            ("the token", Some("the-admin-token"), (200, 404)),
        ],
    )
    .await;
    let wrong = client
        .delete(format!("{}/v1/tuner/jobs", inst.url))
        .bearer_auth(&secrets[2])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    let body: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(body["error"], "method_not_allowed", "{body}");
}
