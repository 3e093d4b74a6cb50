//! A PostgreSQL catalog frozen (SIGSTOP, as a partition that drops packets looks) and then
//! stopped under a running store with access keys: a photo's bytes by id, `/healthz` and
//! `/metrics` are served from the node; every request that needs the catalog answers 503
//! `catalog_unavailable` within its deadline (the time limits are hang guards: the deadline
//! plus a wide margin); an upload stores nothing; after SIGCONT the node recovers without a
//! restart.
//!
//! The test runs a PostgreSQL server of its own (`tools/postgres/run.sh`), since freezing the
//! shared one would stall the other tests.

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Instance, jpeg, sha256};

const TOKEN: &str = "outage-admin-token";
/// The catalog's settings given to the store; its request deadline is their sum plus 1 s.
const CATALOG_TIMEOUT_MS: u64 = 1_000;
const CHECKOUT_MS: u64 = 1_000;
/// A hang guard: the deadline and a wide margin for a loaded machine.
const GUARD: Duration = Duration::from_secs(20);

/// A throw-away PostgreSQL server, stopped and deleted when dropped.
struct Postgres {
    url: String,
    script: Child,
    stdin: Option<ChildStdin>,
    /// The processes last looked up, woken when dropped (a frozen server cannot stop).
    signalled: RefCell<Vec<u32>>,
}

impl Postgres {
    /// Starts one, or `None` (after saying so) with `NDPIPE_SKIP_POSTGRES=1`.
    fn start() -> Option<Self> {
        if std::env::var("NDPIPE_SKIP_POSTGRES").as_deref() == Ok("1") {
            eprintln!("skipped: NDPIPE_SKIP_POSTGRES=1, so no PostgreSQL test runs");
            return None;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/postgres/run.sh");
        let mut child = Command::new(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run tools/postgres/run.sh");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("postgres://"), "no server: {line:?}");
        Some(Postgres {
            url: line.trim().to_string(),
            script: child,
            stdin,
            signalled: RefCell::new(Vec::new()),
        })
    }

    /// The server's processes: the postmaster (the `postgres` process started with `-p PORT`
    /// of the URL) and its children.
    fn pids(&self) -> Vec<u32> {
        let port = self
            .url
            .rsplit_once(':')
            .unwrap()
            .1
            .split('/')
            .next()
            .unwrap();
        let processes: Vec<(u32, Vec<String>, Option<u32>)> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                let args = cmdline
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                // pid (comm) state ppid ...: the command may hold spaces, what follows ')' not.
                let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
                let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
                Some((pid, args, ppid))
            })
            .collect();
        let postmaster = processes
            .iter()
            .find(|(_, args, _)| {
                args.first().is_some_and(|a| a.ends_with("postgres"))
                    && args.windows(2).any(|w| w[0] == "-p" && w[1] == port)
            })
            .map(|(pid, _, _)| *pid)
            .unwrap_or_else(|| panic!("no postgres process with -p {port}"));
        let mut pids = vec![postmaster];
        pids.extend(
            processes
                .iter()
                .filter(|(_, _, ppid)| *ppid == Some(postmaster))
                .map(|(pid, _, _)| *pid),
        );
        *self.signalled.borrow_mut() = pids.clone();
        pids
    }

    /// Sends `signal` to every process of the server.
    fn signal(&self, pids: &[u32], signal: &str) {
        let mut args = vec![format!("-{signal}")];
        args.extend(pids.iter().map(u32::to_string));
        let status = Command::new("kill").args(&args).status().unwrap();
        assert!(status.success(), "kill {args:?}");
        if signal == "KILL" {
            self.signalled.borrow_mut().clear();
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let pids = self.signalled.borrow();
        if !pids.is_empty() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .args(pids.iter().map(u32::to_string))
                .status();
        }
        drop(self.stdin.take());
        let _ = self.script.wait();
    }
}

/// `method path` with `bearer`, answered within [`GUARD`]: (status, body).
async fn call(
    inst: &Instance,
    method: reqwest::Method,
    path: &str,
    bearer: &str,
    body: Option<Vec<u8>>,
) -> (u16, Vec<u8>) {
    let started = Instant::now();
    let mut request = inst
        .client()
        .request(method.clone(), format!("{}{path}", inst.url))
        .bearer_auth(bearer);
    if let Some(body) = body {
        request = request.body(body);
    }
    let resp = tokio::time::timeout(GUARD, request.send())
        .await
        .unwrap_or_else(|_| panic!("{method} {path} hung past {GUARD:?}\n{}", inst.log()))
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = tokio::time::timeout(GUARD.saturating_sub(started.elapsed()), resp.bytes())
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: the body hung"))
        .unwrap();
    (status, bytes.to_vec())
}

