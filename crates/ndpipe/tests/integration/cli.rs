//! The command line: import, photos, compact, and their error exits.

use crate::common::{Instance, cli, import_fashion, samples_dir};

#[tokio::test]
async fn import_a_folder_and_fashion_mnist() {
    let inst = Instance::start();
    let dir = samples_dir();
    let (ok, out, err) = cli(&[
        "import",
        "--server",
        &inst.url,
        "--quiet",
        "--label-from-folder",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("imported 20 photos"), "{out}");
    let out = import_fashion(&inst, 0, 70);
    assert!(out.contains("imported 70 photos"), "{out}");
    let page = inst.json("/v1/photos?after=20&limit=100").await;
    let photos = page["photos"].as_array().unwrap();
    assert_eq!(photos.len(), 70);
    let train = photos
        .iter()
        .filter(|p| p["ground_truth"]["split"] == "train")
        .count();
    assert_eq!(train, 60);
    let classes: std::collections::HashSet<&str> = photos
        .iter()
        .map(|p| p["ground_truth"]["label"].as_str().unwrap())
        .collect();
    assert!(
        classes.contains("Ankle boot"),
        "the first training image is an ankle boot: {classes:?}"
    );
    assert!(
        classes.len() >= 8,
        "70 images cover most of the 10 classes: {classes:?}"
    );
    assert!(photos.iter().all(|p| p["width"] == 28 && p["height"] == 28));
    let first = inst.json("/v1/photos/1/meta").await;
    assert_eq!(first["ground_truth"]["label"], "samples");
}

#[tokio::test]
async fn import_reports_rejected_files_and_photos_commands_work() {
    let inst = Instance::start();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("good.jpg"), crate::common::jpeg(64, 64, 1)).unwrap();
    std::fs::write(tmp.path().join("broken.jpg"), b"\xFF\xD8\xFF not really").unwrap();
    std::fs::write(tmp.path().join("notes.txt"), b"skip me").unwrap();
    let (ok, out, err) = cli(&[
        "import",
        "--server",
        &inst.url,
        "--quiet",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("imported 1 photos"), "{out}");
    assert!(
        out.contains("skipped 1 non-photo files; rejected 1"),
        "{out}"
    );
    assert!(
        out.contains("broken.jpg"),
        "the rejected file is named: {out}"
    );

    let (ok, out, _) = cli(&["photos", "--server", &inst.url, "list"]);
    assert!(ok);
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("1 ")),
        "{out}"
    );
    let target = tmp.path().join("out.jpg");
    let (ok, _, err) = cli(&[
        "photos",
        "--server",
        &inst.url,
        "get",
        "1",
        "-o",
        target.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(&target).unwrap(),
        crate::common::jpeg(64, 64, 1)
    );
    let (ok, _, err) = cli(&["photos", "--server", &inst.url, "get", "999"]);
    assert!(!ok, "a missing photo must fail");
    assert!(err.contains("photo 999 does not exist"), "{err}");
    let (ok, out, err) = cli(&["photos", "--server", &inst.url, "delete", "1"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["compact", "--server", &inst.url]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("compacted"), "{out}");
    let (ok, _, err) = cli(&[
        "import",
        "--server",
        "http://127.0.0.1:1",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(!ok, "an unreachable server must fail the import");
    assert!(err.contains("uploads failed"), "{err}");
}
