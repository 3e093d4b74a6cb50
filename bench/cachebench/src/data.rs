//! The dataset on a real PipeStore: starting an `ndpipe serve` process,
//! importing Fashion-MNIST into it with `ndpipe import`, listing the photos
//! with their labels and splits, and decoding photos into pixels.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use spidercache::Label;

use crate::error::{BenchError, Result};

/// Side of the square grey images the model reads.
pub const SIDE: usize = 28;
/// Pixels per image.
pub const PIXELS: usize = SIDE * SIDE;

/// A blocking HTTP client for one PipeStore.
#[derive(Clone)]
pub struct PipeStoreClient {
    base: String,
    agent: ureq::Agent,
}

#[derive(Deserialize)]
struct Page {
    photos: Vec<PhotoMeta>,
    next_after: Option<u64>,
}

#[derive(Deserialize)]
struct PhotoMeta {
    id: u64,
    sha256: String,
    bytes: u64,
    ground_truth: Option<GroundTruth>,
}

#[derive(Deserialize)]
struct GroundTruth {
    label: String,
    split: Option<String>,
}

fn http_err(what: impl Into<String>) -> impl FnOnce(ureq::Error) -> BenchError {
    let what = what.into();
    move |e| BenchError::Http {
        what,
        reason: e.to_string(),
    }
}

impl PipeStoreClient {
    /// A client for the PipeStore at `base` (such as `http://127.0.0.1:8080`).
    pub fn new(base: impl Into<String>) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Self {
            base: base.into(),
            agent,
        }
    }

    /// The store's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether `/healthz` answers.
    pub fn healthy(&self) -> bool {
        self.agent
            .get(format!("{}/healthz", self.base))
            .call()
            .is_ok()
    }

    /// A photo's original bytes.
    pub fn photo(&self, id: u64) -> Result<Vec<u8>> {
        let what = format!("GET /v1/photos/{id}");
        self.agent
            .get(format!("{}/v1/photos/{id}", self.base))
            .call()
            .map_err(http_err(what.clone()))?
            .body_mut()
            .read_to_vec()
            .map_err(http_err(what))
    }

    /// Every photo with a ground truth, in id order, following `next_after`.
    fn list(&self) -> Result<Vec<PhotoMeta>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let mut url = format!("{}/v1/photos?limit=1000", self.base);
            if let Some(a) = after {
                url.push_str(&format!("&after={a}"));
            }
            let body = self
                .agent
                .get(&url)
                .call()
                .map_err(http_err("GET /v1/photos"))?
                .body_mut()
                .read_to_string()
                .map_err(http_err("GET /v1/photos"))?;
            let page: Page = serde_json::from_str(&body)?;
            all.extend(page.photos);
            match page.next_after {
                Some(a) => after = Some(a),
                None => return Ok(all),
            }
        }
    }
}

/// One labelled photo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// The photo's PipeStore id.
    pub photo_id: u64,
    /// Index of its class in [`Dataset::classes`].
    pub label: Label,
    /// Size of the stored photo.
    pub bytes: u64,
}

/// The benchmark's view of the PipeStore: training sample `i` is `train[i]`.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Class names, sorted; a label is an index into this.
    pub classes: Vec<String>,
    /// Training photos (sample ids are indexes into this).
    pub train: Vec<Item>,
    /// Test photos, for validation accuracy.
    pub test: Vec<Item>,
}

impl Dataset {
    /// Lists the store and keeps the first `n_train` training and `n_test`
    /// test photos by content hash, so that the subset and its order do not
    /// depend on the order in which a concurrent import assigned ids.
    pub fn load(client: &PipeStoreClient, n_train: usize, n_test: usize) -> Result<Self> {
        let mut photos = client.list()?;
        photos.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        let mut classes: Vec<String> = photos
            .iter()
            .filter_map(|p| p.ground_truth.as_ref().map(|g| g.label.clone()))
            .collect();
        classes.sort();
        classes.dedup();
        let (mut train, mut test) = (Vec::new(), Vec::new());
        for p in &photos {
            let Some(gt) = &p.ground_truth else { continue };
            let label = classes.binary_search(&gt.label).expect("listed above") as Label;
            let item = Item {
                photo_id: p.id,
                label,
                bytes: p.bytes,
            };
            match gt.split.as_deref() {
                Some("train") if train.len() < n_train => train.push(item),
                Some("test") if test.len() < n_test => test.push(item),
                _ => {}
            }
        }
        if train.len() < n_train || test.len() < n_test {
            return Err(BenchError::Dataset(format!(
                "wanted {n_train} train and {n_test} test photos, the store has {} and {}",
                train.len(),
                test.len()
            )));
        }
        Ok(Self {
            classes,
            train,
            test,
        })
    }

    /// Total bytes of the training photos.
    pub fn train_bytes(&self) -> u64 {
        self.train.iter().map(|i| i.bytes).sum()
    }