/// Checks that `path` answers 503 `catalog_unavailable` (a JSON body) within the guard.
async fn unavailable(inst: &Instance, method: reqwest::Method, path: &str, bearer: &str) {
    let body = (method == reqwest::Method::POST).then(|| jpeg(64, 48, 999));
    let (status, bytes) = call(inst, method.clone(), path, bearer, body).await;
    let v: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{method} {path}: {}", String::from_utf8_lossy(&bytes)));
    assert_eq!(
        (status, v["error"].as_str()),
        (503, Some("catalog_unavailable")),
        "{method} {path}: {v}"
    );
}

/// Checks everything a node serves without its catalog, and that the rest answers 503 in time.
async fn served_without_catalog(inst: &Instance, read_key: &str, photos: &[(u64, String)]) {
    for (id, digest) in photos {
        let (status, bytes) = call(
            inst,
            reqwest::Method::GET,
            &format!("/v1/photos/{id}"),
            read_key,
            None,
        )
        .await;
        assert_eq!(
            status,
            200,
            "photo {id}: {}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(&sha256(&bytes), digest, "photo {id} intact");
    }
    for path in ["/healthz", "/metrics"] {
        let (status, bytes) = call(inst, reqwest::Method::GET, path, read_key, None).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
    }
    let (status, _) = call(inst, reqwest::Method::GET, "/readyz", read_key, None).await;
    assert_eq!(status, 503, "/readyz says the catalog does not answer");
    // More requests at once than the catalog's pool has connections.
    let mut calls = Vec::new();
    for i in 0..12u64 {
        let path = match i % 4 {
            0 => "/v1/photos".to_string(),
            1 => format!("/v1/photos/{}/meta", photos[0].0),
            2 => "/v1/search?label=Trouser".to_string(),
            _ => "/v1/jobs".to_string(),
        };
        calls.push(async move { unavailable(inst, reqwest::Method::GET, &path, read_key).await });
    }
    futures::future::join_all(calls).await;
    unavailable(inst, reqwest::Method::POST, "/v1/photos", TOKEN).await;
}

/// Makes a `read` key with the admin token; its secret.
async fn read_key(inst: &Instance) -> String {
    let made: Value = (inst.client())
        .post(format!("{}/v1/admin/keys", inst.url))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "reader", "role": "read"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    made["secret_key"]
        .as_str()
        .unwrap_or_else(|| panic!("{made}"))
        .to_string()
}

/// Uploads `bytes` with the admin token, which must succeed: (id, SHA-256).
async fn upload(inst: &Instance, bytes: Vec<u8>) -> (u64, String) {
    let digest = sha256(&bytes);
    let (status, body) = call(
        inst,
        reqwest::Method::POST,
        "/v1/photos",
        TOKEN,
        Some(bytes),
    )
    .await;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(status, 201, "{v}\n{}", inst.log());
    (v["id"].as_u64().unwrap(), digest)
}

/// The ids of every photo the node lists.
async fn listed(inst: &Instance, key: &str) -> Vec<u64> {
    let (status, bytes) = call(inst, reqwest::Method::GET, "/v1/photos", key, None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    v["photos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_frozen_then_stopped_catalog_serves_reads_by_id_and_answers_503_in_time() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(outage(&pg));
}

async fn outage(pg: &Postgres) {
    let (timeout, checkout) = (CATALOG_TIMEOUT_MS.to_string(), CHECKOUT_MS.to_string());
    let inst = Instance::start_with(&[
        "--catalog",
        &pg.url,
        "--token",
        TOKEN,
        "--catalog-timeout-ms",
        &timeout,
        "--catalog-checkout-ms",
        &checkout,
        "--key-refresh-ms",
        "500",
    ]);
    let key = read_key(&inst).await;
    let mut photos = Vec::new();
    for seed in 0..3 {
        photos.push(upload(&inst, jpeg(64, 48, seed)).await);
    }

    let pids = pg.pids();
    pg.signal(&pids, "STOP");
    served_without_catalog(&inst, &key, &photos).await;
    pg.signal(&pids, "CONT");

    // Recovery without a restart: the catalog answers again, and nothing was stored by the
    // refused upload.
    let started = Instant::now();
    loop {
        let (status, _) = call(&inst, reqwest::Method::GET, "/readyz", &key, None).await;
        if status == 200 {
            break;
        }
        assert!(
            started.elapsed() < GUARD,
            "not ready after the thaw\n{}",
            inst.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids = listed(&inst, &key).await;
    assert_eq!(
        ids.len(),
        photos.len(),
        "the refused upload stored nothing: {ids:?}"
    );
    photos.push(upload(&inst, jpeg(64, 48, 7)).await);

    // The server gone for good: the same answers.
    let pids = pg.pids();
    pg.signal(&pids, "KILL");
    served_without_catalog(&inst, &key, &photos).await;
}
