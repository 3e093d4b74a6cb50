//! A Tuner and two PipeStore processes on loopback: pipelined fine-tuning from features,
//! two-phase deploy, re-labelling, rollback, and the faults around them. Jobs run in the
//! background: each test starts one (202) and follows it to its end.

use ndpipe_model::HeadWeights;
use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
use ndpipe_proto::{pb, put_head};

use crate::common::{Instance, TunerProcess, channel, import_fashion, with_secret};

/// The report of a job that must have succeeded (`kind`: "finetune" or "deploy").
fn succeeded(status: u16, job: &serde_json::Value, kind: &str, log: &str) -> serde_json::Value {
    assert_eq!(status, 202, "{job}\n{log}");
    assert_eq!(job["phase"], "done", "{job}\n{log}");
    job["result"][kind].clone()
}

/// Gives the first `n` training photos of `node` the `val` split (same label); returns `n`.
async fn move_to_val(node: &Instance, n: usize) -> u64 {
    let page = node.json("/v1/photos?limit=1000").await;
    let train: Vec<(u64, String)> = page["photos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ground_truth"]["split"] == "train")
        .map(|p| {
            let label = p["ground_truth"]["label"].as_str().unwrap().to_string();
            (p["id"].as_u64().unwrap(), label)
        })
        .take(n)
        .collect();
    assert_eq!(train.len(), n, "{page}");
    for (id, label) in &train {
        let status = node
            .client()
            .put(format!("{}/v1/photos/{id}/ground-truth", node.url))
            .json(&serde_json::json!({"label": label, "split": "val"}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204, "photo {id}");
    }
    n as u64
}

#[tokio::test]
async fn two_pipestores_finetune_deploy_relabel_and_roll_back() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &["--fault-corrupt-chunks", "2"]);
    let b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 350);
    import_fashion(&b, 350, 350);
    tuner.wait_for_nodes(2).await;
    // The `test` photos are not extracted by the job: the deploy finds their features only if
    // labelling at ingest stored them.
    a.wait_labelled(350).await;
    b.wait_labelled(350).await;

    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            // Load balancing (tested on its own below) would leave the features of moved photos
            // only on the node that took them over; this test checks the head-only re-labelling.
            serde_json::json!({"runs": 2, "epochs": 8, "chunk_size": 64, "load_balance": false}),
        )
        .await;
    let report = succeeded(status, &job, "finetune", &tuner.log());
    // No photo has `val`: a tenth of the 600 training photos validate, the 100 `test` never.
    assert_eq!(report["val_split"], "carve");
    let (train, val) = (
        report["train_images"].as_u64().unwrap(),
        report["val_images"].as_u64().unwrap(),
    );
    assert_eq!(train + val, 600, "{report}");
    assert!((30..=100).contains(&val), "{report}");
    assert_eq!(report["runs"].as_array().unwrap().len(), 2);
    let top1 = report["val_top1"].as_f64().unwrap();
    assert!(
        top1 > 0.6,
        "a head on EfficientNet features must learn Fashion-MNIST: {report}"
    );
    assert!(
        report["val_top1_before"].as_f64().unwrap() < 0.3,
        "a new head starts near chance"
    );
    let per_image = report["bytes_per_image"].as_f64().unwrap();
    assert!(
        per_image < 3000.0,
        "features (2.5 KB), not 150 KB tensors, cross the network: {per_image}"
    );
    // Counted at the transport: about the features (ids and labels travel as varints, not the
    // 8 and 4 bytes the job counts; framing and the survey are added), and still not tensors.
    let wire = report["wire_bytes_per_image"].as_f64().unwrap();
    assert!(
        (0.9 * per_image..4000.0).contains(&wire),
        "transport bytes per image {wire} vs features {per_image}"
    );
    assert!(
        report["chunks_refetched"].as_u64().unwrap() >= 2,
        "damaged chunks are fetched again: {report}"
    );
    let deploy = &report["deploy"];
    assert_eq!(deploy["nodes"], 2);
    assert_eq!(deploy["relabelled"], 700);
    assert_eq!(
        deploy["modes"],
        serde_json::json!(["head", "head"]),
        "re-labelling ran the head over stored features"
    );
    let version = report["version"].as_str().unwrap().to_string();
    assert!(
        report["parent"].is_null(),
        "the task's first version: {report}"
    );

    for node in [&a, &b] {
        assert_eq!(node.task_version("default").await, Some(version.clone()));
        let trousers = node.json("/v1/search?label=Trouser&limit=100").await;
        assert!(
            trousers["hits"].as_array().unwrap().len() >= 20,
            "{trousers}"
        );
    }

    // 40 photos ps-a trained on become validation photos: the successor leaves out those its
    // parent trained on.
    let moved = move_to_val(&a, 40).await;
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false, "deploy": false}),
        )
        .await;
    let successor = succeeded(status, &job, "finetune", &tuner.log());
    assert_eq!(successor["parent"], version.as_str(), "{successor}");
    assert_eq!(successor["val_split"], "val", "{successor}");
    let left_out = successor["val_left_out"].as_u64().unwrap();
    assert_eq!(
        left_out + successor["val_images"].as_u64().unwrap(),
        moved,
        "{successor}"
    );
    assert!(
        left_out >= moved / 2,
        "most moved photos were trained on: {successor}"
    );

    // The successor, deployed by hand, then a rollback to the version before it: each a head
    // over the stored features, the general task's ImageNet labels untouched.
    let successor = successor["version"].as_str().unwrap().to_string();
    for (deployed, before) in [(&successor, &version), (&version, &successor)] {
        let (status, job) = tuner
            .run_job(
                &format!("/v1/tuner/deploy/{deployed}"),
                serde_json::json!({}),
            )
            .await;
        let deploy = succeeded(status, &job, "deploy", &tuner.log());
        assert_eq!(
            deploy["modes"],
            serde_json::json!(["head", "head"]),
            "{deploy}"
        );
        assert_eq!(deploy["task"], "default", "{deploy}");
        assert_ne!(deployed, before);
        assert_eq!(a.task_version("default").await.as_ref(), Some(deployed));
    }
    let general = a.task_version("general").await.unwrap();
    let nodes = tuner.get("/v1/tuner/nodes").await;
    for n in nodes.as_array().unwrap() {
        assert_eq!(
            n["version"],
            format!("default={version},general={general}").as_str(),
            "{nodes}"
        );
        assert_eq!(n["in_sync"], true, "{nodes}");
    }
    let versions = tuner.get("/v1/tuner/versions").await;
    assert_eq!(versions.as_array().unwrap().len(), 3);

    let (status, unknown) = tuner
        .post("/v1/tuner/deploy/nope", serde_json::json!({}))
        .await;
    assert_eq!(status, 404, "{unknown}");
}