    /// Reads and decodes every test photo: row-major pixels and labels.
    pub fn fetch_test(&self, client: &PipeStoreClient) -> Result<(Vec<f32>, Vec<Label>)> {
        let mut pixels = Vec::with_capacity(self.test.len() * PIXELS);
        for item in &self.test {
            decode_into(item.photo_id, &client.photo(item.photo_id)?, &mut pixels)?;
        }
        Ok((pixels, self.test.iter().map(|i| i.label).collect()))
    }
}

/// Decodes a 28x28 photo, appending its normalised grey pixels to `out`.
pub fn decode_into(id: u64, bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
    let img = image::load_from_memory(bytes)
        .map_err(|e| BenchError::Decode {
            id,
            reason: e.to_string(),
        })?
        .into_luma8();
    if img.width() as usize != SIDE || img.height() as usize != SIDE {
        return Err(BenchError::Decode {
            id,
            reason: format!("{}x{}, expected {SIDE}x{SIDE}", img.width(), img.height()),
        });
    }
    // Fashion-MNIST's pixel mean and standard deviation.
    out.extend(
        img.as_raw()
            .iter()
            .map(|&p| (f32::from(p) / 255.0 - 0.286) / 0.353),
    );
    Ok(())
}

/// A running `ndpipe serve` on a loopback port with its data in a temporary
/// folder; killed on drop.
pub struct PipeStore {
    child: Child,
    dir: tempfile::TempDir,
    client: PipeStoreClient,
    bin: PathBuf,
}

impl PipeStore {
    /// Starts `bin serve` and waits until it answers `/healthz`.
    pub fn start(bin: &Path) -> Result<Self> {
        if !bin.is_file() {
            return Err(BenchError::Process(format!(
                "no ndpipe binary at {} (build it with `cargo build -p ndpipe`)",
                bin.display()
            )));
        }
        let dir = tempfile::tempdir()?;
        // A private copy, so a rebuild of the original mid-run changes nothing.
        let private = dir.path().join("ndpipe");
        std::fs::copy(bin, &private)?;
        let bin = private.as_path();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve");
        if supports_no_model(bin)? {
            // The benchmark reads ground truth only; no inference at ingest.
            cmd.arg("--no-model");
        }
        let child = cmd
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            // No S3 listener on the default port: any free one (the benchmark does not use it).
            .env("NDPIPE_S3_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| BenchError::Process(format!("starting {}: {e}", bin.display())))?;
        let mut store = Self {
            child,
            dir,
            client: PipeStoreClient::new(format!("http://127.0.0.1:{port}")),
            bin: bin.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !store.client.healthy() {
            if let Some(status) = store.child.try_wait()? {
                return Err(store.failure(&format!("exited with {status}")));
            }
            if Instant::now() > deadline {
                return Err(store.failure("did not answer /healthz within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(store)
    }

    fn failure(&self, what: &str) -> BenchError {
        let log = std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default();
        BenchError::Process(format!("ndpipe serve {what}; its log:\n{log}"))
    }

    /// Whether the process is still running; its log if not.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(self.failure(&format!("exited with {status}"))),
        }
    }

    /// A client for this store.
    pub fn client(&self) -> PipeStoreClient {
        self.client.clone()
    }

    /// Imports at least `n_train` training and `n_test` test photos of
    /// Fashion-MNIST with `ndpipe import` (which takes train and test 6:1).
    pub fn import_fashion_mnist(&self, n_train: usize, n_test: usize) -> Result<()> {
        let limit = import_limit(n_train, n_test);
        let out = Command::new(&self.bin)
            .args(["import", "--server", self.client.base(), "--fashion-mnist"])
            .arg("--limit")
            .arg(limit.to_string())
            .arg("--quiet")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(BenchError::Process(format!(
                "ndpipe import failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }
}

impl Drop for PipeStore {
    fn drop(&mut self) {
        // Already gone is fine: there is nothing left to stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this `ndpipe serve` has `--no-model` (newer ones require a
/// model without it).
fn supports_no_model(bin: &Path) -> Result<bool> {
    let help = Command::new(bin).args(["serve", "--help"]).output()?;
    Ok(String::from_utf8_lossy(&help.stdout).contains("--no-model"))
}

/// The smallest `--limit` for which `ndpipe import --fashion-mnist` (which
/// takes `ceil(6/7 * limit)` training photos and the rest from test)
/// imports at least `n_train` training and `n_test` test photos.
pub fn import_limit(n_train: usize, n_test: usize) -> usize {
    let mut limit = n_train + n_test;
    loop {
        let train = (limit * 6).div_ceil(7);
        if train >= n_train && limit - train >= n_test {
            return limit;
        }
        limit += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_limit_covers_both_splits() {
        assert_eq!(import_limit(6000, 1000), 7000);
        let l = import_limit(1000, 500);
        assert!((l * 6).div_ceil(7) >= 1000 && l - (l * 6).div_ceil(7) >= 500);
        assert_eq!(import_limit(1000, 500), 3500);
    }
}
