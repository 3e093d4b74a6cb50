//! Backbones as a cluster operation: `ndpipe models add` verifies and keeps a backbone on the
//! Tuner, and refuses a file that does not load; `ndpipe rollout` switches a Tuner and two
//! PipeStores on one PostgreSQL catalog to it, with a node killed (kill -9) mid-job; a node
//! refuses a backbone stream whose file is not its version or whose chunk is damaged.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{
    Instance, TunerProcess, channel, cli, import_fashion, model_dir, on_postgres, sha256,
    with_secret,
};

/// Polls of a running rollout, and the pause between two (a hang guard, not a time limit).
pub(crate) const POLL: Duration = Duration::from_millis(100);
pub(crate) const POLLS: u32 = 6000;
/// Photos per node.
const PHOTOS: u64 = 60;

/// A second backbone, a genuinely different file: the setup's ONNX re-saved by the `onnx`
/// Python package with another doc string, with a copy of its manifest and classes in `dir`.
/// Returns its ONNX file.
pub(crate) fn second_backbone(dir: &Path) -> PathBuf {
    let model = model_dir();
    let onnx = dir.join("second.onnx");
    let script = "import onnx, sys\n\
                  m = onnx.load(sys.argv[1])\n\
                  m.doc_string = 'ndpipe rollout test: the second backbone'\n\
                  onnx.save(m, sys.argv[2])\n";
    let status = Command::new(model.join("venv/bin/python"))
        .args(["-c", script])
        .arg(model.join("efficientnet-lite0.onnx"))
        .arg(&onnx)
        .status()
        .expect("running the setup's Python (its venv has the onnx package)");
    assert!(status.success(), "re-saving the ONNX file failed");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    manifest["model_file"] = "second.onnx".into();
    std::fs::write(dir.join("model.json"), manifest.to_string()).unwrap();
    std::fs::copy(
        model.join("imagenet_classes.txt"),
        dir.join("imagenet_classes.txt"),
    )
    .unwrap();
    onnx
}

/// The flags that give a Tuner the setup's ONNX Runtime, to verify backbones with.
pub(crate) fn ort_flags() -> Vec<String> {
    let lib = model_dir().join("lib/libonnxruntime.so");
    vec!["--ort-lib".into(), lib.to_string_lossy().into_owned()]
}

#[test]
fn models_add_verifies_keeps_and_lists_backbones() {
    let flags = ort_flags();
    let tuner = TunerProcess::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let tmp = tempfile::tempdir().unwrap();
    let second = second_backbone(tmp.path());
    let first = model_dir().join("efficientnet-lite0.onnx");
    let add_with = |onnx: &Path, manifest: Option<&Path>| {
        let mut args = vec!["models", "--server", &tuner.url, "add", "--onnx"];
        args.push(onnx.to_str().unwrap());
        if let Some(m) = manifest {
            args.extend(["--manifest", m.to_str().unwrap()]);
        }
        cli(&args)
    };
    let add = |onnx: &Path| add_with(onnx, None);

    let (ok, out, err) = add(&first);
    assert!(ok, "adding the setup's backbone: {err}");
    let first_sha = sha256(&std::fs::read(&first).unwrap());
    assert!(out.starts_with(&first_sha), "{out}");
    let (ok, out, err) = add(&second);
    assert!(ok, "adding the second backbone: {err}");
    let second_sha = sha256(&std::fs::read(&second).unwrap());
    assert_ne!(first_sha, second_sha, "the second backbone is another file");
    assert!(out.starts_with(&second_sha), "{out}");
    // Adding a kept backbone again changes nothing.
    assert!(add(&second).0);

    // A truncated ONNX file is refused: a 4xx JSON error, and the CLI exits != 0.
    let bad = tmp.path().join("bad.onnx");
    let bytes = std::fs::read(&first).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("model.json")).unwrap()).unwrap();
    manifest["model_file"] = "bad.onnx".into();
    let bad_manifest = tmp.path().join("bad.json");
    std::fs::write(&bad_manifest, manifest.to_string()).unwrap();
    let (ok, _, err) = add_with(&bad, Some(&bad_manifest));
    assert!(!ok, "a truncated ONNX file was accepted");
    assert!(
        err.contains("invalid_backbone") && err.contains("400"),
        "{err}"
    );
    // A manifest whose feature_dim is not the graph's is refused as well.
    manifest["model_file"] = "second.onnx".into();
    manifest["feature_dim"] = 1000.into();
    std::fs::write(&bad_manifest, manifest.to_string()).unwrap();
    let (ok, _, err) = add_with(&second, Some(&bad_manifest));
    assert!(!ok && err.contains("invalid_backbone"), "{err}");

    let (ok, out, err) = cli(&["models", "--server", &tuner.url, "list"]);
    assert!(ok, "{err}");
    let listed: Vec<&str> = out.lines().collect();
    assert_eq!(listed.len(), 2, "{out}");
    for sha in [&first_sha, &second_sha] {
        assert!(listed.iter().any(|l| l.starts_with(sha.as_str())), "{out}");
    }
    // Each backbone is recorded as its pretrained version.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let versions = rt.block_on(tuner.get("/v1/tuner/versions"));
    for sha in [&first_sha, &second_sha] {
        let id = format!("efficientnet-lite0-{}", &sha[..12]);
        assert!(
            versions
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["id"] == id.as_str() && v["backbone"] == sha.as_str()),
            "{versions}"
        );
    }
}

