//! Starts and stops real `ndpipe serve` processes, and finds test photos; [`browser`] drives
//! a real browser.

pub(crate) mod browser;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test (`NDPIPE_TEST_EXE` overrides it).
pub(crate) fn exe() -> PathBuf {
    std::env::var_os("NDPIPE_TEST_EXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ndpipe")))
}

/// The real sample photos fetched by the setup step.
pub(crate) fn samples_dir() -> PathBuf {
    let dir = std::env::var_os("NDPIPE_SAMPLES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/model/samples")
        });
    assert!(
        dir.join("chelsea.png").exists(),
        "sample photos missing in {}: run `make setup` (tools/setup.sh) first",
        dir.display()
    );
    dir
}

/// The model made by the setup step.
pub(crate) fn model_dir() -> PathBuf {
    let dir = std::env::var_os("NDPIPE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/model"));
    assert!(
        dir.join("model.json").exists(),
        "model missing in {}: run `make setup` (tools/setup.sh) first",
        dir.display()
    );
    dir
}

/// A real photo by file name, e.g. "chelsea.png".
pub(crate) fn sample(name: &str) -> Vec<u8> {
    std::fs::read(samples_dir().join(name)).expect("reading a sample photo")
}

/// Every real sample photo.
pub(crate) fn all_samples() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(samples_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("png" | "jpg")))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A JPEG of a given size with a pattern that depends on `seed`.
pub(crate) fn jpeg(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x + seed) as u8,
            (y * 3 + seed) as u8,
            ((x ^ y) + seed * 7 + (seed >> 8) * 13) as u8,
        ])
    });
    let mut out = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut out),
        image::ImageFormat::Jpeg,
    )
    .unwrap();
    out
}

/// Hex SHA-256.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A running `ndpipe serve` with its own data directory.
pub(crate) struct Instance {
    pub data: PathBuf,
    pub url: String,
    command: &'static str,
    port: u16,
    extra: Vec<String>,
    /// Whether the tests' shared cluster secret is left out (`ndpipe serve` then makes its own).
    own_secret: bool,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Instance {
    /// Starts a store on a fresh data directory.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a store without a model (storage only), with extra `serve` flags.
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let mut flags = vec!["--no-model"];
        flags.extend_from_slice(extra);
        Self::launch(&flags)
    }

    /// Starts a store that labels photos with the real model, with extra `serve` flags.
    pub(crate) fn start_with_model(extra: &[&str]) -> Self {
        let dir = model_dir();
        let mut flags = vec!["--model-dir", dir.to_str().unwrap(), "--intra-threads", "2"];
        flags.extend_from_slice(extra);
        Self::launch(&flags)
    }

    /// Replaces the extra flags used by the next [`Instance::restart`].
    pub(crate) fn set_flags(&mut self, flags: &[&str]) {
        self.extra = flags.iter().map(|s| s.to_string()).collect();
    }

    /// Starts `ndpipe pipestore` with the real model, registering as `name` with the Tuner at
    /// `tuner` (its gRPC URL).
    pub(crate) fn start_pipestore(tuner: &str, name: &str, extra: &[&str]) -> Self {
        let dir = model_dir();
        let mut flags = vec![
            "--model-dir",
            dir.to_str().unwrap(),
            "--intra-threads",
            "1",
            "--tuner",
            tuner,
            "--name",
            name,
        ];
        flags.extend_from_slice(extra);
        Self::launch_as("pipestore", &flags)
    }

    /// Starts `ndpipe gateway` with `extra` (besides `--listen`; a gateway has no data
    /// directory).
    pub(crate) fn start_gateway(extra: &[&str]) -> Self {
        Self::launch_as("gateway", extra)
    }

    /// Starts `ndpipe serve` with exactly `extra` (besides `--data` and `--listen`).
    pub(crate) fn launch(extra: &[&str]) -> Self {
        Self::launch_as("serve", extra)
    }

    /// Starts `ndpipe serve` with exactly `extra` and without the tests' shared cluster secret,
    /// so that it makes its own.
    pub(crate) fn launch_with_own_secret(extra: &[&str]) -> Self {
        Self::launch_in_with("serve", None, extra, true)
    }

    /// Starts `ndpipe serve` on the data directory `data` (e.g. on a file system the test
    /// made) with exactly `extra`.
    pub(crate) fn launch_at(data: PathBuf, extra: &[&str]) -> Self {
        Self::launch_in("serve", Some(data), extra)
    }

