//! A bad model directory or configuration is a clear error at load, never a crash later.
#![cfg(feature = "ort")]

mod common;

use std::path::Path;

use ndpipe_model::{
    ExecutionProvider, ImageTensor, InferenceBackend, ModelError, OrtBackend, RuntimeConfig,
};
use serde_json::{Value, json};

/// A model directory whose manifest is the real one with `edit` applied; the model and classes
/// files stay in `real` (absolute paths) unless `edit` changes them.
fn model_dir_with(real: &Path, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let text = std::fs::read_to_string(real.join("model.json")).unwrap();
    let mut manifest: Value = serde_json::from_str(&text).unwrap();
    for field in ["model_file", "classes_file"] {
        let file = manifest[field].as_str().unwrap().to_string();
        manifest[field] = json!(real.join(file));
    }
    edit(&mut manifest);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.json"), manifest.to_string()).unwrap();
    dir
}

fn load_err(dir: &Path, config: &RuntimeConfig) -> ModelError {
    let err = OrtBackend::load(dir, config).expect_err("the load should fail");
    eprintln!("{err}");
    err
}

#[test]
fn missing_model_file() {
    let Some(real) = common::model_dir("missing_model_file") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["model_file"] = json!("nowhere.onnx"));
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(&err, ModelError::ModelFile { path, .. } if path.ends_with("nowhere.onnx")));
    assert!(err.to_string().contains("No such file"), "{err}");
}

#[test]
fn truncated_model_file() {
    let Some(real) = common::model_dir("truncated_model_file") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["model_file"] = json!("truncated.onnx"));
    let bytes = std::fs::read(real.join("efficientnet-lite0.onnx")).unwrap();
    std::fs::write(dir.path().join("truncated.onnx"), &bytes[..bytes.len() / 3]).unwrap();
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(&err, ModelError::ModelFile { path, .. } if path.ends_with("truncated.onnx")));
    assert!(
        err.to_string().contains("ONNX Runtime cannot load it"),
        "{err}"
    );
}

#[test]
fn garbage_model_file() {
    let Some(real) = common::model_dir("garbage_model_file") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["model_file"] = json!("garbage.onnx"));
    std::fs::write(dir.path().join("garbage.onnx"), b"this is not a protobuf").unwrap();
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(err, ModelError::ModelFile { .. }));
}

#[test]
fn output_name_not_in_the_model() {
    let Some(real) = common::model_dir("output_name_not_in_the_model") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["outputs"]["features"] = json!("pooled"));
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(err, ModelError::Mismatch { .. }));
    let text = err.to_string();
    assert!(
        text.contains("`pooled`") && text.contains("features, logits"),
        "{text}"
    );
}

#[test]
fn input_name_not_in_the_model() {
    let Some(real) = common::model_dir("input_name_not_in_the_model") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["input"] = json!("pixel_values"));
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(err, ModelError::Mismatch { .. }));
    assert!(err.to_string().contains("`pixel_values`"), "{err}");
}

#[test]
fn wrong_feature_dim() {
    let Some(real) = common::model_dir("wrong_feature_dim") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["feature_dim"] = json!(512));
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(err, ModelError::Mismatch { .. }));
    assert!(err.to_string().contains("feature_dim = 512"), "{err}");
}

#[test]
fn wrong_input_size() {
    let Some(real) = common::model_dir("wrong_input_size") else {
        return;
    };
    let _serial = common::serial();
    let dir = model_dir_with(&real, |m| m["input_size"] = json!([256, 256]));
    let err = load_err(dir.path(), &common::config(&real));
    assert!(matches!(err, ModelError::Mismatch { .. }), "{err}");
}

#[test]
fn cuda_on_a_cpu_only_runtime() {
    let Some(real) = common::model_dir("cuda_on_a_cpu_only_runtime") else {
        return;
    };
    let _serial = common::serial();
    for provider in [ExecutionProvider::Cuda, ExecutionProvider::TensorRt] {
        let config = RuntimeConfig {
            execution_provider: provider,
            ..common::config(&real)
        };
        let err = load_err(&real, &config);
        assert!(matches!(err, ModelError::ExecutionProvider { .. }), "{err}");
        assert!(err.to_string().contains("was not built with it"), "{err}");
    }
}

#[test]
fn bad_batches_are_rejected() {
    let Some(real) = common::model_dir("bad_batches_are_rejected") else {
        return;
    };
    let _serial = common::serial();
    let backend = common::backend(&real);
    let small = ImageTensor::new(32, 32, 3, vec![0; 32 * 32 * 3]).unwrap();
    assert!(matches!(
        backend.run(&[small]),
        Err(ModelError::InputShape {
            index: 0,
            height: 32,
            ..
        })
    ));
    let grey = ImageTensor::new(224, 224, 1, vec![0; 224 * 224]).unwrap();
    assert!(matches!(
        backend.run(&[grey]),
        Err(ModelError::InputShape { channels: 1, .. })
    ));
    let ok = ImageTensor::new(224, 224, 3, vec![0; 224 * 224 * 3]).unwrap();
    let too_many = vec![ok; backend.max_batch() + 1];
    assert!(matches!(
        backend.run(&too_many),
        Err(ModelError::BatchTooLarge { len: 33, max: 32 })
    ));
}

#[test]
fn zero_max_batch_is_a_config_error() {
    let config = RuntimeConfig {
        max_batch: 0,
        ..RuntimeConfig::default()
    };
    let Some(real) = common::model_dir("zero_max_batch_is_a_config_error") else {
        return;
    };
    let err = OrtBackend::load(&real, &config).unwrap_err();
    assert!(matches!(err, ModelError::Config(_)), "{err}");
}

#[test]
fn runtime_config_reads_with_defaults_and_rejects_unknown_keys() {
    let config: RuntimeConfig = serde_json::from_str(
        r#"{"dylib": "/opt/ort/libonnxruntime.so.1", "execution_provider": "tensorrt"}"#,
    )
    .unwrap();
    assert_eq!(config.execution_provider, ExecutionProvider::TensorRt);
    assert_eq!((config.max_batch, config.intra_threads), (32, 0));
    let err = serde_json::from_str::<RuntimeConfig>(r#"{"threads": 2}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `threads`"), "{err}");
}