/// A Tuner on the catalog at `url`, with the setup's ONNX Runtime.
pub(crate) fn tuner_on(url: &str) -> TunerProcess {
    let mut flags = ort_flags();
    flags.extend(["--catalog".to_string(), url.to_string()]);
    TunerProcess::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The flags of a PipeStore on the catalog at `url`, one copy of each photo, its model capped
/// at `rate` photos per second in batches of 8.
pub(crate) fn capped<'a>(url: &'a str, rate: &'a str) -> [&'a str; 8] {
    [
        "--catalog",
        url,
        "--replicas",
        "1",
        "--model-rate-limit",
        rate,
        "--max-batch",
        "8",
    ]
}

/// Adds the second backbone to `tuner`; returns its sha256 and pretrained version.
pub(crate) fn added_backbone(tuner: &TunerProcess) -> (String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let second = second_backbone(tmp.path());
    let sha = sha256(&std::fs::read(&second).unwrap());
    let new = format!("efficientnet-lite0-{}", &sha[..12]);
    let onnx = second.to_str().unwrap();
    let (ok, _, err) = cli(&["models", "--server", &tuner.url, "add", "--onnx", onnx]);
    assert!(ok, "{err}");
    (sha, new)
}

/// Adds the second backbone to `tuner` and rolls it out, which must succeed; returns its
/// pretrained version and the job's report.
pub(crate) async fn rolled_out(tuner: &TunerProcess) -> (String, serde_json::Value) {
    let (sha, new) = added_backbone(tuner);
    let (status, job) = tuner
        .run_job(&format!("/v1/tuner/rollout/{sha}"), serde_json::json!({}))
        .await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["phase"], "done", "{job}\n{}", tuner.log());
    let report = job["result"]["rollout"].clone();
    eprintln!("rollout report: {report}");
    (new, report)
}

/// Starts the rollout of backbone `sha` in the background and polls its job until it ends,
/// giving it to `extracting` at every poll in that phase; returns the job at its end.
pub(crate) async fn watch_rollout(
    tuner: &TunerProcess,
    sha: &str,
    mut extracting: impl AsyncFnMut(&serde_json::Value),
) -> serde_json::Value {
    let (ok, out, err) = cli(&["rollout", "--server", &tuner.url, sha, "--no-wait"]);
    assert!(ok, "{err}");
    let id = out.trim().to_string();
    let mut job = serde_json::Value::Null;
    for poll in 0.. {
        assert!(poll < POLLS, "the rollout hangs: {job}\n{}", tuner.log());
        job = tuner.get(&format!("/v1/tuner/jobs/{id}")).await;
        if job["phase"] == "done" || job["phase"] == "failed" {
            break;
        }
        if job["phase"] == "extracting" {
            extracting(&job).await;
        }
        tokio::time::sleep(POLL).await;
    }
    job
}

/// The general task's version a node's search serves (its active one).
async fn searched_version(node: &Instance) -> String {
    let found = node.json("/v1/search?label=other&task=general").await;
    found["model_version"].as_str().unwrap().to_string()
}

#[test]
fn a_rollout_switches_every_node_after_all_finished_and_survives_a_kill() {
    on_postgres("rollout", |url| async move { rollout_on(&url).await });
}

