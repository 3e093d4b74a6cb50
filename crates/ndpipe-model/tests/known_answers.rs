//! Known answers of the real model on real photos, through our own preprocessing.
#![cfg(feature = "ort")]

mod common;

use std::path::Path;

use ndpipe_model::{InferenceBackend, ModelInfo, top_k};
use sha2::Digest;

/// Index of the class whose name (first lemma) is `lemma`.
fn class(info: &ModelInfo, lemma: &str) -> usize {
    info.class_names
        .iter()
        .position(|n| n.split(", ").next() == Some(lemma))
        .unwrap_or_else(|| panic!("no class named {lemma}"))
}

fn top5_names(dir: &Path, file: &str) -> (Vec<usize>, Vec<String>) {
    let backend = common::backend(dir);
    let out = backend.run(&[common::sample(dir, file)]).unwrap();
    let top = top_k(out.logits(0), 5);
    let info = backend.info();
    let names = top
        .iter()
        .map(|&(i, p)| format!("{} ({p:.3})", info.class_name(i).unwrap()))
        .collect();
    (top.iter().map(|t| t.0).collect(), names)
}

#[test]
fn cat_photo_scores_a_cat() {
    let Some(dir) = common::model_dir("cat_photo_scores_a_cat") else {
        return;
    };
    let _serial = common::serial();
    let info = common::backend(&dir).info();
    let cats = ["tabby", "tiger cat", "Egyptian cat"].map(|c| class(info, c));
    let (top, names) = top5_names(&dir, "chelsea.png");
    assert!(
        top.iter().any(|i| cats.contains(i)),
        "chelsea top-5: {names:?}"
    );
}

#[test]
fn coffee_photo_is_espresso() {
    let Some(dir) = common::model_dir("coffee_photo_is_espresso") else {
        return;
    };
    let _serial = common::serial();
    let espresso = class(common::backend(&dir).info(), "espresso");
    let (top, names) = top5_names(&dir, "coffee.png");
    assert_eq!(top[0], espresso, "coffee top-5: {names:?}");
}

#[test]
fn rocket_photo_is_a_missile() {
    let Some(dir) = common::model_dir("rocket_photo_is_a_missile") else {
        return;
    };
    let _serial = common::serial();
    let info = common::backend(&dir).info();
    let wanted = [class(info, "missile"), class(info, "projectile")];
    let (top, names) = top5_names(&dir, "rocket.jpg");
    assert!(
        top.iter().any(|i| wanted.contains(i)),
        "rocket top-5: {names:?}"
    );
}

#[test]
fn a_batch_equals_single_runs() {
    let Some(dir) = common::model_dir("a_batch_equals_single_runs") else {
        return;
    };
    let _serial = common::serial();
    let backend = common::backend(&dir);
    let files = [
        "chelsea.png",
        "coffee.png",
        "rocket.jpg",
        "astronaut.png",
        "camera.png",
    ];
    let batch: Vec<_> = files.iter().map(|f| common::sample(&dir, f)).collect();
    let together = backend.run(&batch).unwrap();
    assert_eq!(together.len(), files.len());
    let mut worst = 0.0f32;
    for (i, tensor) in batch.iter().enumerate() {
        let alone = backend.run(std::slice::from_ref(tensor)).unwrap();
        let pairs = alone
            .features(0)
            .iter()
            .zip(together.features(i))
            .chain(alone.logits(0).iter().zip(together.logits(i)));
        for (a, b) in pairs {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!(
        "batch of {} vs single runs: max abs difference {worst:e}",
        files.len()
    );
    assert!(worst <= 1e-4, "batch and single runs differ by {worst}");
}

/// Our preprocessing (fast_image_resize) against the PIL pipeline that produced known_answers.json.
#[test]
fn feature_norms_match_the_python_reference() {
    let Some(dir) = common::model_dir("feature_norms_match_the_python_reference") else {
        return;
    };
    let _serial = common::serial();
    let backend = common::backend(&dir);
    let text = std::fs::read_to_string(dir.join("known_answers.json")).unwrap();
    let known: serde_json::Value = serde_json::from_str(&text).unwrap();
    let photos = known["photos"]
        .as_object()
        .expect("known_answers.json has `photos`");
    let mut worst = (0.0f64, String::new());
    let mut top1_agree = 0;
    eprintln!(
        "{:<22} {:>9} {:>9} {:>7}  top-1 ours / reference",
        "photo", "ours", "python", "diff%"
    );
    for (file, answer) in photos {
        let out = backend.run(&[common::sample(&dir, file)]).unwrap();
        let norm = f64::from(out.features(0).iter().map(|v| v * v).sum::<f32>().sqrt());
        let reference = answer["feature_l2"].as_f64().unwrap();
        let diff = (norm - reference).abs() / reference * 100.0;
        let ours = top_k(out.logits(0), 1)[0].0;
        let theirs = answer["top5"][0]["index"].as_u64().unwrap() as usize;
        top1_agree += usize::from(ours == theirs);
        eprintln!(
            "{file:<22} {norm:>9.4} {reference:>9.4} {diff:>7.3}  {} / {}",
            backend.info().class_name(ours).unwrap(),
            backend.info().class_name(theirs).unwrap()
        );
        if diff > worst.0 {
            worst = (diff, file.clone());
        }
    }
    eprintln!(
        "worst feature-norm difference {:.3}% ({}); top-1 agrees on {top1_agree}/{}",
        worst.0,
        worst.1,
        photos.len()
    );
    assert!(
        worst.0 < 2.0,
        "feature norm of {} differs by {:.3}%",
        worst.1,
        worst.0
    );
}

#[test]
fn health_and_version_are_reported() {
    let Some(dir) = common::model_dir("health_and_version_are_reported") else {
        return;
    };
    let _serial = common::serial();
    let backend = common::backend(&dir);
    backend.health().unwrap();
    let onnx = std::fs::read(backend.manifest().model_path()).unwrap();
    assert_eq!(
        backend.backbone_version(),
        hex::encode(sha2::Sha256::digest(&onnx))
    );
    let info = backend.info();
    assert_eq!(
        (info.feature_dim, info.num_classes, info.input_size),
        (1280, 1000, [224, 224])
    );
    assert_eq!(backend.max_batch(), 32);
    assert!(backend.run(&[]).unwrap().is_empty());
}
