//! The console's Label & train, Models and Duplicates pages in a real browser (headless
//! Chromium through chromedriver and fantoccini) against `ndpipe serve` with the real model:
//! three photos labelled from the grid, a fine-tune started and watched to its end without a
//! reload, its candidate deployed; a duplicates group seen and one of it deleted. Screenshots
//! of the pages go to `docs/console/` with `NDPIPE_SCREENSHOTS=1` (the harness's switch).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::browser::Browser;
use crate::common::{Instance, jpeg};
use crate::tasks::{import_for, post};

/// Fashion-MNIST photos imported with their class as the task's ground truth.
const FASHION: usize = 280;
/// Epochs of the fine-tune: enough that it runs for a few seconds.
const EPOCHS: &str = "1500";
/// How long the browser waits for a page's change (a hang guard).
const HANG: Duration = Duration::from_secs(600);

/// The text of the element `css`.
async fn text_of(browser: &Browser, css: &str) -> String {
    browser.find(css).await.text().await.unwrap()
}

/// Waits until the job's phase reads `done`, polled in by the page itself (a hang guard,
/// not a time limit: fine-tunes take longer than the harness's usual wait).
async fn wait_done(browser: &Browser, inst: &Instance) {
    let deadline = Instant::now() + HANG;
    loop {
        let phase = browser
            .run("const p = document.getElementById('phase'); return p ? p.textContent : '';")
            .await;
        if phase == "done" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the job never ended ({phase})\n{}",
            inst.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Labelled photos of `class` in `task`'s training split.
async fn train_count(inst: &Instance, task: &str, class: &str) -> u64 {
    let view = inst.json(&format!("/v1/tasks/{task}")).await;
    view["ground_truth"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == class)
        .map_or(0, |c| c["train"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_three_photos_fine_tune_watch_it_live_and_deploy_it() {
    let inst = Instance::start_with_model(&[]);
    assert_eq!(
        post(&inst, "/v1/tasks", json!({"name": "tops"})).await.0,
        201
    );
    let mut picked = Vec::new();
    for seed in 0..3 {
        let (status, body) = inst.upload(jpeg(96, 96, seed), "").await;
        assert_eq!(status, 201, "{body}");
        picked.push(body["id"].as_u64().unwrap());
    }
    import_for(&inst, "tops", FASHION);
    let class = inst.json("/v1/tasks/tops").await["ground_truth"][0]["class"]
        .as_str()
        .unwrap()
        .to_string();
    let before = train_count(&inst, "tops", &class).await;

    let Some(browser) = Browser::start().await else {
        return;
    };
    let url = |path: &str| format!("{}{path}", inst.url);
    browser.open(&url("/ui/train?task=tops")).await;
    for id in &picked {
        browser
            .click(&format!("#label-form input[name=id][value='{id}']"))
            .await;
    }
    browser.fill("#label-form input[name=class]", &class).await;
    browser.screenshot("train").await;
    browser.click("#label-form button[type=submit]").await;
    let note = text_of(&browser, "#note").await;
    assert!(note.starts_with("3 photos labelled"), "{note}");
    assert_eq!(train_count(&inst, "tops", &class).await, before + 3);
    browser.assert_no_errors("label & train").await;

    // Enough epochs that the job is still running when its page first shows.
    browser.fill("#finetune input[name=epochs]", EPOCHS).await;
    browser.click("#finetune button[type=submit]").await;
    let job_page = browser.wait_for_path("/ui/train/jobs/ft-").await;
    browser.run("window.stillThisPage = true;").await;
    let first = text_of(&browser, "#phase").await;
    assert_ne!(first, "done", "the job ended before its page showed");
    wait_done(&browser, &inst).await;
    let same = browser.run("return window.stillThisPage === true;").await;
    assert_eq!(same, json!(true), "the page was reloaded");
    assert_eq!(browser.path().await, job_page);
    browser.find("#job-chart canvas").await;
    let chart = format!("return fetch('{job_page}/chart').then(r => r.json());");
    let chart = browser.run(&chart).await;
    let runs = chart["runs"].as_array().unwrap();
    assert!(
        !runs.is_empty() && runs.iter().all(|r| r["train_loss"].as_f64().unwrap() > 0.0),
        "the chart has each run's accuracy and loss: {chart}"
    );
    let gate = text_of(&browser, "#gate").await;
    assert!(gate.contains("Validation top-1"), "{gate}");
    browser.assert_no_errors("a fine-tune's page").await;
    browser.screenshot("train_job").await;

    let version = (browser.find("#deploy input[name=version]").await)
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let active = |versions: &Value| {
        versions
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["id"] == version.as_str() && v["active"] == true)
    };
    let versions = inst.json("/v1/tuner/versions").await;
    assert!(!active(&versions), "a candidate: {versions}");
    browser.click("#deploy button[type=submit]").await;
    browser.wait_for_path("/ui/train/jobs/deploy-").await;
    wait_done(&browser, &inst).await;
    let versions = inst.json("/v1/tuner/versions").await;
    assert!(active(&versions), "deployed: {versions}");
    browser.open(&url("/ui/models")).await;
    browser.wait_for_text(&format!("{version} active")).await;
    browser.assert_no_errors("the model registry").await;
    browser.screenshot("models").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicates_group_is_seen_and_one_of_it_deleted() {
    let inst = Instance::start_with(&["--exact-duplicates", "store"]);
    let bytes = jpeg(128, 128, 7);
    let (_, first) = inst.upload(bytes.clone(), "").await;
    let (status, copy) = inst.upload(bytes, "").await;
    assert_eq!(status, 201, "{copy}");
    let (first, copy) = (first["id"].as_u64().unwrap(), copy["id"].as_u64().unwrap());
    let (_, other) = inst.upload(jpeg(128, 128, 8), "").await;

    let Some(browser) = Browser::start().await else {
        return;
    };
    browser
        .open(&format!("{}/ui/duplicates?level=exact", inst.url))
        .await;
    let group = text_of(&browser, &format!("#group-{first}")).await;
    assert!(group.contains("exact of"), "{group}");
    assert!(group.contains(&format!("#{copy}")), "{group}");
    assert!(!group.contains(&format!("#{}", other["id"])), "{group}");
    let keeper = (browser.find(&format!("#group-{first} .keeper input[name=id]"))).await;
    assert!(
        !keeper.is_selected().await.unwrap(),
        "the keeper is not checked"
    );
    let keep: u64 = keeper
        .attr("value")
        .await
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    browser.assert_no_errors("duplicates").await;
    browser.screenshot("duplicates").await;
    browser
        .click(&format!("#group-{first} button[type=submit]"))
        .await;
    assert_eq!(text_of(&browser, "#note").await, "1 photos deleted");
    let gone = if keep == first { copy } else { first };
    assert_eq!(inst.get(&format!("/v1/photos/{gone}/meta")).await.0, 404);
    assert_eq!(inst.get(&format!("/v1/photos/{keep}/meta")).await.0, 200);
    assert!(
        !browser.text().await.contains(&format!("#{gone}")),
        "the group is gone"
    );
    browser.open(&format!("{}/ui/storage", inst.url)).await;
    browser.wait_for_text("Ingest and label rates").await;
    browser.find("#rates-chart canvas").await;
    browser.assert_no_errors("storage").await;
    browser.screenshot("storage").await;
}
