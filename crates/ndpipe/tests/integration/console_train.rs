//! The console's Label & train, Models and Duplicates pages in a real browser (headless
//! Chromium through chromedriver and fantoccini) against `ndpipe serve` with the real model:
//! three photos labelled from the grid, a fine-tune started and watched to its end without a
//! reload, its candidate deployed; a duplicates group seen and one of it deleted. Screenshots
//! of the pages go to `docs/console/` when `NDPIPE_CONSOLE_SCREENSHOTS` is set.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use crate::common::{Instance, free_port, jpeg};
use crate::tasks::{import_for, post};

/// Fashion-MNIST photos imported with their class as the task's ground truth.
const FASHION: usize = 280;
/// Epochs of the fine-tune: enough that it runs for a few seconds.
const EPOCHS: &str = "1500";
/// How long the browser waits for a page's change (a hang guard).
const HANG: Duration = Duration::from_secs(600);

/// chromedriver on a free port and a headless Chromium session of it.
struct Browser {
    driver: Child,
    client: Client,
}

impl Browser {
    async fn start() -> Self {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) must be installed");
        let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"]
            }
        }))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let connected = ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await;
            match connected {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no chromedriver session: {e}"),
            }
        };
        Browser { driver, client }
    }

    /// The text of the first element `css` finds.
    async fn text(&self, css: &str) -> String {
        let found = self.client.find(Locator::Css(css)).await;
        found
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// Waits until the element `css` reads `want` (a hang guard, not a time limit).
    async fn wait_text(&self, css: &str, want: &str, inst: &Instance) {
        let deadline = Instant::now() + HANG;
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && el.text().await.is_ok_and(|t| t.trim() == want)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{css} never read {want}\n{}",
                inst.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Saves a screenshot as `docs/console/{name}.png` when asked to.
    async fn screenshot(&self, name: &str) {
        if std::env::var_os("NDPIPE_CONSOLE_SCREENSHOTS").is_none() {
            return;
        }
        let png = self.client.screenshot().await.unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
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

    let browser = Browser::start().await;
    let c = &browser.client;
    c.goto(&format!("{}/ui/train?task=tops", inst.url))
        .await
        .unwrap();
    for id in &picked {
        let css = format!("#label-form input[name=id][value='{id}']");
        c.find(Locator::Css(&css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }
    let form = c.form(Locator::Css("#label-form")).await.unwrap();
    form.set_by_name("class", &class).await.unwrap();
    browser.screenshot("train").await;
    form.submit().await.unwrap();
    let note = browser.text("#note").await;
    assert!(note.starts_with("3 photos labelled"), "{note}");
    assert_eq!(train_count(&inst, "tops", &class).await, before + 3);

    // Enough epochs that the job is still running when its page first shows.
    let tune = c.form(Locator::Css("#finetune")).await.unwrap();
    tune.set_by_name("epochs", EPOCHS).await.unwrap();
    tune.submit().await.unwrap();
    let url = c.current_url().await.unwrap();
    assert!(url.path().starts_with("/ui/train/jobs/ft-"), "{url}");
    c.execute("window.stillThisPage = true;", vec![])
        .await
        .unwrap();
    let first = browser.text("#phase").await;
    assert_ne!(first, "done", "the job ended before its page showed");
    browser.wait_text("#phase", "done", &inst).await;
    let same = c
        .execute("return window.stillThisPage === true;", vec![])
        .await;
    assert_eq!(same.unwrap(), json!(true), "the page was reloaded");
    assert_eq!(c.current_url().await.unwrap(), url);
    assert!(
        c.find(Locator::Css("#job-chart canvas")).await.is_ok(),
        "the chart is drawn"
    );
    let gate = browser.text("#gate").await;
    assert!(gate.contains("Validation top-1"), "{gate}");
    browser.screenshot("train_job").await;

    let version = c
        .find(Locator::Css("#deploy input[name=version]"))
        .await
        .unwrap()
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
    assert!(
        !active(&inst.json("/v1/tuner/versions").await),
        "a candidate"
    );
    c.form(Locator::Css("#deploy"))
        .await
        .unwrap()
        .submit()
        .await
        .unwrap();
    let url = c.current_url().await.unwrap();
    assert!(url.path().starts_with("/ui/train/jobs/deploy-"), "{url}");
    browser.wait_text("#phase", "done", &inst).await;
    assert!(active(&inst.json("/v1/tuner/versions").await), "deployed");
    c.goto(&format!("{}/ui/models", inst.url)).await.unwrap();
    let registry = browser.text("main").await;
    assert!(
        registry.contains(&format!("{version} active")),
        "{registry}"
    );
    browser.screenshot("models").await;
    browser.close().await;
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

    let browser = Browser::start().await;
    let c = &browser.client;
    c.goto(&format!("{}/ui/duplicates?level=exact", inst.url))
        .await
        .unwrap();
    let group = browser.text(&format!("#group-{first}")).await;
    assert!(group.contains("exact of"), "{group}");
    assert!(group.contains(&format!("#{copy}")), "{group}");
    assert!(!group.contains(&format!("#{}", other["id"])), "{group}");
    let keeper = c
        .find(Locator::Css(&format!(
            "#group-{first} .keeper input[name=id]"
        )))
        .await
        .unwrap();
    assert!(
        !keeper.is_selected().await.unwrap(),
        "the keeper is not checked"
    );
    let keep = keeper.attr("value").await.unwrap().unwrap();
    browser.screenshot("duplicates").await;
    c.form(Locator::Css(&format!("#group-{first}")))
        .await
        .unwrap()
        .submit()
        .await
        .unwrap();
    assert_eq!(browser.text("#note").await, "1 photos deleted");
    let gone = if keep == first.to_string() {
        copy
    } else {
        first
    };
    assert_eq!(inst.get(&format!("/v1/photos/{gone}/meta")).await.0, 404);
    assert_eq!(inst.get(&format!("/v1/photos/{keep}/meta")).await.0, 200);
    assert!(
        c.find(Locator::Css(&format!("#group-{first}")))
            .await
            .is_err(),
        "the group is gone"
    );
    c.goto(&format!("{}/ui/storage", inst.url)).await.unwrap();
    let storage = browser.text("main").await;
    assert!(storage.contains("Ingest and label rates"), "{storage}");
    browser.screenshot("storage").await;
    browser.close().await;
}