#[tokio::test]
async fn a_pipestore_killed_mid_job_fails_the_job_naming_it_and_re_registers() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let mut b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 140);
    import_fashion(&b, 140, 140);
    let before = tuner.wait_for_nodes(2).await;

    let (status, job) = tuner
        .post(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 2, "epochs": 2, "chunk_size": 8, "throttle": {"ps-b": 20.0}}),
        )
        .await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_extracting(&tuner, &id, "ps-b").await;
    b.kill9();
    let job = tuner.wait_job(&id).await;
    assert_eq!(job["phase"], "failed", "{job}");
    assert_eq!(job["error"]["kind"], "node_failed", "{job}");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("ps-b"),
        "the failed node is named: {job}"
    );

    let ps_b = |nodes: &serde_json::Value| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "ps-b")
            .unwrap()
            .clone()
    };
    b.restart();
    // The restarted node listens on a new gRPC port: wait for its registration.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let after = loop {
        let after = tuner.wait_for_nodes(2).await;
        if ps_b(&after)["url"] != ps_b(&before)["url"] {
            break after;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ps-b did not register again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        after.as_array().unwrap().len(),
        2,
        "a restarted node keeps its place: {after}"
    );
    assert_eq!(ps_b(&before)["id"], ps_b(&after)["id"]);
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 2}),
        )
        .await;
    succeeded(status, &job, "finetune", &tuner.log());
}

