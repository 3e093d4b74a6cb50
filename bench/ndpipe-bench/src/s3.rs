//! `ndpipe-bench s3`: upload and download throughput of the same large JPEGs through the S3 API
//! (`aws s3 cp`, s5cmd, boto3) and through `/v1` (the Rust client of `ndpipe import`, and a
//! Python client with boto3's thread pool), in one run against one store in this process.
//! Every upload is an ingest (decode, tensor, durable write); the ratio of each client to
//! `/v1` in the same direction is the figure (target: S3 ingest within 10% of `/v1`). `aws`
//! and `s5cmd` are timed as processes, as people run them; the Python clients time
//! themselves, the interpreter's start left out.
//!
//! Where the time goes: each run's CPU seconds are split between this process (the store)
//! and the client's process, per megabyte; and each client uploads the same files to a null
//! server (`s3_null`) in the same run, which gives its own ceiling on this machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Args;
use futures::StreamExt;
use ndpipe::client::{Client, UploadError};
use ndpipe_store::PipeStore;

use crate::cluster::{any_port, client, store_config};
use crate::s3_null::{Cpu, NullServer};

/// Flags of `ndpipe-bench s3`.
#[derive(Debug, Args)]
pub(crate) struct S3Bench {
    /// Folder of large JPEG wallpapers (Debian package ukui-wallpapers, fetched by the setup step).
    #[arg(long, default_value = ".cache/wallpapers")]
    wallpapers: PathBuf,
    /// The photos are repeated until there are at least this many files.
    #[arg(long, default_value_t = 48)]
    min_files: usize,
    /// Requests in flight at once, for every client.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds of every client; the best of each is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One client and direction.
#[derive(Debug, serde::Serialize)]
struct Row {
    client: &'static str,
    direction: &'static str,
    files: usize,
    megabytes: f64,
    seconds: f64,
    mb_per_s: f64,
    ratio_to_v1: f64,
    /// CPU milliseconds per MB of this process (the store; with the in-process Rust client
    /// for `/v1`) in the best round.
    server_cpu_ms_per_mb: f64,
    /// CPU milliseconds per MB of the client's process in the best round (0 in-process).
    client_cpu_ms_per_mb: f64,
    /// Uploads only: MB/s of the same client against the null server (its own ceiling).
    alone_mb_per_s: Option<f64>,
}

/// One timed run of a client in one direction, with the CPU it took on each side.
#[derive(Debug, Clone, Copy)]
struct Sample {
    client: &'static str,
    direction: &'static str,
    seconds: f64,
    cpu: Cpu,
}

/// Runs `ndpipe-bench s3`.
pub(crate) async fn run(args: S3Bench) -> Result<()> {
    let photos = crate::ingest::read_photos(&args.wallpapers)?;
    ensure!(
        !photos.is_empty(),
        "no wallpapers: run the setup step first (make setup)"
    );
    let photos = crate::ingest::repeat_to(&photos, args.min_files);
    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let up = work.path().join("up");
    std::fs::create_dir_all(&up)?;
    for (i, bytes) in photos.iter().enumerate() {
        std::fs::write(up.join(format!("p{i:04}.jpg")), bytes)?;
    }
    let megabytes = photos.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    let config = ndpipe_store::Config {
        s3_listen: Some(any_port()),
        ..store_config(work.path().join("data"), None)
    };
    let running = PipeStore::open(config).await?.start(None, None).await?;
    let endpoint = format!("http://{}", running.s3_addr().context("no S3 listener")?);
    let http = client(running.http_addr())?;
    println!(
        "bench s3: {} JPEGs, {megabytes:.1} MB, {} requests in flight, no model",
        photos.len(),
        args.concurrency
    );
    aws(&endpoint, &["s3", "mb", "s3://bench"])?;
    let ctx = Round {
        http: &http,
        v1: format!("http://{}", running.http_addr()),
        endpoint: &endpoint,
        photos: &photos,
        up: &up,
        work: work.path(),
        n: args.concurrency,
        uploads_only: false,
    };
    let null = NullServer::start().await?;
    let null_http = client(null.addr)?;
    let alone = Round {
        http: &null_http,
        v1: format!("http://{}", null.addr),
        endpoint: &format!("http://{}", null.addr),
        uploads_only: true,
        ..ctx.clone()
    };
    // Alternate the clients round by round and keep the best of each, so that a burst of load
    // from elsewhere on the machine does not decide a ratio.
    let (mut best, mut best_alone) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        eprintln!("  round {round} of {}...", args.rounds);
        keep_best(&mut best, ctx.run(round).await?);
        keep_best(&mut best_alone, alone.run(round).await?);
    }
    running.stop().await?;
    let rows = rows(&best, &best_alone, photos.len(), megabytes);
    print_table(&rows);
    println!(
        "MD5 of the same bytes on one core (the S3 ETag, which /v1 does not compute), best of 3: {:.1} ms/MB",
        md5_ms_per_mb(&photos, megabytes)
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// CPU milliseconds per MB of hashing `photos` with MD5, best of three.
fn md5_ms_per_mb(photos: &[Vec<u8>], megabytes: f64) -> f64 {
    use md5::Digest;
    (0..3)
        .map(|_| {
            let started = Instant::now();
            for p in photos {
                std::hint::black_box(md5::Md5::digest(p));
            }
            started.elapsed().as_secs_f64() * 1e3 / megabytes
        })
        .fold(f64::INFINITY, f64::min)
}

/// Keeps in `best` the fastest sample of each client and direction.
fn keep_best(best: &mut Vec<Sample>, samples: Vec<Sample>) {
    for s in samples {
        match best
            .iter_mut()
            .find(|b| b.client == s.client && b.direction == s.direction)
        {
            Some(b) if b.seconds > s.seconds => *b = s,
            Some(_) => {}
            None => best.push(s),
        }
    }
}

/// What every round works with.
#[derive(Clone)]
struct Round<'a> {
    http: &'a Client,
    v1: String,
    endpoint: &'a str,
    photos: &'a [Vec<u8>],
    up: &'a Path,
    work: &'a Path,
    n: usize,
    /// Only uploads (against the null server, which keeps nothing to download).
    uploads_only: bool,
}

impl Round<'_> {
    /// Every client up (and, unless `uploads_only`, down) once, each under its own prefix and
    /// folder for `round`; checks that every download is whole.
    async fn run(&self, round: usize) -> Result<Vec<Sample>> {
        let (n, endpoint) = (self.n, self.endpoint);
        let mut samples = Vec::new();
        let (cpu, started) = (Cpu::now()?, Instant::now());
        let ids = v1_upload(self.http, self.photos, n).await?;
        samples.push(sample("/v1", "upload", started, cpu)?);
        if !self.uploads_only {
            let (cpu, started) = (Cpu::now()?, Instant::now());
            v1_download(self.http, &ids, n).await?;
            samples.push(sample("/v1", "download", started, cpu)?);
        }
        let dir = |name: &str| self.work.join(format!("{name}-{round}"));
        let prefix = |name: &str| format!("s3://bench/{name}-{round}/");
        let ids_file = self.work.join(format!("python-ids-{round}"));
        let up = self.up.display().to_string();
        let tools = [
            ("aws s3 cp", "upload", Tool::Aws(up.clone(), prefix("aws"))),
            (
                "aws s3 cp",
                "download",
                Tool::Aws(prefix("aws"), dir("aws").display().to_string()),
            ),
            (
                "s5cmd",
                "upload",
                Tool::S5cmd(format!("{up}/*"), prefix("s5cmd")),
            ),
            (
                "s5cmd",
                "download",
                Tool::S5cmd(
                    format!("{}*", prefix("s5cmd")),
                    dir("s5cmd").display().to_string(),
                ),
            ),
            (
                "boto3",
                "upload",
                Tool::Boto3("put", self.up.to_path_buf(), format!("boto3-{round}/")),
            ),
            (
                "boto3",
                "download",
                Tool::Boto3("get", dir("boto3"), format!("boto3-{round}/")),
            ),
            (
                "python /v1",
                "upload",
                Tool::PythonV1("put", self.up.to_path_buf(), ids_file.clone()),
            ),
            (
                "python /v1",
                "download",
                Tool::PythonV1("get", self.up.to_path_buf(), ids_file),
            ),
        ];
        for (client, direction, tool) in tools {
            if self.uploads_only && direction == "download" {
                continue;
            }
            let (cpu, started) = (Cpu::now()?, Instant::now());
            let reported = tool.run(endpoint, &self.v1, n)?;
            let mut s = sample(client, direction, started, cpu)?;
            s.seconds = reported.unwrap_or(s.seconds);
            samples.push(s);
        }
        if !self.uploads_only {
            for name in ["aws", "s5cmd", "boto3"] {
                let got = std::fs::read_dir(dir(name))?.count();
                ensure!(
                    got == self.photos.len(),
                    "{name} downloaded {got} of {} files",
                    self.photos.len()
                );
            }
        }
        Ok(samples)
    }
}

