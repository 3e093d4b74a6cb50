//! The cluster's control plane with real processes: a stalled PipeStore fails the job by name
//! within the node timeout, a Tuner restart needs no PipeStore restart (and fails the fine-tune
//! it interrupted, with the reason), a node gone for good is left out and removed, a client going away does not
//! cancel a job, a node that missed a commit ends on the active version, and without the
//! cluster secret no gRPC method answers. Assertions are on outcomes; time limits are hang
//! guards only.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Instance, TunerProcess, cli, exe, import_fashion};
use crate::tuner::wait_extracting;

/// A small, slow-enough job: ps-b extracts at 20 photos/s, in chunks of 8.
fn throttled() -> serde_json::Value {
    serde_json::json!({
        "runs": 2, "epochs": 2, "chunk_size": 8, "load_balance": false, "deploy": false,
        "throttle": {"ps-b": 20.0}
    })
}

fn quick() -> serde_json::Value {
    serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false, "deploy": false})
}

/// Polls the node list until `ready` holds (a hang guard fails the test after 60 s).
async fn wait_nodes(
    tuner: &TunerProcess,
    what: &str,
    ready: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = tuner.get("/v1/tuner/nodes").await;
        let nodes = nodes.as_array().unwrap().clone();
        if ready(&nodes) {
            return nodes;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {nodes:?}\n{}",
            tuner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn node<'a>(nodes: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    nodes.iter().find(|n| n["name"] == name).unwrap()
}

fn done(status: u16, job: &serde_json::Value, log: &str) {
    assert_eq!(
        (status, &job["phase"]),
        (202, &serde_json::json!("done")),
        "{job}\n{log}"
    );
}

#[tokio::test]
async fn a_stopped_node_fails_the_job_by_name_and_the_next_job_runs_after_it_continues() {
    let tuner = TunerProcess::start_with(&["--node-timeout-ms", "3000"]);
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 70);
    import_fashion(&b, 70, 70);
    tuner.wait_for_nodes(2).await;

    let (status, job) = tuner.post("/v1/tuner/finetune", throttled()).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_extracting(&tuner, &id, "ps-b").await;
    b.signal("STOP");
    let job = tuner.wait_job(&id).await;
    b.signal("CONT");
    assert_eq!(job["phase"], "failed", "{job}");
    assert_eq!(job["error"]["kind"], "node_failed", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ps-b") && message.contains("3000 ms"),
        "the silent node is named: {message}"
    );

    let (status, job) = tuner.run_job("/v1/tuner/finetune", quick()).await;
    done(status, &job, &tuner.log());
    assert_eq!(
        job["result"]["finetune"]["nodes"].as_array().unwrap().len(),
        2
    );
}

#[tokio::test]
async fn a_tuner_restart_fails_the_job_it_interrupted_and_needs_no_pipestore_restart() {
    let mut tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 70);
    import_fashion(&b, 70, 70);
    let before = tuner.wait_for_nodes(2).await;

    let (status, job) = tuner.post("/v1/tuner/finetune", throttled()).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_extracting(&tuner, &id, "ps-b").await;
    let restarted_ms = ndpipe_util::time::now_ms();
    tuner.restart();

    let job = tuner.get(&format!("/v1/tuner/jobs/{id}")).await;
    assert_eq!(
        (&job["phase"], &job["resumed"]),
        (&"failed".into(), &1.into()),
        "{job}"
    );
    assert_eq!(
        (&job["error"]["kind"], &job["error"]["message"]),
        (
            &serde_json::json!("interrupted"),
            &serde_json::json!(
                "the Tuner restarted while the fine-tune's features were in memory; start it again"
            )
        ),
        "{job}"
    );
    // Both PipeStores find the new Tuner by themselves, under their ids.
    let after = wait_nodes(&tuner, "heartbeats after the restart", |nodes| {
        nodes.len() == 2
            && nodes
                .iter()
                .all(|n| n["live"] == true && n["last_seen_ms"].as_i64().unwrap() > restarted_ms)
    })
    .await;
    for name in ["ps-a", "ps-b"] {
        let old = before
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap();
        assert_eq!(node(&after, name)["id"], old["id"]);
    }
    let (status, job) = tuner.run_job("/v1/tuner/finetune", quick()).await;
    done(status, &job, &tuner.log());
}

