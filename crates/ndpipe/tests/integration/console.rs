//! The web console in a real browser (headless chromium through chromedriver): sign-in, the
//! grid's thumbnails, a photo's page, search by class and in words, upload by the file input
//! (a broken file fails alone), the jobs table updating live, CSRF and read-only keys refused,
//! a missing session sent to sign in, a gateway's grid, and a killed node shown down on the
//! cluster page, and the `Secure` cookie asked for by a flag. Every page is checked for browser console errors; with `NDPIPE_SCREENSHOTS=1`
//! the main pages are saved to `docs/console/`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::browser::Browser;
use crate::common::{Instance, jpeg, on_postgres, sample};
use crate::gateway::SecuredCluster;

/// The admin token the store starts with (it makes the keys).
const TOKEN: &str = "console-admin-token";

/// A key of `role` made through `/v1/admin/keys`: (access key id, secret).
async fn key(inst: &Instance, name: &str, role: &str) -> (String, String) {
    let made: Value = (inst.client())
        .post(format!("{}/v1/admin/keys", inst.url))
        .bearer_auth(TOKEN)
        .json(&json!({"name": name, "role": role}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let field = |f: &str| {
        made[f]
            .as_str()
            .unwrap_or_else(|| panic!("{made}"))
            .to_string()
    };
    (field("access_key"), field("secret_key"))
}

/// Uploads `name` (a sample photo) with the admin token; its id.
async fn upload(inst: &Instance, name: &str) -> u64 {
    let answer: Value = (inst.client())
        .post(format!("{}/v1/photos", inst.url))
        .bearer_auth(TOKEN)
        .body(sample(name))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["id"].as_u64().unwrap_or_else(|| panic!("{answer}"))
}

/// The status of `GET path` with the admin token (once keys exist, reads need one).
async fn status_of(inst: &Instance, path: &str) -> u16 {
    let answer = (inst.client())
        .get(format!("{}{path}", inst.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    answer.status().as_u16()
}

/// Signs in on the sign-in page with `(access key, secret)`.
async fn sign_in(browser: &Browser, url: &str, (access, secret): &(String, String)) {
    browser.open(&format!("{url}/ui/signin")).await;
    browser.fill("#access_key", access).await;
    browser.fill("#secret_key", secret).await;
    browser.click("#signin").await;
    browser.find("#grid").await;
}

/// Waits until every `<img>` of the page has loaded with pixels; how many there are.
async fn images_loaded(browser: &Browser) -> u64 {
    let script = "const imgs = [...document.images]; \
        return imgs.every(i => i.complete) ? imgs.filter(i => i.naturalWidth > 0).length \
        + '/' + imgs.length : null;";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(counts) = browser.run(script).await.as_str().map(str::to_string) {
            let (good, all) = counts.split_once('/').unwrap();
            assert_eq!(good, all, "images without pixels");
            return all.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "images still loading");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The HTTP status of a form POST the page's script sends to `path` with `body`.
async fn post_from_page(browser: &Browser, path: &str, body: &str) -> u64 {
    let script = format!(
        "return fetch('{path}', {{method: 'POST', headers: {{'content-type': \
         'application/x-www-form-urlencoded'}}, body: '{body}', redirect: 'manual'}}) \
         .then(r => r.status);"
    );
    let status = browser.client.execute(&script, vec![]).await.unwrap();
    status.as_u64().unwrap_or_else(|| panic!("{status}"))
}

#[tokio::test]
async fn the_console_in_a_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let inst = Instance::start_with_model(&["--token", TOKEN]);
    let cat = upload(&inst, "chelsea.png").await;
    for name in ["coffee.png", "astronaut.png", "rocket.jpg"] {
        upload(&inst, name).await;
    }
    let labels = inst.labels_when_ready(cat).await;
    inst.wait_labelled(4).await;
    let class = labels[0]["labels"][0]["label"]
        .as_str()
        .unwrap()
        .to_string();
    let writer = key(&inst, "writer", "write").await;
    let reader = key(&inst, "reader", "read").await;
    let url = inst.url.clone();

    // No session: every page sends the browser to sign in.
    browser.open(&format!("{url}/ui/photos")).await;
    browser.wait_for_path("/ui/signin").await;
    browser.assert_no_errors("the sign-in page").await;
    browser.screenshot("signin").await;

    // Signed in, the grid shows every photo's thumbnail with pixels.
    sign_in(&browser, &url, &writer).await;
    browser.wait_for_path("/ui/photos").await;
    assert_eq!(images_loaded(&browser).await, 4);
    browser.assert_no_errors("the photos").await;
    browser.screenshot("photos").await;

    // A photo's page: its original, labels and metadata.
    browser.open(&format!("{url}/ui/photos/{cat}")).await;
    let text = browser.wait_for_text("Labels").await;
    assert!(
        text.contains(&class) && text.contains("451 × 300"),
        "{text}"
    );
    images_loaded(&browser).await;
    browser.assert_no_errors("a photo's page").await;
    browser.screenshot("photo").await;

    // Search by class, then in words: both find the cat, with a score.
    browser.open(&format!("{url}/ui/search")).await;
    browser.fill("#by-class input[name=label]", &class).await;
    browser.click("#by-class button").await;
    let text = browser.wait_for_text(&format!("#{cat}")).await;
    assert!(text.contains("score"), "{text}");
    browser.fill("#in-words input[name=q]", "kitty").await;
    browser.click("#in-words button").await;
    browser.wait_for_text(&format!("#{cat}")).await;
    images_loaded(&browser).await;
    browser.assert_no_errors("search").await;
    browser.screenshot("search").await;
    // By an uploaded photo: the cat's own bytes find the cat first.
    let query = tempfile::tempdir().unwrap();
    let cat_file = query.path().join("chelsea.png");
    std::fs::write(&cat_file, sample("chelsea.png")).unwrap();
    let field = browser.find("#by-photo input[type=file]").await;
    field.send_keys(cat_file.to_str().unwrap()).await.unwrap();
    browser.click("#by-photo button").await;
    let first = browser
        .find("#similar a.card small")
        .await
        .text()
        .await
        .unwrap();
    assert!(first.starts_with(&format!("#{cat} ")), "{first}");
    browser.assert_no_errors("search by photo").await;

    // Upload by the file input: the good photo lands, the broken one shows its error.
    let files = tempfile::tempdir().unwrap();
    let good = files.path().join("moon.png");
    let broken = files.path().join("broken.jpg");
    std::fs::write(&good, sample("moon.png")).unwrap();
    std::fs::write(&broken, b"not an image at all").unwrap();
    browser.open(&format!("{url}/ui/upload")).await;
    let both = format!("{}\n{}", good.display(), broken.display());
    browser
        .find("#photos")
        .await
        .send_keys(&both)
        .await
        .unwrap();
    let landed = browser
        .find("#uploads li.done a")
        .await
        .text()
        .await
        .unwrap();
    let failed = browser
        .find("#uploads li.failed")
        .await
        .text()
        .await
        .unwrap();
    assert!(failed.contains("broken.jpg"), "{failed}");
    let id = landed.strip_prefix("photo ").unwrap();
    assert_eq!(
        status_of(&inst, &format!("/v1/photos/{id}/meta")).await,
        200
    );
    browser.assert_no_errors("upload").await;
    browser.screenshot("upload").await;

    // The jobs table updates without a reload: a job started elsewhere shows up, done.
    browser.open(&format!("{url}/ui/jobs")).await;
    browser.wait_for_text("No jobs yet").await;
    browser.run("window.notReloaded = true; return null;").await;
    let started = (inst.client())
        .post(format!("{url}/v1/jobs/relabel"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(started.status().as_u16(), 202);
    browser.wait_for_text("done").await;
    assert_eq!(browser.run("return window.notReloaded;").await, true);
    browser.assert_no_errors("jobs").await;
    browser.screenshot("jobs").await;

    // A change without the session's CSRF token is refused.
    assert_eq!(post_from_page(&browser, "/ui/jobs/relabel", "").await, 403);
    assert_eq!(
        post_from_page(&browser, "/ui/jobs/relabel", "csrf=forged").await,
        403
    );

    // A read-only key sees the delete form but cannot use it, nor forge it with its token.
    browser.click("form[action='/ui/signout'] button").await;
    browser.find("#signin").await;
    sign_in(&browser, &url, &reader).await;
    browser.open(&format!("{url}/ui/photos/{cat}")).await;
    let csrf = (browser.find("#delete input[name=csrf]").await)
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let forged = format!("csrf={csrf}");
    let path = format!("/ui/photos/{cat}/delete");
    assert_eq!(post_from_page(&browser, &path, &forged).await, 403);
    browser.click("#delete button").await;
    browser.wait_for_text("403").await;
    assert_eq!(
        status_of(&inst, &format!("/v1/photos/{cat}/meta")).await,
        200
    );

    // A session that is gone (expired, or its cookie lost) sends the browser to sign in.
    browser.client.delete_all_cookies().await.unwrap();
    browser.open(&format!("{url}/ui/jobs")).await;
    browser.wait_for_path("/ui/signin").await;
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn a_gateway_s_console_and_a_killed_node_shown_down() {
    on_postgres("console_cluster", |url| async move {
        cluster_pages_on(&url).await
    });
}

/// Two PipeStores with two copies of each photo behind a gateway: the gateway's grid shows
/// thumbnails made from the originals (it holds no tensor); the cluster page of a PipeStore
/// lists both nodes live, then, once one is killed, shows it down within its lease (3 s) plus
/// a hang guard, and the gateway's page says so too.
async fn cluster_pages_on(url: &str) {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = SecuredCluster::start(url, &["cn-a", "cn-b"], dir.path(), &[]).await;
    let gateway = cluster.gateway(url, &[]);
    for seed in 0..3 {
        let (status, _) = gateway.upload(jpeg(320, 240, seed), "").await;
        assert_eq!(status, 201);
    }
    browser.open(&format!("{}/ui/photos", gateway.url)).await;
    assert_eq!(images_loaded(&browser).await, 3);
    browser.assert_no_errors("the gateway's photos").await;

    let page = format!("{}/ui/cluster", cluster.nodes[0].url);
    browser.open(&page).await;
    let text = browser.wait_for_text("cn-b").await;
    assert!(
        text.contains("2 copies wanted") && text.contains("At target: 3") && !text.contains("down"),
        "{text}"
    );
    assert!(text.contains(" s ago"), "a heartbeat's age: {text}");
    browser.assert_no_errors("the cluster").await;
    browser.screenshot("cluster").await;
    cluster.nodes[1].kill9();
    for page in [page, format!("{}/ui/cluster", gateway.url)] {
        shown_down(&browser, &page).await;
    }
    browser
        .assert_no_errors("the cluster with a node down")
        .await;
}

/// Reloads `page` until it shows node cn-b down (a hang guard fails the test after 30 s).
async fn shown_down(browser: &Browser, page: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        browser.open(page).await;
        let text = browser.text().await;
        if text.contains("down") {
            assert!(text.contains("cn-b"), "{text}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cn-b not shown down on {page}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `--console-secure-cookie` marks the session cookie `Secure`; without it the cookie is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_secure_when_asked() {
    for (flags, secure) in [(&["--console-secure-cookie"][..], true), (&[][..], false)] {
        let inst = Instance::start_with(flags);
        let answer = (inst.client())
            .get(format!("{}/ui/photos", inst.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "an open console");
        let cookie = answer.headers()["set-cookie"].to_str().unwrap().to_string();
        assert!(cookie.contains("HttpOnly"), "{cookie}");
        assert_eq!(cookie.contains("; Secure"), secure, "{flags:?}: {cookie}");
    }
}