async fn rollout_on(url: &str) {
    let tuner = tuner_on(url);
    // Emulated slower accelerators and small batches: the extraction lasts some seconds, long
    // enough to look at the cluster and kill a node mid-job.
    let mut nodes: Vec<Instance> = ["ps-a", "ps-b"]
        .iter()
        .map(|name| Instance::start_pipestore(&tuner.grpc, name, &capped(url, "15")))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        import_fashion(node, i * PHOTOS as usize, PHOTOS as usize);
        node.wait_labelled(PHOTOS).await;
    }
    tuner.wait_for_nodes(2).await;
    let old = nodes[0].task_version("general").await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let second = second_backbone(tmp.path());
    let sha = sha256(&std::fs::read(&second).unwrap());
    let new = format!("efficientnet-lite0-{}", &sha[..12]);
    let (ok, _, err) = cli(&[
        "models",
        "--server",
        &tuner.url,
        "add",
        "--onnx",
        second.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&["rollout", "--server", &tuner.url, "0000", "--no-wait"]);
    assert!(!ok && err.contains("unknown_backbone"), "{err}");
    // While the nodes extract, both serve the old version; one is killed and restarted.
    let mut killed = false;
    let mut seen_rate = false;
    let job = watch_rollout(&tuner, &sha, async |job| {
        let b = &job["progress"][1];
        seen_rate |= b["images_per_second"].as_f64().is_some_and(|r| r > 0.0)
            && b["eta_seconds"].as_f64().is_some();
        let (done, total) = (b["done"].as_u64().unwrap(), b["total"].as_u64().unwrap());
        if !killed && done > 0 && done < total {
            for node in &nodes {
                assert_eq!(
                    searched_version(node).await,
                    old,
                    "served before the commit"
                );
            }
            nodes[1].kill9();
            killed = true;
            nodes[1].restart();
        }
    })
    .await;
    assert_eq!(job["phase"], "done", "{job}\n{}", tuner.log());
    assert!(killed, "the node was killed mid-job: {job}");
    assert!(seen_rate, "the job showed a rate and ETA per node");
    let report = &job["result"]["rollout"];
    eprintln!("rollout report: {report}");
    assert_eq!(report["version"], new.as_str(), "{report}");
    assert_eq!(report["photos"], 2 * PHOTOS, "{report}");
    assert!(
        report["nodes"][1]["resumed"].as_u64().unwrap() >= 1,
        "{report}"
    );
    assert!(
        report["images_per_second"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["model_only_images_per_second"].as_f64().unwrap() > 0.0,
        "{report}"
    );

    // Every node serves the new version, and every photo has labels from it.
    for node in &nodes {
        assert_eq!(node.task_version("general").await, Some(new.clone()));
        serves_new_labels(node, &new, PHOTOS).await;
    }
    let listed = tuner.get("/v1/tuner/nodes").await;
    refuses_bad_backbone_streams(listed[0]["url"].as_str().unwrap()).await;
    for n in listed.as_array().unwrap() {
        assert_eq!(
            (&n["version"], &n["in_sync"]),
            (
                &serde_json::json!(format!("general={new}")),
                &serde_json::json!(true)
            ),
            "{listed}"
        );
    }
    finetune_computes_no_features(&tuner).await;
}

/// `node` serves version `new`, and each of its `photos` photos has labels from it.
pub(crate) async fn serves_new_labels(node: &Instance, new: &str, photos: u64) {
    assert_eq!(searched_version(node).await, new);
    let page = node.json("/v1/photos?limit=1000").await;
    let listed = page["photos"].as_array().unwrap();
    assert_eq!(listed.len() as u64, photos);
    for p in listed {
        let id = p["id"].as_u64().unwrap();
        let labels = node.json(&format!("/v1/photos/{id}/labels")).await;
        let from_new = labels
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["model_version"] == new);
        assert!(
            from_new.is_some_and(|l| !l["labels"].as_array().unwrap().is_empty()),
            "photo {id}: {labels}"
        );
    }
}

/// Every photo's features from the new backbone are stored: a fine-tune reads them all.
pub(crate) async fn finetune_computes_no_features(tuner: &TunerProcess) {
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 1, "load_balance": false, "deploy": false}),
        )
        .await;
    assert_eq!(
        (status, &job["phase"]),
        (202, &serde_json::json!("done")),
        "{job}"
    );
    for n in job["result"]["finetune"]["nodes"].as_array().unwrap() {
        assert_eq!(n["extracted"], 0, "features computed again: {job}");
    }
}

/// A node's `StageBackbone` refuses a file whose sha256 is not its version, and a damaged chunk;
/// a version that is not a sha256 names no file.
async fn refuses_bad_backbone_streams(grpc_url: &str) {
    use ndpipe_proto::backbone_chunks;
    use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;

    let mut node = PipeStoreClient::with_interceptor(channel(grpc_url).await, with_secret);
    let manifest = std::fs::read_to_string(model_dir().join("model.json")).unwrap();
    let onnx = b"not the file its version names".to_vec();
    let wrong = backbone_chunks(&"0".repeat(64), &manifest, &["a".into()], &onnx);
    let refused = node
        .stage_backbone(futures::stream::iter(wrong))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("sha256"), "{refused:?}");
    let mut damaged = backbone_chunks(&sha256(&onnx), &manifest, &["a".into()], &onnx);
    damaged[0].data[0] ^= 1;
    let refused = node
        .stage_backbone(futures::stream::iter(damaged))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("checksum"), "{refused:?}");
    let outside = ndpipe_proto::pb::AbortBackboneRequest {
        backbone_version: "../../store".into(),
    };
    let refused = node.abort_backbone(outside).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}
