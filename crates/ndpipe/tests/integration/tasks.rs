//! Tasks on one backbone (issue 22): the general task's ImageNet labels survive a custom task's
//! fine-tune, every upload is labelled for every task from one backbone pass, a head's label
//! rules make a cat `other` in a clothing task, a fine-tune that would lower accuracy stays a
//! candidate (until forced), labels are given by ids, a CSV file and by accepting predictions,
//! and a store from before tasks keeps its labels, head and ground truth.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Instance, cli, sample};

/// Fashion-MNIST photos imported for the clothing task.
const FASHION: usize = 280;

/// Starts `POST path` with `body` on the store's embedded Tuner and follows the job until it
/// ends (a hang guard, not a time limit); returns the job.
pub(crate) async fn job(inst: &Instance, path: &str, body: Value) -> Value {
    let response = inst
        .client()
        .post(format!("{}{path}", inst.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let started: Value = response.json().await.unwrap();
    assert_eq!(status, 202, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let job = inst.json(&format!("/v1/tuner/jobs/{id}")).await;
        if job["phase"] == "done" || job["phase"] == "failed" {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "the job hangs: {job}\n{}",
            inst.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `POST path` with a JSON body: (status, reply).
pub(crate) async fn post(inst: &Instance, path: &str, body: Value) -> (u16, Value) {
    let response = inst
        .client()
        .post(format!("{}{path}", inst.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Imports Fashion-MNIST photos with their class as ground truth of `task`.
pub(crate) fn import_for(inst: &Instance, task: &str, limit: usize) {
    let fm = std::env::var("NDPIPE_FASHION_MNIST_DIR")
        .unwrap_or_else(|_| "/usr/share/datasets/fashion-mnist".into());
    let limit = limit.to_string();
    let (ok, out, err) = cli(&[
        "import",
        "--server",
        &inst.url,
        "--quiet",
        "--fashion-mnist",
        "--fashion-mnist-dir",
        &fm,
        "--limit",
        &limit,
        "--task",
        task,
    ]);
    assert!(ok, "{out}{err}");
}

/// The labels of a photo's active version of `task`.
pub(crate) fn task_labels<'a>(labels: &'a Value, task: &str) -> Option<&'a Vec<Value>> {
    labels
        .as_array()?
        .iter()
        .find(|v| v["task"] == task && v["active"] == true)?["labels"]
        .as_array()
}

/// `chelsea.png` (a cat) re-encoded as a JPEG: the same cat, other bytes.
fn another_cat() -> Vec<u8> {
    let img = image::load_from_memory(&sample("chelsea.png")).unwrap();
    let mut out = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut out),
        image::ImageFormat::Jpeg,
    )
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn general_tags_survive_a_custom_task_and_every_upload_gets_both() {
    let inst = Instance::start_with_model(&[]);
    assert_eq!(
        post(&inst, "/v1/tasks", json!({"name": "fashion"})).await.0,
        201
    );
    let (status, dup) = post(&inst, "/v1/tasks", json!({"name": "fashion"})).await;
    assert_eq!((status, dup["error"].as_str()), (409, Some("conflict")));
    assert_eq!(
        post(&inst, "/v1/tasks", json!({"name": "Bad Name"}))
            .await
            .0,
        400
    );
    assert_eq!(inst.get("/v1/tasks/nope").await.0, 404);
    let (status, refused) = inst
        .upload(sample("coffee.png"), "?label=cup&task=nope")
        .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (404, Some("unknown_task"))
    );

    import_for(&inst, "fashion", FASHION);
    let (_, cat) = inst.upload(sample("chelsea.png"), "").await;
    let (_, cup) = inst.upload(sample("coffee.png"), "").await;
    let (cat, cup) = (cat["id"].as_u64().unwrap(), cup["id"].as_u64().unwrap());
    inst.wait_labelled(FASHION as u64 + 2).await;

    let done = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"task": "fashion", "runs": 1, "epochs": 20, "batch": 64}),
    )
    .await;
    assert_eq!(done["phase"], "done", "{done}\n{}", inst.log());
    let report = &done["result"]["finetune"];
    assert_eq!(report["task"], "fashion");
    assert!(
        report["gate"]["passed"] == true && report["deploy"].is_object(),
        "{report}"
    );
    assert_eq!(
        report["per_class"].as_array().unwrap().len(),
        10,
        "{report}"
    );

    // The cat keeps its ImageNet label in the general task and is `other` in the clothing task.
    let labels = inst.json(&format!("/v1/photos/{cat}/labels")).await;
    let general = task_labels(&labels, "general").expect("general labels");
    let top = general[0]["label"].as_str().unwrap();
    assert!(top.contains("cat"), "{labels}");
    let fashion = task_labels(&labels, "fashion").expect("fashion labels");
    assert_eq!(fashion[0]["label"], "other", "{labels}");
    let cup_labels = inst.json(&format!("/v1/photos/{cup}/labels")).await;
    assert_eq!(
        task_labels(&cup_labels, "fashion").unwrap()[0]["label"],
        "other"
    );

    // Search reads every task; a class of the clothing task never finds the cat.
    let tabby = inst.json("/v1/search?label=tabby").await;
    assert!(
        tabby["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == cat && h["task"] == "general"),
        "{tabby}"
    );
    let trousers = inst
        .json("/v1/search?label=Trouser&task=fashion&limit=500")
        .await;
    let hits = trousers["hits"].as_array().unwrap();
    assert!(!hits.is_empty() && hits.len() < FASHION / 4, "{trousers}");
    assert!(hits.iter().all(|h| h["id"] != cat && h["id"] != cup));
    // A class the task does not have is told apart from one without photos.
    let (status, body) = inst.get("/v1/search?label=tabby&task=fashion").await;
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_class"))
    );

    // Search in words maps onto every task's classes: "kitty" finds the cat, "coffee cup" the
    // espresso, "jeans" the clothing task's trousers; nonsense finds nothing.
    let found = |reply: &Value, id: u64| {
        reply["hits"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["id"] == id))
    };
    let kitty = inst.json("/v1/search?q=kitty").await;
    assert!(found(&kitty, cat), "{kitty}");
    let coffee = inst.json("/v1/search?q=coffee%20cup").await;
    assert!(found(&coffee, cup), "{coffee}");
    let jeans = inst.json("/v1/search?q=jeans&limit=500").await;
    assert!(
        (jeans["matched"].as_array().unwrap().iter())
            .any(|m| m["task"] == "fashion" && m["class"] == "Trouser"),
        "{jeans}"
    );
    assert!(!jeans["hits"].as_array().unwrap().is_empty(), "{jeans}");
    let nonsense = inst.json("/v1/search?q=qwxz%20zzkj").await;
    assert!(
        nonsense["matched"].as_array().unwrap().is_empty()
            && nonsense["hits"].as_array().unwrap().is_empty(),
        "{nonsense}"
    );
    let (ok, out, err) = cli(&[
        "photos", "--server", &inst.url, "search", "--words", "kitty",
    ]);
    assert!(ok && out.contains(&format!("{cat} ")), "{out}{err}");

    // A photo uploaded after the deploy gets both tasks' labels.
    let (_, late) = inst.upload(another_cat(), "").await;
    let late = late["id"].as_u64().unwrap();
    let labels = inst
        .wait_for(&format!("/v1/photos/{late}/labels"), 60, |v| {
            task_labels(v, "general").is_some() && task_labels(v, "fashion").is_some()
        })
        .await;
    assert!(
        task_labels(&labels, "general").unwrap()[0]["label"]
            .as_str()
            .unwrap()
            .contains("cat")
    );
    assert_eq!(
        task_labels(&labels, "fashion").unwrap()[0]["label"],
        "other"
    );

    // The tasks list reports each task's share of `other`.
    let tasks = inst.json("/v1/tasks").await;
    let fashion = tasks
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "fashion")
        .unwrap();
    assert!(fashion["other"].as_u64().unwrap() >= 3, "{fashion}");
    assert!(fashion["other_share"].as_f64().unwrap() < 0.2, "{fashion}");
    let (ok, out, err) = cli(&["tasks", "--server", &inst.url, "list"]);
    assert!(
        ok && out.contains("fashion") && out.contains("general"),
        "{out}{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worse_fine_tune_stays_a_candidate_and_labels_come_from_ids_csv_and_accepts() {
    let inst = Instance::start_with_model(&[]);
    assert_eq!(
        post(&inst, "/v1/tasks", json!({"name": "fashion"})).await.0,
        201
    );
    import_for(&inst, "fashion", FASHION);
    inst.wait_labelled(FASHION as u64).await;
    let good = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"task": "fashion", "runs": 1, "epochs": 20, "batch": 64}),
    )
    .await;
    let good = &good["result"]["finetune"];
    let parent = good["version"].as_str().unwrap().to_string();

    // One step of a fresh head validates far below its parent on the same photos: it is
    // recorded, not deployed.
    let worse = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"task": "fashion", "runs": 1, "epochs": 1, "batch": 1024, "from_scratch": true}),
    )
    .await;
    let worse = &worse["result"]["finetune"];
    assert_eq!(worse["gate"]["passed"], false, "{worse}");
    assert!(worse["deploy"].is_null(), "{worse}");
    assert_eq!(worse["parent"], parent.as_str());
    let versions = inst.json("/v1/tuner/versions").await;
    let active_fashion: Vec<&Value> = versions
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["task"] == "fashion" && v["active"] == true)
        .collect();
    assert_eq!(active_fashion.len(), 1);
    assert_eq!(active_fashion[0]["id"], parent.as_str(), "{versions}");
    // Forced, it deploys.
    let forced = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"task": "fashion", "runs": 1, "epochs": 1, "batch": 1024, "from_scratch": true, "force": true}),
    )
    .await;
    let forced = &forced["result"]["finetune"];
    assert!(
        forced["gate"]["forced"] == true && forced["deploy"].is_object(),
        "{forced}"
    );

    // A task of two classes, labelled by ids and from a CSV file.
    assert_eq!(
        post(&inst, "/v1/tasks", json!({"name": "tops"})).await.0,
        201
    );
    let page = inst.json("/v1/photos?limit=1000").await;
    let of_split = |class: &str, split: &str| -> Vec<u64> {
        page["photos"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                p["ground_truths"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|t| t["label"] == class && t["split"] == split))
            })
            .map(|p| p["id"].as_u64().unwrap())
            .collect()
    };
    let of = |class: &str| of_split(class, "train");
    let tops: Vec<u64> = [of("Shirt"), of("T-shirt/top"), of("Pullover")].concat();
    let sandals: Vec<u64> = [of("Sandal"), of("Sneaker"), of("Ankle boot")].concat();
    let (status, one_class) = post(
        &inst,
        "/v1/tasks/tops/labels",
        json!({"class": "top", "ids": tops}),
    )
    .await;
    assert_eq!(status, 200, "{one_class}");
    let (status, refused) = post(&inst, "/v1/tuner/finetune", json!({"task": "tops"})).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (400, Some("too_few_classes")),
        "{refused}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("labels.csv");
    let lines: String = sandals.iter().map(|id| format!("{id},shoe\n")).collect();
    std::fs::write(&csv, format!("id,class\n{lines}")).unwrap();
    let (ok, out, err) = cli(&[
        "label",
        "--server",
        &inst.url,
        "--task",
        "tops",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(
        ok && out.contains(&format!("labelled {}", sandals.len())),
        "{out}{err}"
    );
    let tops = inst.json("/v1/tasks/tops").await;
    assert_eq!(tops["ground_truth"].as_array().unwrap().len(), 2, "{tops}");
    let done = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"task": "tops", "runs": 1, "epochs": 20, "batch": 64}),
    )
    .await;
    assert_eq!(done["phase"], "done", "{done}");

    // A cat is neither a top nor a shoe: `other`, which cannot be accepted as a class.
    let (_, cat) = inst.upload(sample("chelsea.png"), "").await;
    let cat = cat["id"].as_u64().unwrap();
    inst.wait_for(&format!("/v1/photos/{cat}/labels"), 60, |v| {
        task_labels(v, "tops").is_some()
    })
    .await;
    let (status, refused) = post(&inst, &format!("/v1/photos/{cat}/labels/tops"), json!({})).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("no_prediction")),
        "{refused}"
    );
    // Accepting a prediction makes it ground truth: a held-out shirt the task calls a top.
    let mut accepted = None;
    for tshirt in [of_split("Shirt", "test"), of_split("T-shirt/top", "test")].concat() {
        let labels = inst.json(&format!("/v1/photos/{tshirt}/labels")).await;
        if task_labels(&labels, "tops").is_some_and(|l| l[0]["label"] == "top") {
            let (status, truth) = post(
                &inst,
                &format!("/v1/photos/{tshirt}/labels/tops"),
                json!({}),
            )
            .await;
            assert_eq!(status, 200, "{truth}");
            accepted = Some((tshirt, truth));
            break;
        }
    }
    let (tshirt, truth) = accepted.expect("some held-out shirt is a top for the task");
    assert_eq!(
        (truth["task"].as_str(), truth["label"].as_str()),
        (Some("tops"), Some("top"))
    );
    let meta = inst.json(&format!("/v1/photos/{tshirt}/meta")).await;
    assert!(
        meta["ground_truths"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["task"] == "tops" && t["label"] == "top"),
        "{meta}"
    );
    // A correction, and the general task takes no labels.
    let unlabelled = of("Bag")[0];
    let (status, corrected) = post(
        &inst,
        &format!("/v1/photos/{unlabelled}/labels/tops"),
        json!({"class": "bag"}),
    )
    .await;
    assert_eq!((status, corrected["label"].as_str()), (200, Some("bag")));
    let (status, general) = post(
        &inst,
        "/v1/tasks/general/labels",
        json!({"class": "tabby", "ids": [1]}),
    )
    .await;
    assert_eq!(
        (status, general["error"].as_str()),
        (400, Some("builtin_task"))
    );
    let (status, missing) = post(
        &inst,
        "/v1/tasks/nope/labels",
        json!({"class": "x", "ids": [1]}),
    )
    .await;
    assert_eq!(
        (status, missing["error"].as_str()),
        (404, Some("unknown_task"))
    );
}

