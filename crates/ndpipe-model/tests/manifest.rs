//! Manifest validation, normalisation and the fake backend; no ONNX Runtime needed.

use ndpipe_model::{Layout, ModelError, ModelManifest, Normalizer};
use serde_json::{Value, json};

fn good_manifest() -> Value {
    json!({
        "name": "tiny",
        "model_file": "tiny.onnx",
        "input": "input",
        "input_size": [2, 2],
        "layout": "NCHW",
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.25],
        "outputs": {"features": "features", "logits": "logits"},
        "feature_dim": 4,
        "num_classes": 3,
        "classes_file": "classes.txt"
    })
}

fn write_dir(manifest: &Value, classes: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.json"), manifest.to_string()).unwrap();
    std::fs::write(dir.path().join("classes.txt"), classes).unwrap();
    dir
}

/// Loads a manifest with `edit` applied and `classes` as the classes file, and checks that the
/// error names `file` (relative to the model directory) and says `want`.
fn expect_error(edit: impl FnOnce(&mut Value), classes: &str, want: &str, file: &str) {
    let mut manifest = good_manifest();
    edit(&mut manifest);
    let dir = write_dir(&manifest, classes);
    match ModelManifest::load(dir.path()) {
        Err(ModelError::Manifest { path, reason }) => {
            assert!(reason.contains(want), "expected `{want}` in `{reason}`");
            assert_eq!(path, dir.path().join(file), "{reason}");
        }
        other => panic!("expected a manifest error saying `{want}`, got {other:?}"),
    }
}

const CLASSES: &str = "cat\ndog\nespresso\n";

#[test]
fn a_good_manifest_loads_with_its_classes() {
    let dir = write_dir(&good_manifest(), CLASSES);
    let m = ModelManifest::load(dir.path()).unwrap();
    assert_eq!(m.class_names(), ["cat", "dog", "espresso"]);
    assert_eq!(m.model_path(), dir.path().join("tiny.onnx"));
    assert_eq!(m.layout, Layout::Nchw);
    assert_eq!(m.dir(), dir.path());
}

#[test]
fn each_problem_is_named_with_its_file() {
    let (manifest, classes) = ("model.json", "classes.txt");
    expect_error(
        |m| m["mean"] = json!([0.5, 0.5]),
        CLASSES,
        "`mean` has 2 values",
        manifest,
    );
    expect_error(
        |m| m["std"] = json!([0.5, 0.0, 0.5]),
        CLASSES,
        "`std`",
        manifest,
    );
    expect_error(
        |m| m["input_size"] = json!([0, 224]),
        CLASSES,
        "zero side",
        manifest,
    );
    expect_error(
        |m| m["extra"] = json!(1),
        CLASSES,
        "unknown field `extra`",
        manifest,
    );
    expect_error(
        |m| m["layout"] = json!("CHW"),
        CLASSES,
        "unknown variant `CHW`",
        manifest,
    );
    expect_error(
        |m| m["outputs"]["logits"] = json!(""),
        CLASSES,
        "`outputs.logits` is empty",
        manifest,
    );
    expect_error(
        |m| m["outputs"]["logits"] = json!("features"),
        CLASSES,
        "are both",
        manifest,
    );
    expect_error(
        |m| m["feature_dim"] = json!(0),
        CLASSES,
        "must be > 0",
        manifest,
    );
    let drop_input = |m: &mut Value| {
        m.as_object_mut().unwrap().remove("input");
    };
    expect_error(drop_input, CLASSES, "missing field `input`", manifest);
    let two = "has 2 class names, the manifest's `num_classes` is 3";
    expect_error(|_| (), "cat\ndog\n", two, classes);
    expect_error(|_| (), "cat\n\nespresso\n", "line 2 is empty", classes);
    let gone = |m: &mut Value| m["classes_file"] = json!("gone.txt");
    expect_error(gone, CLASSES, "cannot read classes file", "gone.txt");
}

#[test]
fn a_missing_manifest_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = ModelManifest::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("model.json: cannot read"), "{err}");
}

#[test]
fn normalisation_uses_mean_std_and_layout() {
    let dir = write_dir(&good_manifest(), CLASSES);
    let mut m = ModelManifest::load(dir.path()).unwrap();
    // 2x2 image: pixels (0,128,255), (255,0,0), (0,255,0), (0,0,255)
    let data = vec![0, 128, 255, 255, 0, 0, 0, 255, 0, 0, 0, 255];
    let img = ndpipe_model::ImageTensor::new(2, 2, 3, data).unwrap();
    let mut out = Vec::new();
    Normalizer::new(&m).fill(&[img.clone(), img.clone()], &mut out);
    let b = 1.0 / 0.25 * 0.5; // blue: (1 - 0.5) / 0.25
    let r_plane = [-1.0, 1.0, -1.0, -1.0];
    assert_eq!(out.len(), 24);
    assert_eq!(&out[..4], &r_plane);
    assert!((out[4] - (128.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6);
    assert_eq!(&out[8..12], &[b, -2.0, -2.0, b]);
    assert_eq!(&out[12..16], &r_plane);
    m.layout = Layout::Nhwc;
    Normalizer::new(&m).fill(&[img], &mut out);
    assert_eq!(out.len(), 12);
    assert_eq!(&out[..3], &[-1.0, (128.0 / 255.0 - 0.5) / 0.5, b]);
    assert_eq!(Normalizer::new(&m).shape(5), [5, 2, 2, 3]);
}

#[cfg(feature = "testing")]
mod fake {
    use ndpipe_model::{FakeBackend, ImageTensor, InferenceBackend, ModelError};

    fn image(seed: u8) -> ImageTensor {
        let data = (0..224 * 224 * 3)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        ImageTensor::new(224, 224, 3, data).unwrap()
    }

    #[test]
    fn the_fake_is_deterministic_and_batch_independent() {
        let fake = FakeBackend::new(64, 10).with_max_batch(4);
        let batch = [image(1), image(3), image(7)];
        let together = fake.run(&batch).unwrap();
        for (i, img) in batch.iter().enumerate() {
            let alone = fake.run(std::slice::from_ref(img)).unwrap();
            assert_eq!(alone.features(0), together.features(i));
            assert_eq!(alone.logits(0), together.logits(i));
        }
        assert_ne!(together.features(0), together.features(1));
        assert_eq!(fake.batches(), 4);
        assert_eq!(fake.info().class_name(9), Some("class 9"));
    }

    #[test]
    fn the_fake_checks_batches_and_can_fail() {
        let fake = FakeBackend::new(8, 2).with_max_batch(1);
        assert!(matches!(
            fake.run(&[image(1), image(2)]),
            Err(ModelError::BatchTooLarge { .. })
        ));
        let small = ImageTensor::new(8, 8, 3, vec![0; 192]).unwrap();
        assert!(matches!(
            fake.run(&[small]),
            Err(ModelError::InputShape { .. })
        ));
        fake.set_failing(true);
        assert!(fake.health().is_err());
        assert!(fake.run(&[image(1)]).is_err());
        fake.set_failing(false);
        assert!(fake.health().is_ok());
    }
}