/// Waits until job `id` has heard from `node` during extraction (a hang guard fails the test).
pub(crate) async fn wait_extracting(tuner: &TunerProcess, id: &str, node: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let job = tuner.get(&format!("/v1/tuner/jobs/{id}")).await;
        let heard = job["progress"].as_array().into_iter().flatten().any(|p| {
            p["node"].as_str().is_some_and(|n| n.starts_with(node))
                && p["done"].as_u64().unwrap_or(0) > 0
        });
        if job["phase"] == "extracting" && heard {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline && job["phase"] != "done",
            "job {id} never extracted on {node}: {job}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_head_of_the_wrong_input_dimension_is_refused() {
    let tuner = TunerProcess::start();
    let _a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let nodes = tuner.wait_for_nodes(1).await;
    let url = nodes[0]["url"].as_str().unwrap().to_string();
    let mut client = PipeStoreClient::with_interceptor(channel(&url).await, with_secret);
    let inventory = client
        .inventory(pb::InventoryRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inventory.feature_dim, 1280);
    let head = HeadWeights::new(
        vec!["a".into(), "b".into()],
        512,
        vec![0.1; 1024],
        vec![0.0; 2],
    )
    .unwrap();
    let mut request = pb::StageHeadRequest {
        version: "bad-dim".into(),
        backbone_version: inventory.backbone_version.clone(),
        ..Default::default()
    };
    put_head(&mut request, &head);
    let err = client.stage_head(request.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("1280"), "{}", err.message());
    let mut damaged = request;
    damaged.crc32c ^= 1;
    assert_eq!(
        client.stage_head(damaged).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let commit = client
        .commit_head(pb::CommitHeadRequest {
            version: "bad-dim".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        commit.code(),
        tonic::Code::NotFound,
        "nothing was staged, nothing changes"
    );
}

#[tokio::test]
async fn a_fast_node_takes_over_the_tail_of_a_throttled_one() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 210);
    import_fashion(&b, 210, 210);
    tuner.wait_for_nodes(2).await;
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 2, "epochs": 2, "chunk_size": 8, "throttle": {"ps-b": 25.0}, "deploy": false}),
        )
        .await;
    let report = succeeded(status, &job, "finetune", &tuner.log());
    let moved = &report["rebalanced"];
    assert_eq!(moved.as_array().unwrap().len(), 1, "{report}");
    assert!(
        moved[0]["from"].as_str().unwrap().starts_with("ps-b"),
        "{report}"
    );
    assert!(
        moved[0]["to"].as_str().unwrap().starts_with("ps-a"),
        "{report}"
    );
    let n = moved[0]["photos"].as_u64().unwrap();
    assert!(n >= 8, "{report}");
    assert_eq!(
        report["train_images"].as_u64().unwrap() + report["val_images"].as_u64().unwrap(),
        360,
        "every training photo once (a tenth validates), none lost or doubled: {report}"
    );
    let images: Vec<u64> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["images"].as_u64().unwrap())
        .collect();
    // 180 training photos per node (the 30 `test` photos are not extracted).
    assert_eq!(images, vec![180 + n, 180 - n], "{report}");
}

/// A node's figures in a report, by name.
fn node<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let nodes = report["nodes"].as_array().unwrap();
    let found = nodes
        .iter()
        .find(|n| n["node"].as_str().unwrap().starts_with(name));
    found.unwrap_or_else(|| panic!("no {name} in {report}"))
}

#[tokio::test]
async fn work_moves_from_several_runs_and_its_features_go_back_to_the_slow_node() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let mut b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 210);
    import_fashion(&b, 210, 210);
    a.wait_labelled(210).await;
    b.wait_labelled(210).await;
    // ps-b loses its feature store: the job computes the features of all its photos.
    b.kill9();
    std::fs::remove_file(b.data.join("store").join("features.redb")).unwrap();
    b.restart();
    tuner.wait_for_nodes(2).await;
    let job = serde_json::json!({
        "runs": 4, "epochs": 2, "chunk_size": 8, "throttle": {"ps-b": 20.0}, "deploy": false,
    });
    let (status, done) = tuner.run_job("/v1/tuner/finetune", job.clone()).await;
    let report = succeeded(status, &done, "finetune", &tuner.log());
    let moved = report["rebalanced"].as_array().unwrap();
    assert_eq!(moved.len(), 1, "{report}");
    let n = moved[0]["photos"].as_u64().unwrap();
    let runs = moved[0]["runs"].as_array().unwrap();
    // 162 training photos in 4 runs of about 40: more than the last run moved.
    assert!(runs.len() >= 2 && n > 48, "{report}");
    assert_eq!(
        report["train_images"].as_u64().unwrap() + report["val_images"].as_u64().unwrap(),
        360,
        "every training photo once (a tenth validates), none lost or doubled: {report}"
    );
    let (fast, slow) = (node(&report, "ps-a"), node(&report, "ps-b"));
    assert_eq!(fast["images"].as_u64().unwrap(), 180 + n, "{report}");
    assert_eq!(slow["images"].as_u64().unwrap(), 180 - n, "{report}");
    // ps-b had lost its features: ps-a ran the backbone on the photos it took, but for those it
    // holds a copy of (the two imports overlap: the same photo under the same id).
    let computed = fast["extracted"].as_u64().unwrap();
    assert!(computed > 0 && computed <= n, "{report}");
    assert!(report.get("balance_skipped").is_none(), "{report}");
    // The bytes between the nodes are counted at the transport: the tensors ps-a fetched for
    // the photos it computed are each far more than a kilobyte.
    let peer = report["peer_wire_bytes"].as_u64().unwrap();
    assert!(peer > computed * 1_000, "{report}");

    // Again: ps-b now holds the features of every photo, those ps-a computed or held included,
    // and ps-a's take-over reads them (or its own) instead of running the backbone.
    let (status, done) = tuner.run_job("/v1/tuner/finetune", job).await;
    let again = succeeded(status, &done, "finetune", &tuner.log());
    assert!(
        !again["rebalanced"].as_array().unwrap().is_empty(),
        "{again}"
    );
    assert_eq!(node(&again, "ps-b")["extracted"], 0, "{again}");
    assert_eq!(node(&again, "ps-a")["extracted"], 0, "{again}");
}

