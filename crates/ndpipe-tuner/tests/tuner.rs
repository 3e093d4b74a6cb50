//! The Tuner's servers end to end, without PipeStores: the HTTP API's errors, registration and
//! heartbeats over gRPC, membership changes, and a background job that fails. Who may call the
//! HTTP API is the PipeStores' guard's concern, tested with real processes in `ndpipe`'s
//! integration tests (`tuner_access`).

use std::net::SocketAddr;
use std::sync::Arc;

use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::tuner_client::TunerClient;
use ndpipe_proto::pb::{HeartbeatRequest, RegisterRequest};
use ndpipe_tuner::{Config, NodeView, Tuner, TunerError};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request; returns the status and the JSON body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: tuner\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{auth}\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply[9..12].parse().unwrap();
    let (_, body) = reply.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn config(dir: &std::path::Path) -> Config {
    Config {
        data: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        token: Some("s3cret".into()),
        node_timeout_ms: 1_000,
        ..Config::default()
    }
}

#[tokio::test]
async fn the_http_api_maps_errors_and_nodes_register_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let tuner = Arc::new(Tuner::open(&config).unwrap());
    let running = tuner.clone().start(&config, |r| r).await.unwrap();
    let addr = running.http_addr();
    let token = Some("s3cret");

    assert_eq!(
        http(addr, "GET", "/v1/tuner/nodes", None, "").await,
        (200, json!([]))
    );
    assert_eq!(
        http(addr, "GET", "/v1/tuner/versions", None, "").await,
        (200, json!([]))
    );
    let fifo = r#"{"cache_policy": "fifo"}"#;
    let (status, body) = http(addr, "POST", "/v1/tuner/finetune", token, fifo).await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("bad_body")),
        "{body}"
    );
    let (status, body) = http(addr, "POST", "/v1/tuner/finetune", token, "{}").await;
    assert_eq!(
        (status, &body["error"]),
        (409, &json!("no_nodes")),
        "{body}"
    );
    let (status, body) = http(addr, "POST", "/v1/tuner/deploy/nope", token, "{}").await;
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("unknown_model")),
        "{body}"
    );
    let runs = r#"{"runs": 0, "mode": ""}"#;
    let (status, body) = http(addr, "POST", "/v1/tuner/finetune", token, runs).await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_request")),
        "{body}"
    );

    let mut client = TunerClient::connect(format!("http://{}", running.grpc_addr()))
        .await
        .unwrap();
    let register = |name: &str| RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        grpc_url: "http://127.0.0.1:9".into(),
        name: name.into(),
        active_version: "pretrained-1".into(),
        replicas: 1,
    };
    let reply = client
        .register(register("ps-a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.node_id, 1);
    assert_eq!(reply.active_version, "", "no version is active yet");
    assert_eq!(reply.heartbeat_ms, 5_000, "three beats per 15 s lease");
    let beat = |node_id, name: &str| HeartbeatRequest {
        node_id,
        name: name.into(),
        active_version: "pretrained-1".into(),
        replicas: 1,
    };
    client.heartbeat(beat(1, "ps-a")).await.unwrap();
    let unknown = client.heartbeat(beat(7, "ps-a")).await.unwrap_err();
    assert_eq!(
        unknown.code(),
        tonic::Code::NotFound,
        "not registered: register again"
    );
    let unnamed = client.register(register(" ")).await.unwrap_err();
    assert_eq!(unnamed.code(), tonic::Code::InvalidArgument);
    let old = RegisterRequest {
        protocol_version: PROTOCOL_VERSION + 1,
        ..register("ps-b")
    };
    let refused = client.register(old).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        tuner.register_node("ps-b", "http://127.0.0.1:10").unwrap(),
        2
    );

    let (status, nodes) = http(addr, "GET", "/v1/tuner/nodes", None, "").await;
    assert_eq!(status, 200);
    let typed: Vec<NodeView> = serde_json::from_value(nodes.clone()).unwrap();
    assert_eq!(typed, tuner.nodes().unwrap());
    let summary: Vec<(u32, &str, &str, bool, Option<&str>)> = typed
        .iter()
        .map(|n| {
            let state = if n.state == ndpipe_catalog::NodeState::Active {
                "active"
            } else {
                "draining"
            };
            (n.id, n.name.as_str(), state, n.live, n.version.as_deref())
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "ps-a", "active", true, Some("pretrained-1")),
            (2, "ps-b", "active", true, None)
        ]
    );
    assert_eq!(nodes[0]["state"], "active");

    // A job runs in the background: 202 with its id; ps-a does not answer, so it fails, naming
    // it, and the next job may start.
    let (status, job) = http(addr, "POST", "/v1/tuner/finetune", token, "{}").await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(
        (&job["kind"], &job["phase"]),
        (&json!("finetune"), &json!("surveying"))
    );
    let path = format!("/v1/tuner/jobs/{}", job["id"].as_str().unwrap());
    let failed = loop {
        let (status, view) = http(addr, "GET", &path, None, "").await;
        assert_eq!(status, 200, "{view}");
        if view["phase"] == "failed" {
            break view;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(failed["error"]["kind"], "node_failed", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ps-a"),
        "{failed}"
    );
    let (status, jobs) = http(addr, "GET", "/v1/tuner/jobs", None, "").await;
    assert_eq!((status, jobs.as_array().unwrap().len()), (200, 1));
    let (status, body) = http(addr, "GET", "/v1/tuner/jobs/nope", None, "").await;
    assert_eq!((status, &body["error"]), (404, &json!("unknown_job")));

    // Membership: drain, activate, remove.
    let drain = "/v1/tuner/nodes/ps-b/drain";
    let (status, node) = http(addr, "POST", drain, token, "").await;
    assert_eq!(
        (status, &node["state"]),
        (200, &json!("draining")),
        "{node}"
    );
    let (status, node) = http(addr, "POST", "/v1/tuner/nodes/ps-b/activate", token, "").await;
    assert_eq!((status, &node["state"]), (200, &json!("active")), "{node}");
    let (status, removed) = http(addr, "DELETE", "/v1/tuner/nodes/ps-b", token, "").await;
    assert_eq!(
        (status, &removed["removed"], &removed["repair_job"]),
        (200, &json!("ps-b"), &json!(null)),
        "no repair job without a shared catalog: {removed}"
    );
    let (status, body) = http(addr, "DELETE", "/v1/tuner/nodes/ps-b", token, "").await;
    assert_eq!((status, &body["error"]), (404, &json!("unknown_node")));
    assert_eq!(tuner.nodes().unwrap().len(), 1);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_token_comes_from_the_token_file_when_not_given() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-file\n").unwrap();
    let config = Config {
        token: None,
        token_file: Some(file),
        ..config(&dir.path().join("data"))
    };
    assert_eq!(Tuner::open(&config).unwrap().token(), Some("from-file"));

    let missing = Config {
        token_file: Some(dir.path().join("absent")),
        ..config
    };
    assert!(matches!(Tuner::open(&missing), Err(TunerError::Io { .. })));
}
