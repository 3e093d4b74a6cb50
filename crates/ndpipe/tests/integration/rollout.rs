//! Backbones as a cluster operation: `ndpipe models add` verifies and keeps a backbone on the
//! Tuner, and refuses a file that does not load.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{TunerProcess, cli, model_dir, sha256};

/// A second backbone, a genuinely different file: the setup's ONNX re-saved by the `onnx`
/// Python package with another doc string, with a copy of its manifest and classes in `dir`.
/// Returns its ONNX file.
fn second_backbone(dir: &Path) -> PathBuf {
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
fn ort_flags() -> Vec<String> {
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
