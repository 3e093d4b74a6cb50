//! A real browser for the console's tests: Debian's `chromium` driven through `chromedriver`
//! (WebDriver) with fantoccini, headless, on a fresh profile. [`Browser::errors`] reads the
//! browser's console (a page that logs an error fails its test), [`Browser::screenshot`] saves
//! a page to `docs/console/NAME.png` for the README (with `NDPIPE_SCREENSHOTS=1`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::{TimeoutConfiguration, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use super::free_port;

/// The flags chromium runs with: headless, and nothing that reaches the network on its own.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
];

/// How long a wait for the page (an element, a text) lasts before the test fails.
const WAIT: Duration = Duration::from_secs(60);

/// A headless chromium and the chromedriver that drives it; both end when it is dropped.
pub(crate) struct Browser {
    pub(crate) client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a browser session on a fresh profile; `None`
    /// (with the reason printed) where chromium or chromedriver is not installed (`make setup`
    /// installs them).
    pub(crate) async fn start() -> Option<Browser> {
        let (Some(chromium), Some(driver)) = (installed("chromium"), installed("chromedriver"))
        else {
            eprintln!("skipped: chromium and chromedriver are not installed (run make setup)");
            return None;
        };
        let port = free_port();
        let mut driver = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let profile = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": chromium, "args": args}),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let client = connect(port, caps, &mut driver).await;
        // A loaded machine can hold a page's load (and so a script run on it) past
        // chromedriver's 30 s default; the tests' own waits bound them instead.
        let slow = Some(2 * WAIT);
        (client.update_timeouts(TimeoutConfiguration::new(slow, slow, None)))
            .await
            .expect("setting the browser's timeouts");
        Some(Browser {
            client,
            driver,
            _profile: profile,
        })
    }

    /// Opens `url` and waits until its document has loaded.
    pub(crate) async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The element `css` once it is there.
    pub(crate) async fn find(&self, css: &str) -> fantoccini::elements::Element {
        (self.client.wait())
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
    }

    /// Types `text` into the field `css`.
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Clicks `css` (a button or a link).
    pub(crate) async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    /// The visible text of the page's body (read by a script: an element found before a
    /// navigation would be stale after it).
    pub(crate) async fn text(&self) -> String {
        let script = "return document.body ? document.body.innerText : '';";
        let text = self.run(script).await;
        text.as_str().unwrap_or_default().to_string()
    }

    /// Waits until the page's text contains `wanted` (htmx may bring it in later).
    pub(crate) async fn wait_for_text(&self, wanted: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text().await;
            if text.contains(wanted) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no {wanted:?} in the page:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The path of the page shown now.
    pub(crate) async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// Waits until the browser shows a page whose path starts with `prefix` (a redirect or a
    /// form's submission may navigate after the call that caused it returns); the path.
    pub(crate) async fn wait_for_path(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let path = self.path().await;
            if path.starts_with(prefix) {
                return path;
            }
            assert!(
                Instant::now() < deadline,
                "never reached {prefix}: on {path}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `script` (its `return` value back as JSON).
    pub(crate) async fn run(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// The browser console's errors (level SEVERE) since the last call.
    pub(crate) async fn errors(&self) -> Vec<String> {
        let logged = self.client.issue_cmd(BrowserLog).await.unwrap();
        logged
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Fails the test when the browser console has errors, naming the page `what`.
    pub(crate) async fn assert_no_errors(&self, what: &str) {
        let errors = self.errors().await;
        assert!(
            errors.is_empty(),
            "browser console errors on {what}: {errors:#?}"
        );
    }

    /// Saves the page as `docs/console/NAME.png` when `NDPIPE_SCREENSHOTS=1` (so that a test
    /// run leaves the committed pictures alone unless asked to renew them).
    pub(crate) async fn screenshot(&self, name: &str) {
        if std::env::var_os("NDPIPE_SCREENSHOTS").is_none_or(|v| v != "1") {
            return;
        }
        let png = self.client.screenshot().await.unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The program `name` on the `PATH`.
fn installed(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A WebDriver session with chromedriver on `port` (it takes a moment to listen).
async fn connect(port: u16, caps: serde_json::Map<String, Value>, driver: &mut Child) -> Client {
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + WAIT;
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return client,
            Err(e) => {
                let exited = driver.try_wait().unwrap();
                assert!(
                    exited.is_none() && Instant::now() < deadline,
                    "no browser session ({exited:?}): {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// chromedriver's log of the browser console (`POST /session/{id}/se/log`, type `browser`).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}
