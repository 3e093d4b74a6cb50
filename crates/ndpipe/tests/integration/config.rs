//! The configuration file: `ndpipe config example|check`, a server configured by `--config`,
//! flags over the file, and a refused file.

use crate::common::{Instance, cli, jpeg};

#[test]
fn the_example_checks_and_a_bad_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, example, err) = cli(&["config", "example"]);
    assert!(ok, "{err}");
    assert!(example.contains("[pipestore]") && example.contains("[tuner]"));
    let path = dir.path().join("ndpipe.toml");
    std::fs::write(&path, &example).unwrap();
    let (ok, out, err) = cli(&["config", "check", path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("max_batch = 32"), "{out}");

    std::fs::write(&path, "[pipestore]\nmax_bach = 8\n").unwrap();
    let (ok, _, err) = cli(&["serve", "--config", path.to_str().unwrap(), "--no-model"]);
    assert!(!ok, "a misspelt key must stop the server");
    assert!(err.contains("max_bach"), "the error names the key: {err}");
    let (ok, _, err) = cli(&["serve", "--config", "/nonexistent/ndpipe.toml"]);
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    for flag in ["--rebalance-moves-per-round", "--rebalance-page-photos"] {
        let data = dir.path().join(&flag[2..]);
        let args = [
            "serve",
            "--no-model",
            "--data",
            data.to_str().unwrap(),
            flag,
            "0",
        ];
        let (ok, _, err) = cli(&args);
        assert!(!ok, "{flag} 0 must stop the server");
        assert!(
            err.contains(&flag[2..].replace('-', "_")),
            "the error names the key: {err}"
        );
    }
}

#[tokio::test]
async fn the_file_configures_the_server_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ndpipe.toml");
    std::fs::write(
        &path,
        "[pipestore]\nno_model = true\nmax_upload_bytes = 20000\n",
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let big = jpeg(640, 480, 3);
    assert!(
        big.len() > 20_000,
        "the test photo must exceed the file's limit"
    );

    let inst = Instance::launch(&["--config", config]);
    let (status, body) = inst.upload(big.clone(), "").await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"], "body_too_large");
    drop(inst);

    let inst = Instance::launch(&["--config", config, "--max-upload-bytes", "10000000"]);
    let (status, body) = inst.upload(big, "").await;
    assert_eq!(status, 201, "the flag overrides the file: {body}");
}

/// `--model-rate-limit` (an emulated slower accelerator, for experiments): a cap is announced at
/// start and the capped model still labels uploads; a rate that is not one stops the server.
#[tokio::test]
async fn a_capped_model_still_labels_and_a_bad_rate_is_refused() {
    let (ok, _, err) = cli(&[
        "serve",
        "--data",
        tempfile::tempdir().unwrap().path().to_str().unwrap(),
        "--model-dir",
        crate::common::model_dir().to_str().unwrap(),
        "--model-rate-limit=-1",
    ]);
    assert!(!ok, "a negative rate must stop the server");
    assert!(
        err.contains("model_rate_limit"),
        "the error names the key: {err}"
    );

    let inst = Instance::start_with_model(&["--model-rate-limit", "50"]);
    assert!(
        inst.log().contains("model throughput capped"),
        "{}",
        inst.log()
    );
    let (status, body) = inst.upload(jpeg(320, 240, 7), "").await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_u64().unwrap();
    let labels = inst.labels_when_ready(id).await;
    assert!(
        !labels[0]["labels"].as_array().unwrap().is_empty(),
        "{labels}"
    );
}