/// A store written by the build before tasks (`tests/fixtures/store-v1.tar.xz`: the cat, the
/// coffee cup and 70 Fashion-MNIST photos, a fine-tuned head deployed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_tasks_keeps_its_labels_head_and_ground_truth() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v1.tar.xz");
    let status = std::process::Command::new("tar")
        .arg("-xJf")
        .arg(&fixture)
        .arg("-C")
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let model = crate::common::model_dir();
    let data = tmp.path().join("data");
    let inst = Instance::launch_at(
        data,
        &[
            "--model-dir",
            model.to_str().unwrap(),
            "--intra-threads",
            "2",
        ],
    );
    let tasks = inst.json("/v1/tasks").await;
    let named = |name: &str| {
        tasks
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{tasks}"))
    };
    let default = named("default");
    let head = default["active_version"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        head.starts_with("ft-"),
        "the old active head is the default task's: {tasks}"
    );
    assert_eq!(
        default["ground_truth"].as_array().unwrap().len(),
        10,
        "{default}"
    );
    let general = named("general");
    assert!(
        general["active_version"]["id"]
            .as_str()
            .unwrap()
            .starts_with("efficientnet-lite0-")
    );

    // The cat (photo 1) kept both version's labels: nothing was re-labelled.
    let labels = inst.json("/v1/photos/1/labels").await;
    assert!(
        task_labels(&labels, "general").unwrap()[0]["label"]
            .as_str()
            .unwrap()
            .contains("cat"),
        "{labels}"
    );
    assert!(task_labels(&labels, "default").is_some(), "{labels}");
    let tabby = inst.json("/v1/search?label=tabby").await;
    assert!(
        tabby["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == 1),
        "{tabby}"
    );

    // The Tuner's registry migrated too: a new fine-tune of the default task derives from
    // the old head.
    let done = job(
        &inst,
        "/v1/tuner/finetune",
        json!({"runs": 1, "epochs": 5, "batch": 32, "deploy": false}),
    )
    .await;
    assert_eq!(done["phase"], "done", "{done}\n{}", inst.log());
    assert_eq!(done["result"]["finetune"]["parent"], head.as_str());
}
