//! Near-data inference with the real EfficientNet-Lite0: labels at ingest, search, re-labelling.

use std::io::Write;

use crate::common::{Instance, cli, import_fashion, model_dir, sample};

fn top_labels(labels: &serde_json::Value) -> Vec<String> {
    labels[0]["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["label"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn photos_are_labelled_at_ingest_and_found_by_search() {
    let inst = Instance::start_with_model(&[]);
    let mut ids = std::collections::HashMap::new();
    for name in ["chelsea.png", "coffee.png", "rocket.jpg"] {
        let (status, body) = inst.upload(sample(name), "").await;
        assert_eq!(status, 201, "{body}");
        ids.insert(name, body["id"].as_u64().unwrap());
    }
    let labels_of = |name: &str| format!("/v1/photos/{}/labels", ids[name]);
    let cat = top_labels(
        &inst
            .wait_for(&labels_of("chelsea.png"), 60, |v| {
                v.as_array().is_some_and(|a| !a.is_empty())
            })
            .await,
    );
    assert_eq!(cat.len(), 5);
    assert!(
        cat.iter().any(|l| l.starts_with("tabby")
            || l.starts_with("tiger cat")
            || l.starts_with("Egyptian cat")),
        "the cat photo's top-5 holds no cat: {cat:?}"
    );
    let coffee = top_labels(
        &inst
            .wait_for(&labels_of("coffee.png"), 60, |v| {
                v.as_array().is_some_and(|a| !a.is_empty())
            })
            .await,
    );
    assert_eq!(coffee[0], "espresso");
    let rocket = top_labels(
        &inst
            .wait_for(&labels_of("rocket.jpg"), 60, |v| {
                v.as_array().is_some_and(|a| !a.is_empty())
            })
            .await,
    );
    assert!(
        rocket
            .iter()
            .any(|l| l.starts_with("missile") || l.starts_with("projectile")),
        "{rocket:?}"
    );

    let found = inst.json("/v1/search?label=espresso").await;
    assert_eq!(found["hits"][0]["id"], ids["coffee.png"]);
    assert_eq!(found["hits"][0]["rank"], 0);
    let tabby = inst.json("/v1/search?label=tabby").await;
    assert!(
        tabby["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == ids["chelsea.png"]),
        "{tabby}"
    );
    let (status, body) = inst.get("/v1/search?label=cat").await;
    assert_eq!(status, 404, "whole class names only");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"].as_str(),
        Some("unknown_class")
    );
    assert_eq!(inst.get("/v1/search").await.0, 400);
    assert_eq!(inst.get("/v1/search?label=x&model=nope").await.0, 404);

    let models = inst.json("/v1/models").await;
    assert_eq!(models.as_array().unwrap().len(), 1);
    assert_eq!(models[0]["active"], true);
    assert_eq!(found["model_version"], models[0]["id"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let metrics = String::from_utf8(inst.get("/metrics").await.1).unwrap();
        let done = metrics.contains("ndpipe_store_labelled_total 3")
            && metrics.contains("ndpipe_store_label_latency_seconds_count 3");
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "label metrics missing: {metrics}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A re-labelling skips a photo whose tensor is corrupt, survives kill -9 by resuming from its
/// checkpoint, and a second run over the same model reports no label churn.
#[tokio::test]
async fn relabel_skips_corrupt_tensors_resumes_after_kill_and_reports_churn() {
    let mut inst = Instance::start();
    import_fashion(&inst, 0, 400);
    inst.kill9();
    let vol = inst.volumes("tensors").pop().unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&vol).unwrap();
    let len = f.metadata().unwrap().len();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(len - 10)).unwrap();
    f.write_all(b"XXXX").unwrap();
    drop(f);
    let dir = model_dir();
    inst.set_flags(&[
        "--model-dir",
        dir.to_str().unwrap(),
        "--intra-threads",
        "2",
        "--max-batch",
        "8",
    ]);
    inst.restart();
    let resp = inst
        .client()
        .post(format!("{}/v1/jobs/relabel", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let job_id = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let busy = inst
        .client()
        .post(format!("{}/v1/jobs/relabel", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 409, "one re-labelling at a time");
    let job_path = format!("/v1/jobs/{job_id}");
    let running = inst
        .wait_for(&job_path, 60, |j| {
            j["report"]["done"].as_u64().unwrap_or(0) >= 16
        })
        .await;
    assert_eq!(
        running["status"], "running",
        "the job must still be running when killed: {running}"
    );
    inst.kill9();
    inst.restart();
    let done = inst
        .wait_for(&job_path, 120, |j| j["status"] != "running")
        .await;
    assert_eq!(done["status"], "done", "{done}");
    let report = &done["report"];
    assert_eq!(
        report["done"].as_u64().unwrap() + 1,
        400,
        "every photo but the corrupt one: {report}"
    );
    assert_eq!(
        report["last_id"], 399,
        "the checkpoint is the last labelled photo"
    );
    let skipped = report["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{report}");
    assert_eq!(skipped[0][0], 400);
    assert!(
        skipped[0][1].as_str().unwrap().contains("corrupt"),
        "{report}"
    );
    assert!(report["images_per_second"].as_f64().unwrap() > 0.0);
    assert!(
        report["model_images_per_second"].as_f64().unwrap()
            >= report["images_per_second"].as_f64().unwrap()
    );
    for id in [1, 17, 399] {
        let labels = inst.json(&format!("/v1/photos/{id}/labels")).await;
        assert_eq!(
            labels[0]["labels"].as_array().unwrap().len(),
            5,
            "photo {id}"
        );
    }
    assert!(
        inst.json("/v1/photos/400/labels")
            .await
            .as_array()
            .unwrap()
            .is_empty()
    );

    let (ok, out, err) = cli(&["relabel", "--server", &inst.url]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("top-1 changed for 0 of 399 (0.0%); skipped 1"),
        "same model, same labels: {out}"
    );
}

#[test]
fn a_broken_model_is_a_clear_error_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, _, err) = cli(&[
        "serve",
        "--data",
        tmp.path().join("d").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--model-dir",
        "/nonexistent/model",
    ]);
    assert!(!ok);
    assert!(
        err.contains("loading the model from /nonexistent/model"),
        "{err}"
    );

    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    let src = model_dir();
    for f in ["model.json", "imagenet_classes.txt"] {
        std::fs::copy(src.join(f), broken.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(src.join("lib"), broken.join("lib")).unwrap();
    let onnx = std::fs::read(src.join("efficientnet-lite0.onnx")).unwrap();
    std::fs::write(
        broken.join("efficientnet-lite0.onnx"),
        &onnx[..onnx.len() / 3],
    )
    .unwrap();
    let (ok, _, err) = cli(&[
        "serve",
        "--data",
        tmp.path().join("d2").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--model-dir",
        broken.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("loading the model"), "{err}");

    let manifest = std::fs::read_to_string(src.join("model.json"))
        .unwrap()
        .replace("\"features\": \"features\"", "\"features\": \"embeddings\"");
    std::fs::write(broken.join("model.json"), manifest).unwrap();
    std::fs::write(broken.join("efficientnet-lite0.onnx"), &onnx).unwrap();
    let (ok, _, err) = cli(&[
        "serve",
        "--data",
        tmp.path().join("d3").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--model-dir",
        broken.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("embeddings"),
        "the error names the missing output: {err}"
    );
}

/// Photos stored while no model was loaded are labelled once a model is, without a re-labelling.
#[tokio::test]
async fn photos_stored_without_a_model_are_labelled_after_a_restart_with_one() {
    let mut inst = Instance::start();
    let (status, body) = inst.upload(sample("coffee.png"), "").await;
    assert_eq!(status, 201);
    let id = body["id"].as_u64().unwrap();
    assert!(
        inst.json(&format!("/v1/photos/{id}/labels"))
            .await
            .as_array()
            .unwrap()
            .is_empty()
    );
    let dir = model_dir();
    inst.set_flags(&["--model-dir", dir.to_str().unwrap(), "--intra-threads", "2"]);
    inst.restart();
    let labels = inst.labels_when_ready(id).await;
    assert_eq!(top_labels(&labels)[0], "espresso");
}