/// The sample of a run that began at `started` with the CPU totals `cpu`.
fn sample(
    client: &'static str,
    direction: &'static str,
    started: Instant,
    cpu: Cpu,
) -> Result<Sample> {
    Ok(Sample {
        client,
        direction,
        seconds: started.elapsed().as_secs_f64(),
        cpu: cpu.since()?,
    })
}

async fn v1_upload(http: &Client, photos: &[Vec<u8>], n: usize) -> Result<Vec<u64>> {
    let mut results = futures::stream::iter(photos.iter().cloned())
        .map(|bytes| {
            let http = http.clone();
            async move { http.upload(bytes, None).await }
        })
        .buffer_unordered(n.max(1));
    let mut ids = Vec::with_capacity(photos.len());
    while let Some(result) = results.next().await {
        match result {
            Ok(id) => ids.push(id),
            Err(UploadError::Rejected(b)) => anyhow::bail!("upload rejected: {}", b.message),
            Err(UploadError::Failed(e)) => return Err(e),
        }
    }
    Ok(ids)
}

async fn v1_download(http: &Client, ids: &[u64], n: usize) -> Result<()> {
    let mut results = futures::stream::iter(ids.iter().copied())
        .map(|id| {
            let http = http.clone();
            async move { http.get_bytes(&format!("/v1/photos/{id}")).await }
        })
        .buffer_unordered(n.max(1));
    while let Some(result) = results.next().await {
        result?;
    }
    Ok(())
}