#[tokio::test]
async fn a_node_gone_for_good_is_left_out_then_removed_and_jobs_run_on_the_rest() {
    let tuner = TunerProcess::start_with(&["--node-lease-ms", "3000"]);
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let mut b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 70);
    import_fashion(&b, 70, 70);
    tuner.wait_for_nodes(2).await;
    b.kill9();
    wait_nodes(&tuner, "ps-b's lease runs out", |nodes| {
        node(nodes, "ps-b")["live"] == false
    })
    .await;

    // Not waited for: the job runs on ps-a and reports ps-b.
    let (status, job) = tuner.run_job("/v1/tuner/finetune", quick()).await;
    done(status, &job, &tuner.log());
    let report = &job["result"]["finetune"];
    assert_eq!(report["nodes"].as_array().unwrap().len(), 1, "{report}");
    let skipped = report["skipped"][0].as_str().unwrap();
    assert!(
        skipped.contains("ps-b") && skipped.contains("lease"),
        "{report}"
    );

    // The operator removes it with the CLI; drain and activate the one left.
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "remove", "ps-b"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "list"]);
    assert!(
        ok && out.contains("ps-a") && !out.contains("ps-b"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "drain", "ps-a"]);
    assert!(ok && out.contains("draining"), "{out}{err}");
    let (status, refused) = tuner.post("/v1/tuner/finetune", quick()).await;
    assert_eq!(
        (status, &refused["error"]),
        (409, &serde_json::json!("no_nodes")),
        "{refused}"
    );
    assert!(
        refused["message"].as_str().unwrap().contains("draining"),
        "{refused}"
    );
    let (ok, out, err) = cli(&["nodes", "--server", &tuner.url, "activate", "ps-a"]);
    assert!(ok && out.contains("active"), "{out}{err}");
    let (status, job) = tuner.run_job("/v1/tuner/finetune", quick()).await;
    done(status, &job, &tuner.log());
    assert!(
        job["result"]["finetune"]["skipped"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{job}"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_does_not_cancel_the_job() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    import_fashion(&a, 0, 70);
    tuner.wait_for_nodes(1).await;
    let mut client = Command::new(exe())
        .args([
            "finetune", "--server", &tuner.url, "--runs", "1", "--epochs", "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first_job = async {
        loop {
            let jobs = tuner.get("/v1/tuner/jobs").await;
            if let Some(job) = jobs.as_array().unwrap().first() {
                break job["id"].as_str().unwrap().to_string();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // A hang guard, not a speed target.
    let id = tokio::time::timeout(Duration::from_secs(60), first_job)
        .await
        .expect("the CLI started no job");
    client.kill().unwrap();
    client.wait().unwrap();
    let job = tuner.wait_job(&id).await;
    assert_eq!(job["phase"], "done", "{job}\n{}", tuner.log());
    let deploy = &job["result"]["finetune"]["deploy"];
    assert_eq!(deploy["nodes"], 1, "the deploy ran to its end too: {job}");
}

#[tokio::test]
async fn a_node_that_missed_a_commit_ends_on_the_active_version_across_a_restart() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let mut b = Instance::start_pipestore(&tuner.grpc, "ps-b", &["--fault-fail-commits", "1"]);
    import_fashion(&a, 0, 70);
    import_fashion(&b, 70, 70);
    tuner.wait_for_nodes(2).await;
    let deploy = serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false});
    let (status, job) = tuner.run_job("/v1/tuner/finetune", deploy).await;
    done(status, &job, &tuner.log());
    let report = &job["result"]["finetune"];
    let version = report["version"].as_str().unwrap().to_string();
    let lagging = report["deploy"]["lagging"][0].as_str().unwrap();
    assert!(lagging.contains("ps-b"), "{report}");

    let serving = format!("default={version},");
    let on_version = |nodes: &[serde_json::Value]| {
        nodes.len() == 2
            && nodes.iter().all(|n| {
                n["version"]
                    .as_str()
                    .is_some_and(|v| v.starts_with(&serving))
                    && n["in_sync"] == true
            })
    };
    wait_nodes(&tuner, "ps-b is brought to the version", on_version).await;
    let restarted_ms = ndpipe_util::time::now_ms();
    b.restart();
    wait_nodes(&tuner, "ps-b keeps the version across kill -9", |nodes| {
        on_version(nodes) && node(nodes, "ps-b")["last_seen_ms"].as_i64().unwrap() > restarted_ms
    })
    .await;
    assert_eq!(b.task_version("default").await, Some(version.clone()));
    let labelled = b
        .json("/v1/search?label=Trouser&task=default&limit=100")
        .await;
    assert_eq!(
        labelled["model_version"],
        version.as_str(),
        "re-labelled: {labelled}"
    );
}

#[tokio::test]
async fn without_the_cluster_secret_every_grpc_method_is_refused_and_changes_nothing() {
    use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
    use ndpipe_proto::pb::tuner_client::TunerClient;
    use ndpipe_proto::{PROTOCOL_VERSION, pb};
    use tonic::Code;

    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("cluster-secret");
    std::fs::write(&secret, "s3cret-of-the-cluster\n").unwrap();
    let secret = secret.to_str().unwrap();
    let tuner = TunerProcess::start_with(&["--cluster-secret-file", secret]);
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &["--cluster-secret-file", secret]);
    let nodes = tuner.wait_for_nodes(1).await;
    let url = nodes[0]["url"].as_str().unwrap().to_string();
    let before = a.json("/v1/models").await;

    let mut node = PipeStoreClient::connect(url).await.unwrap();
    let mut codes = vec![
        (
            "Inventory",
            node.inventory(pb::InventoryRequest::default()).await.err(),
        ),
        (
            "Extract",
            node.extract(pb::ExtractRequest::default()).await.err(),
        ),
        (
            "FetchChunk",
            node.fetch_chunk(pb::FetchChunkRequest::default())
                .await
                .err(),
        ),
        (
            "StageHead",
            node.stage_head(pb::StageHeadRequest::default()).await.err(),
        ),
        (
            "CommitHead",
            node.commit_head(pb::CommitHeadRequest::default())
                .await
                .err(),
        ),
        (
            "AbortHead",
            node.abort_head(pb::AbortHeadRequest::default()).await.err(),
        ),
        (
            "Relabel",
            node.relabel(pb::RelabelRequest::default()).await.err(),
        ),
        (
            "Rebalance",
            node.rebalance(pb::RebalanceRequest::default()).await.err(),
        ),
        (
            "TakeOver",
            node.take_over(pb::TakeOverRequest::default()).await.err(),
        ),
        (
            "GetTensors",
            node.get_tensors(pb::GetTensorsRequest::default())
                .await
                .err(),
        ),
        (
            "GetFeatures",
            node.get_features(pb::GetFeaturesRequest::default())
                .await
                .err(),
        ),
        (
            "StageBackbone",
            node.stage_backbone(futures::stream::iter([pb::BackboneChunk::default()]))
                .await
                .err(),
        ),
        (
            "ExtractBackbone",
            node.extract_backbone(pb::ExtractBackboneRequest::default())
                .await
                .err(),
        ),
        (
            "CommitBackbone",
            node.commit_backbone(pb::CommitBackboneRequest::default())
                .await
                .err(),
        ),
        (
            "AbortBackbone",
            node.abort_backbone(pb::AbortBackboneRequest::default())
                .await
                .err(),
        ),
        (
            "PutFeatures",
            node.put_features(pb::PutFeaturesRequest::default())
                .await
                .err(),
        ),
        (
            "GiveBackbonePhotos",
            node.give_backbone_photos(pb::GiveBackbonePhotosRequest::default())
                .await
                .err(),
        ),
        (
            "TakeOverBackbone",
            node.take_over_backbone(pb::TakeOverBackboneRequest::default())
                .await
                .err(),
        ),
        (
            "PutBackboneOutputs",
            node.put_backbone_outputs(pb::PutBackboneOutputsRequest::default())
                .await
                .err(),
        ),
    ];
    let mut tuner_rpc = TunerClient::connect(tuner.grpc.clone()).await.unwrap();
    let intruder = pb::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        grpc_url: "http://127.0.0.1:9".into(),
        name: "ps-a".into(),
        active_version: String::new(),
        replicas: 1,
    };
    codes.push(("Register", tuner_rpc.register(intruder.clone()).await.err()));
    let beat = pb::HeartbeatRequest {
        node_id: nodes[0]["id"].as_u64().unwrap() as u32,
        name: "ps-a".into(),
        active_version: String::new(),
        replicas: 1,
    };
    codes.push(("Heartbeat", tuner_rpc.heartbeat(beat).await.err()));
    let mut wrong = tonic::Request::new(intruder);
    wrong
        .metadata_mut()
        .insert("x-ndpipe-cluster-secret", "guessed".parse().unwrap());
    codes.push((
        "Register (wrong secret)",
        tuner_rpc.register(wrong).await.err(),
    ));
    for (method, error) in codes {
        let code = error.map(|e| e.code());
        assert_eq!(code, Some(Code::Unauthenticated), "{method}");
    }

    // Nothing changed: the node keeps its url and model, and the cluster still works.
    let after = tuner.get("/v1/tuner/nodes").await;
    assert_eq!(after[0]["url"], nodes[0]["url"], "{after}");
    assert_eq!(a.json("/v1/models").await, before);
    let mut request = tonic::Request::new(pb::InventoryRequest::default());
    request.metadata_mut().insert(
        "x-ndpipe-cluster-secret",
        "s3cret-of-the-cluster".parse().unwrap(),
    );
    assert!(node.inventory(request).await.is_ok(), "with the secret");
    import_fashion(&a, 0, 70);
    let job = serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false});
    let (status, job) = tuner.run_job("/v1/tuner/finetune", job).await;
    done(status, &job, &tuner.log());
    assert_eq!(job["result"]["finetune"]["deploy"]["nodes"], 1, "{job}");
}