#[tokio::test]
async fn over_the_memory_budget_training_reads_features_through_spidercache() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    let b = Instance::start_pipestore(&tuner.grpc, "ps-b", &[]);
    import_fashion(&a, 0, 350);
    import_fashion(&b, 350, 350);
    tuner.wait_for_nodes(2).await;
    // 600 training features of 1280 f32 are 3 MB; the Tuner may hold a fifth of that.
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 2, "epochs": 4, "batch": 64, "memory_budget_bytes": 600_000, "cache_policy": "spidercache", "deploy": false}),
        )
        .await;
    let report = succeeded(status, &job, "finetune", &tuner.log());
    let cache = &report["cache"];
    assert_eq!(cache["policy"], "spidercache", "{report}");
    assert_eq!(cache["capacity_items"], 600_000 / 2560);
    let requests = cache["requests"].as_u64().unwrap();
    let hits = cache["exact_hits"].as_u64().unwrap() + cache["substitutes"].as_u64().unwrap();
    assert_eq!(requests, hits + cache["misses"].as_u64().unwrap());
    assert!(
        requests >= 4 * 600 / 2,
        "every epoch draws about the run's samples: {cache}"
    );
    assert!(hits > 0 && cache["misses"].as_u64().unwrap() > 0, "{cache}");
    assert!(cache["fetched_bytes"].as_u64().unwrap() > 0);
    assert!(
        report["val_top1"].as_f64().unwrap() > 0.5,
        "training through the cache still learns: {report}"
    );
    let losses: Vec<f64> = (report["runs"].as_array().unwrap().iter())
        .map(|r| r["train_loss"].as_f64().unwrap())
        .collect();
    assert!(
        losses.len() == 2 && losses.iter().all(|l| *l > 0.0),
        "each run's loss through the cache: {losses:?}"
    );
    let (status, bad) = tuner
        .post(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 1, "memory_budget_bytes": 1000, "cache_policy": "fifo"}),
        )
        .await;
    assert_eq!(status, 400, "{bad}");
}

#[tokio::test]
async fn photos_deleted_during_a_job_are_left_out_and_reported() {
    let tuner = TunerProcess::start();
    let a = Instance::start_pipestore(&tuner.grpc, "ps-a", &[]);
    import_fashion(&a, 0, 70);
    tuner.wait_for_nodes(1).await;
    let (status, job) = tuner
        .post(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 2, "chunk_size": 4, "deploy": false,
                               "throttle": {"ps-a": 10.0}}),
        )
        .await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_extracting(&tuner, &id, "ps-a").await;
    let page = a.json("/v1/photos?limit=1000").await;
    let ids: Vec<u64> = page["photos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    // Half the photos go while the node extracts at 10 photos/s: most of them are not sent yet.
    for id in ids.iter().step_by(2) {
        let status = a
            .client()
            .delete(format!("{}/v1/photos/{id}", a.url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204);
    }
    let job = tuner.wait_job(&id).await;
    let report = succeeded(202, &job, "finetune", &tuner.log());
    let node = &report["nodes"][0];
    let deleted = node["deleted"].as_u64().unwrap();
    assert!(deleted > 0, "{report}");
    assert_eq!(
        node["images"].as_u64().unwrap() + deleted,
        60,
        "the 60 train photos, sent or left out: {report}"
    );
}