/// An S3 client run: source and destination.
enum Tool {
    Aws(String, String),
    S5cmd(String, String),
    /// `put` or `get`, the local folder, the key prefix.
    Boto3(&'static str, PathBuf, String),
    /// `put` (the folder's files, their ids written to the file) or `get` (those ids).
    PythonV1(&'static str, PathBuf, PathBuf),
}

/// boto3 with a thread pool: `put` every file of a folder, or `get` every object into one;
/// prints its own seconds (the interpreter's start and the imports left out).
const BOTO3: &str = r#"
import os, sys, time, boto3, botocore
from concurrent.futures import ThreadPoolExecutor
from botocore.config import Config
endpoint, op, folder, workers, prefix = sys.argv[1:4] + [int(sys.argv[4]), sys.argv[5]]
s3 = boto3.client('s3', endpoint_url=endpoint, region_name='us-east-1',
                  config=Config(signature_version=botocore.UNSIGNED, max_pool_connections=workers))
def put(name):
    with open(os.path.join(folder, name), 'rb') as f:
        s3.put_object(Bucket='bench', Key=prefix + name, Body=f.read())
def get(key):
    body = s3.get_object(Bucket='bench', Key=key)['Body'].read()
    with open(os.path.join(folder, key.split('/')[-1]), 'wb') as f:
        f.write(body)
started = time.monotonic()
with ThreadPoolExecutor(workers) as pool:
    if op == 'put':
        list(pool.map(put, sorted(os.listdir(folder))))
    else:
        os.makedirs(folder, exist_ok=True)
        pages = s3.get_paginator('list_objects_v2').paginate(Bucket='bench', Prefix=prefix)
        list(pool.map(get, [o['Key'] for p in pages for o in p.get('Contents', [])]))
print(time.monotonic() - started)
"#;

/// The same thread pool over `/v1` with Python's own HTTP client, to set boto3 against a
/// Python client of the same shape: `put` uploads every file and writes their ids to a file,
/// `get` downloads those ids; prints its own seconds.
const PYTHON_V1: &str = r#"
import http.client, json, os, sys, threading, time, urllib.parse
from concurrent.futures import ThreadPoolExecutor
url = urllib.parse.urlparse(sys.argv[1])
op, folder, ids_file, workers = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
local = threading.local()
def conn():
    if not hasattr(local, 'c'):
        local.c = http.client.HTTPConnection(url.hostname, url.port)
    return local.c
def put(name):
    with open(os.path.join(folder, name), 'rb') as f:
        conn().request('POST', '/v1/photos', body=f.read())
    r = conn().getresponse()
    assert r.status == 201, r.status
    return json.loads(r.read())['id']
def get(id):
    conn().request('GET', '/v1/photos/%d' % id)
    r = conn().getresponse()
    assert r.status == 200, r.status
    return len(r.read())
with ThreadPoolExecutor(workers) as pool:
    if op == 'put':
        started = time.monotonic()
        ids = list(pool.map(put, sorted(os.listdir(folder))))
        took = time.monotonic() - started
        with open(ids_file, 'w') as f:
            json.dump(ids, f)
    else:
        with open(ids_file) as f:
            ids = json.load(f)
        started = time.monotonic()
        list(pool.map(get, ids))
        took = time.monotonic() - started
print(took)
"#;

impl Tool {
    /// Runs the client against S3 at `endpoint` or `/v1` at `v1`; the seconds it measured
    /// itself, if it does (the Python clients).
    fn run(&self, endpoint: &str, v1: &str, n: usize) -> Result<Option<f64>> {
        match self {
            Tool::Aws(from, to) => {
                aws(endpoint, &["s3", "cp", "--recursive", "--quiet", from, to])?;
                Ok(None)
            }
            Tool::S5cmd(from, to) => {
                run_quiet(
                    clean(Command::new("s5cmd"))
                        .args(["--no-sign-request", "--endpoint-url", endpoint])
                        .args(["--numworkers", &n.to_string(), "cp", from, to]),
                )?;
                Ok(None)
            }
            Tool::Boto3(op, folder, prefix) => {
                let out = run_quiet(
                    clean(Command::new("python3"))
                        .args(["-c", BOTO3, endpoint, op])
                        .arg(folder)
                        .arg(n.to_string())
                        .arg(prefix),
                )?;
                Ok(Some(out.trim().parse().context("boto3 printed no time")?))
            }
            Tool::PythonV1(op, folder, ids) => {
                let out = run_quiet(
                    clean(Command::new("python3"))
                        .args(["-c", PYTHON_V1, v1, op])
                        .arg(folder)
                        .arg(ids)
                        .arg(n.to_string()),
                )?;
                Ok(Some(
                    out.trim()
                        .parse()
                        .context("the Python /v1 client printed no time")?,
                ))
            }
        }
    }
}

fn aws(endpoint: &str, args: &[&str]) -> Result<()> {
    run_quiet(
        clean(Command::new("aws"))
            .args(["--endpoint-url", endpoint, "--no-sign-request"])
            .args(args),
    )
    .map(drop)
}

/// `cmd` without the user's AWS configuration or credentials.
fn clean(mut cmd: Command) -> Command {
    cmd.env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    cmd
}

/// Runs `cmd`; its standard output.
fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (tools/setup.sh installs the S3 clients)"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rows(best: &[Sample], alone: &[Sample], files: usize, mb: f64) -> Vec<Row> {
    let v1 = |direction: &str| {
        (best.iter())
            .find(|s| s.client == "/v1" && s.direction == direction)
            .map_or(f64::NAN, |s| mb / s.seconds)
    };
    best.iter()
        .map(|s| Row {
            client: s.client,
            direction: s.direction,
            files,
            megabytes: mb,
            seconds: s.seconds,
            mb_per_s: mb / s.seconds,
            ratio_to_v1: mb / s.seconds / v1(s.direction),
            server_cpu_ms_per_mb: s.cpu.own * 1e3 / mb,
            client_cpu_ms_per_mb: s.cpu.children * 1e3 / mb,
            alone_mb_per_s: (alone.iter())
                .find(|a| a.client == s.client && a.direction == s.direction)
                .map(|a| mb / a.seconds),
        })
        .collect()
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| {:<10} | {:<8} | {:>5} | {:>7} | {:>7} | {:>7} | {:>7} | {:>11} | {:>12} | {:>10} |",
        "client",
        "way",
        "files",
        "MB",
        "s",
        "MB/s",
        "vs /v1",
        "store ms/MB",
        "client ms/MB",
        "alone MB/s"
    );
    println!(
        "|{:-<12}|{:-<10}|{:->7}|{:->9}|{:->9}|{:->9}|{:->9}|{:->13}|{:->14}|{:->12}|",
        "", "", "", "", "", "", "", "", "", ""
    );
    for r in rows {
        let alone = r.alone_mb_per_s.map_or("-".into(), |a| format!("{a:.1}"));
        println!(
            "| {:<10} | {:<8} | {:>5} | {:>7.1} | {:>7.2} | {:>7.1} | {:>6.0}% | {:>11.1} | {:>12.1} | {:>10} |",
            r.client,
            r.direction,
            r.files,
            r.megabytes,
            r.seconds,
            r.mb_per_s,
            r.ratio_to_v1 * 100.0,
            r.server_cpu_ms_per_mb,
            r.client_cpu_ms_per_mb,
            alone
        );
    }
    println!(
        "vs /v1 = throughput / the /v1 throughput in the same direction (same photos, same run); target >= 90% for uploads"
    );
    println!(
        "store ms/MB = CPU of this process per MB (the store; for /v1 also the in-process Rust client); client ms/MB = CPU of the client's process"
    );
    println!(
        "alone MB/s = the same upload against a null server that stores nothing (the client's own ceiling here, same run)"
    );
}
