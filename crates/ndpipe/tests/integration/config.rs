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