    fn launch_as(command: &'static str, extra: &[&str]) -> Self {
        Self::launch_in(command, None, extra)
    }

    fn launch_in(command: &'static str, data: Option<PathBuf>, extra: &[&str]) -> Self {
        Self::launch_in_with(command, data, extra, false)
    }

    fn launch_in_with(
        command: &'static str,
        data: Option<PathBuf>,
        extra: &[&str],
        own_secret: bool,
    ) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut inst = Instance {
            data: data.unwrap_or_else(|| tmp.path().join("data")),
            url: String::new(),
            command,
            own_secret,
            port: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            _tmp: tmp,
        };
        // A free port can be taken by a test running beside this one before the server binds
        // it: then the server exits, and another port is tried.
        for attempt in 0.. {
            inst.port = free_port();
            inst.url = format!("http://127.0.0.1:{}", inst.port);
            match inst.try_spawn() {
                Ok(()) => break,
                Err(why) if why.contains("Address already in use") && attempt < 4 => {}
                Err(why) => panic!("{why}"),
            }
        }
        inst
    }

    fn spawn(&mut self) {
        if let Err(why) = self.try_spawn() {
            panic!("{why}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let bound_before = times_bound(&self.log(), "listening", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self._tmp.path().join("serve.log"))
            .unwrap();
        let mut command = Command::new(exe());
        command.arg(self.command);
        if !self.own_secret {
            command.env("NDPIPE_CLUSTER_SECRET_FILE", cluster_secret());
        }
        if self.command != "gateway" {
            command.arg("--data").arg(&self.data);
        }
        let child = command
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(&self.extra)
            // `ndpipe serve` answers S3 on 127.0.0.1:9000 by default; tests in parallel take
            // any free port unless they ask for one (a flag beats the variable).
            .env("NDPIPE_S3_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ndpipe serve");
        self.child = Some(child);
        self.wait_healthy(bound_before)
    }

    /// Waits until this process has logged that it bound the port (more than `bound_before`
    /// times: the log is kept across restarts) and answers `/healthz`. The log line matters:
    /// another test's server that took the same free port would answer the health check too.
    fn wait_healthy(&mut self, bound_before: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let bound = times_bound(&self.log(), "listening", self.port) > bound_before;
            if bound && let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
                let mut resp = String::new();
                let _ = s.read_to_string(&mut resp);
                if resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "ndpipe serve exited with {status}; log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "ndpipe serve did not become healthy; log:\n{}",
            self.log()
        ))
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self._tmp.path().join("serve.log")).unwrap_or_default()
    }

    /// Waits (at most 60 s) until photo `id` has labels; its `/labels` JSON.
    pub(crate) async fn labels_when_ready(&self, id: u64) -> serde_json::Value {
        self.wait_for(&format!("/v1/photos/{id}/labels"), 60, |v| {
            v.as_array().is_some_and(|a| !a.is_empty())
        })
        .await
    }

    /// Polls `path` until `ready` holds for its JSON, or panics after `secs`.
    pub(crate) async fn wait_for(
        &self,
        path: &str,
        secs: u64,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (status, body) = self.get(path).await;
            if status == 200 {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                if ready(&v) {
                    return v;
                }
                if Instant::now() > deadline {
                    panic!("GET {path} not ready after {secs} s: {v}\n{}", self.log());
                }
            } else if Instant::now() > deadline {
                panic!("GET {path}: HTTP {status}\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, no chance to clean up.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Starts the server again on the same data directory and port.
    pub(crate) fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The server's process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` ("STOP", "CONT", ...) to the server with `kill`.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server runs").to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// The store's volume files of one set ("photos" or "tensors"), in order.
    pub(crate) fn volumes(&self, set: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.data.join("store").join(set))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "vol"))
            .collect();
        v.sort();
        v
    }

    /// The files of plain S3 objects this node holds (`DATA/objects/*.blob`), in name order.
    pub(crate) fn plain_object_files(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(self.data.join("objects")) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = dir
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "blob"))
            .collect();
        v.sort();
        v
    }

    /// A blocking-free HTTP client.
    pub(crate) fn client(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// Uploads bytes, returning (status, JSON body).
    pub(crate) async fn upload(&self, bytes: Vec<u8>, query: &str) -> (u16, serde_json::Value) {
        let resp = self
            .client()
            .post(format!("{}/v1/photos{query}", self.url))
            .body(bytes)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// GET returning (status, bytes).
    pub(crate) async fn get(&self, path: &str) -> (u16, Vec<u8>) {
        let resp = self
            .client()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
    }

    /// GET a JSON document.
    pub(crate) async fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path).await;
        assert_eq!(
            status,
            200,
            "GET {path}: {}",
            String::from_utf8_lossy(&body)
        );
        serde_json::from_slice(&body).unwrap()
    }

    /// The version `GET /v1/models` marks active for `task` on this node.
    pub(crate) async fn task_version(&self, task: &str) -> Option<String> {
        let models = self.json("/v1/models").await;
        models
            .as_array()
            .unwrap_or_else(|| panic!("{models}"))
            .iter()
            .find(|m| m["active"] == true && m["task"] == task)
            .map(|m| m["id"].as_str().unwrap().to_string())
    }

    /// Waits until online labelling has labelled `n` photos (so their features are stored); a
    /// hang guard fails the test after 120 s.
    pub(crate) async fn wait_labelled(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, body) = self.get("/metrics").await;
            let text = String::from_utf8_lossy(&body);
            let labelled = text
                .lines()
                .find_map(|l| l.strip_prefix("ndpipe_store_labelled_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            if labelled >= n as f64 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{labelled} of {n} photos labelled\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Live photos according to /healthz and the catalog listing: (store count, catalog count).
    pub(crate) async fn counts(&self) -> (u64, u64) {
        let health = self.json("/healthz").await;
        let page = self.json("/v1/photos?limit=1000").await;
        (
            health["photos"].as_u64().unwrap(),
            page["photos"].as_array().unwrap().len() as u64,
        )
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// How many lines of `log` say `marker` with the address `127.0.0.1:port` (and not a longer
/// port that starts with the same digits).
fn times_bound(log: &str, marker: &str, port: u16) -> usize {
    let addr = format!("127.0.0.1:{port}");
    log.lines()
        .filter(|line| line.contains(marker))
        .filter(|line| {
            line.match_indices(&addr).any(|(at, _)| {
                !line[at + addr.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
        })
        .count()
}

/// Runs `test` on a fresh PostgreSQL database named after `name` (skipped, with the reason
/// printed, where PostgreSQL cannot run). The database is made and dropped outside the async
/// runtime: its client blocks.
pub(crate) fn on_postgres<F: std::future::Future<Output = ()>>(
    name: &str,
    test: impl FnOnce(String) -> F,
) {
    let Some(db) = ndpipe_catalog::test_postgres::database(name) else {
        return;
    };
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(test(db.url.clone()));
}

/// The text of [`cluster_secret`].
pub(crate) const CLUSTER_SECRET: &str = "the-tests-cluster-secret";

/// A gRPC interceptor that sends [`CLUSTER_SECRET`], for tests that call a node themselves.
pub(crate) fn with_secret(
    mut request: tonic::Request<()>,
) -> Result<tonic::Request<()>, tonic::Status> {
    request
        .metadata_mut()
        .insert("x-ndpipe-cluster-secret", CLUSTER_SECRET.parse().unwrap());
    Ok(request)
}

/// A gRPC channel to `url`.
pub(crate) async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The cluster secret every process the tests start shares (given as
/// `NDPIPE_CLUSTER_SECRET_FILE`, so a test's own `--cluster-secret-file` beats it): a cluster's
/// processes refuse to start without one.
pub(crate) fn cluster_secret() -> &'static Path {
    static SECRET: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join("cluster-secret");
        std::fs::write(&path, format!("{CLUSTER_SECRET}\n")).unwrap();
        path
    })
}

/// A port that was free a moment ago (another process may take it before it is bound).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the CLI with `args`; returns (exit success, stdout, stderr).
pub(crate) fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(exe())
        .env("NDPIPE_S3_LISTEN", "127.0.0.1:0")
        .args(args)
        .output()
        .expect("running ndpipe");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running `ndpipe tuner`.
pub(crate) struct TunerProcess {
    /// Its HTTP base URL.
    pub url: String,
    /// Its gRPC URL, for PipeStores.
    pub grpc: String,
    ports: (u16, u16),
    extra: Vec<String>,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl TunerProcess {
    /// Starts a Tuner on free ports with a fresh registry.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a Tuner on free ports with a fresh registry and extra `tuner` flags.
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let mut t = TunerProcess {
            url: String::new(),
            grpc: String::new(),
            ports: (0, 0),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            _tmp: tempfile::tempdir().unwrap(),
        };
        // As for `Instance`: another test may take a free port first; then try others.
        for attempt in 0.. {
            let (http, grpc) = (free_port(), free_port());
            (t.url, t.grpc, t.ports) = (
                format!("http://127.0.0.1:{http}"),
                format!("http://127.0.0.1:{grpc}"),
                (http, grpc),
            );
            match t.try_spawn() {
                Ok(()) => break,
                Err(why) if why.contains("Address already in use") && attempt < 4 => {}
                Err(why) => panic!("{why}"),
            }
        }
        t
    }

    fn spawn(&mut self) {
        if let Err(why) = self.try_spawn() {
            panic!("{why}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let (http, grpc) = self.ports;
        let bound_before = times_bound(&self.log(), "tuner listening", http);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self._tmp.path().join("tuner.log"))
            .unwrap();
        let child = Command::new(exe())
            .args(["tuner", "--data"])
            .arg(self._tmp.path().join("tuner"))
            .args([
                "--listen",
                &format!("127.0.0.1:{http}"),
                "--grpc-listen",
                &format!("127.0.0.1:{grpc}"),
            ])
            .args(&self.extra)
            .env("NDPIPE_CLUSTER_SECRET_FILE", cluster_secret())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ndpipe tuner");
        self.child = Some(child);
        // As for `Instance`: the port is ours once our own log says so.
        let deadline = Instant::now() + Duration::from_secs(30);
        while times_bound(&self.log(), "tuner listening", http) <= bound_before {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("the tuner exited with {status}: {}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("the tuner did not start: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Kills the Tuner (SIGKILL) and starts it again on the same ports and data directory.
    pub(crate) fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        self.spawn();
    }

    /// SIGSTOP: the Tuner stays, silent.
    pub(crate) fn signal_stop(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after [`TunerProcess::signal_stop`].
    pub(crate) fn signal_cont(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("the Tuner runs")
            .id()
            .to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// The Tuner's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self._tmp.path().join("tuner.log")).unwrap_or_default()
    }

    /// Starts a job with `POST path` (e.g. `/v1/tuner/finetune`) and follows it until it ends.
    /// Returns the POST's status and, for a 202, the finished job (else the error body).
    pub(crate) async fn run_job(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let (status, job) = self.post(path, body).await;
        if status != 202 {
            return (status, job);
        }
        let id = job["id"].as_str().expect("a job id").to_string();
        (status, self.wait_job(&id).await)
    }

    /// `POST path` with a JSON body: (status, JSON reply).
    pub(crate) async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }

    /// `GET path` as JSON.
    pub(crate) async fn get(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("{}{path}", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Polls job `id` until it is done or failed (a hang guard fails the test after 10 min).
    pub(crate) async fn wait_job(&self, id: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let job = self.get(&format!("/v1/tuner/jobs/{id}")).await;
            if job["phase"] == "done" || job["phase"] == "failed" {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} hangs: {job}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `n` PipeStores are registered with a live lease; returns the node list.
    pub(crate) async fn wait_for_nodes(&self, n: usize) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let nodes = self.get("/v1/tuner/nodes").await;
            let live = nodes
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["live"] == true);
            if live.count() >= n {
                return nodes;
            }
            assert!(
                Instant::now() < deadline,
                "only {nodes} registered\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TunerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Imports Fashion-MNIST photos `skip..skip+limit` (taken 6:1 from train and test) with the CLI;
/// returns its stdout.
pub(crate) fn import_fashion(inst: &Instance, skip: usize, limit: usize) -> String {
    let fm = std::env::var("NDPIPE_FASHION_MNIST_DIR")
        .unwrap_or_else(|_| "/usr/share/datasets/fashion-mnist".into());
    let (ok, out, err) = cli(&[
        "import",
        "--server",
        &inst.url,
        "--quiet",
        "--fashion-mnist",
        "--fashion-mnist-dir",
        &fm,
        "--skip",
        &skip.to_string(),
        "--limit",
        &limit.to_string(),
    ]);
    assert!(
        ok,
        "Fashion-MNIST import failed (is dataset-fashion-mnist installed?): {out}{err}"
    );
    out
}
