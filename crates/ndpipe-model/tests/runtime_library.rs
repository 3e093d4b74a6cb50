//! The ONNX Runtime library: missing, not ONNX Runtime, too old, then the real one.
//!
//! One test in its own binary, because a process loads the library once: the bad libraries must be
//! tried before the good one.
#![cfg(feature = "ort")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ndpipe_model::{InferenceBackend, ModelError, OrtBackend, RuntimeConfig};

/// Builds a shared library from C source with the system compiler, or `None` if there is none.
fn build_stub(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let out = dir.join(name);
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&c)
        .status();
    match built {
        Ok(status) if status.success() => Some(out),
        other => {
            eprintln!(
                "SKIPPED part of the library test: cannot build a stub library with cc ({other:?})"
            );
            None
        }
    }
}

/// Exports `OrtGetApiBase` like ONNX Runtime 1.16.3 (C API 16) would.
const OLD_ORT: &str = r#"
typedef struct { const void *(*get_api)(unsigned); const char *(*version)(void); } OrtApiBase;
static const void *get_api(unsigned v) { (void)v; return 0; }
static const char *version(void) { return "1.16.3"; }
static const OrtApiBase base = { get_api, version };
const OrtApiBase *OrtGetApiBase(void) { return &base; }
"#;

fn load_err(model_dir: &Path, dylib: &Path) -> String {
    let config = RuntimeConfig {
        dylib: dylib.to_path_buf(),
        ..common::config(model_dir)
    };
    let err = OrtBackend::load(model_dir, &config).expect_err("the library should be rejected");
    assert!(
        matches!(&err, ModelError::Runtime { path, .. } if path == dylib),
        "{err}"
    );
    eprintln!("{err}");
    err.to_string()
}

#[test]
fn library_faults_then_the_real_library() {
    let Some(real) = common::model_dir("library_faults_then_the_real_library") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();

    let missing = tmp.path().join("libonnxruntime.so.1");
    assert!(load_err(&real, &missing).contains("no such file"));

    let text = tmp.path().join("not-a-library.so");
    std::fs::write(&text, "just text").unwrap();
    let err = load_err(&real, &text);
    assert!(
        err.contains("dlopen failed: "),
        "the system reason is missing: {err}"
    );

    if let Some(lib) = build_stub(
        tmp.path(),
        "libother.so",
        "int not_ort(void) { return 1; }\n",
    ) {
        assert!(load_err(&real, &lib).contains("does not export `OrtGetApiBase`"));
    }
    if let Some(lib) = build_stub(tmp.path(), "libonnxruntime.so.1.16.3", OLD_ORT) {
        let err = load_err(&real, &lib);
        assert!(err.contains("1.16.3") && err.contains("1.31"), "{err}");
    }

    let backend = OrtBackend::load(&real, &common::config(&real)).unwrap();
    backend.health().unwrap();

    let err = load_err(&real, &text);
    assert!(err.contains("already uses ONNX Runtime from"), "{err}");
}