/// `GET path` on `base`: (status, JSON body or null).
async fn probe(base: &str, path: &str) -> (u16, serde_json::Value) {
    match reqwest::get(format!("{base}{path}")).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or_default())
        }
        Err(_) => (0, serde_json::Value::Null),
    }
}

#[tokio::test]
async fn health_readiness_and_metrics_follow_the_cluster() {
    let tuner = TunerProcess::start_with(&["--node-lease-ms", "1500"]);
    assert_eq!(probe(&tuner.url, "/healthz").await.0, 200);
    let (status, ready) = probe(&tuner.url, "/readyz").await;
    assert_eq!(
        (status, &ready["nodes"]),
        (200, &serde_json::json!(0)),
        "{ready}"
    );
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    tuner.wait_for_nodes(1).await;
    let wait_ready = |want: u16| {
        let url = a.url.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (status, body) = probe(&url, "/readyz").await;
                if status == want {
                    return body;
                }
                assert!(
                    Instant::now() < deadline,
                    "/readyz never {want}: {status} {body}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let ready = wait_ready(200).await;
    assert_eq!(
        (&ready["model"], &ready["in_cluster"]),
        (&serde_json::json!(true), &serde_json::json!(true))
    );
    let metrics = reqwest::get(format!("{}/metrics", tuner.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"ndpipe_tuner_nodes{state="active",live="true",in_sync="true"} 1"#),
        "{metrics}"
    );

    // The Tuner goes away: the node is alive but not ready, and ready again when it returns.
    tuner.signal_stop();
    let not_ready = wait_ready(503).await;
    assert_eq!(not_ready["error"], "not_ready", "{not_ready}");
    assert_eq!(probe(&a.url, "/healthz").await.0, 200, "alive all the same");
    tuner.signal_cont();
    wait_ready(200).await;
}

#[tokio::test]
async fn the_tuner_answers_unknown_paths_and_methods_with_json() {
    let tuner = TunerProcess::start();
    let (status, body) = probe(&tuner.url, "/v1/nope").await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("no_route")),
        "{body}"
    );
    let resp = reqwest::Client::new()
        .delete(format!("{}/v1/tuner/versions", tuner.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "method_not_allowed", "{body}");
}
