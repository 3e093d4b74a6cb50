//! `ndpipe-bench s3`: upload and download throughput of the same large JPEGs through the S3 API
//! (`aws s3 cp`, s5cmd, boto3) and through `/v1`, in one run against one store in this process.
//! Every upload is an ingest (decode, tensor, durable write); the ratio of each S3 client to
//! `/v1` in the same direction is the figure (target: S3 ingest within 10% of `/v1`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Args;
use futures::StreamExt;
use ndpipe::client::{Client, UploadError};
use ndpipe_store::PipeStore;

use crate::cluster::{any_port, client, store_config};

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
    let n = args.concurrency;
    let mut times: Vec<(&'static str, &'static str, f64)> = Vec::new();
    let ids = timed(&mut times, "/v1", "upload", || async {
        v1_upload(&http, &photos, n).await
    })
    .await?;
    timed(&mut times, "/v1", "download", || {
        v1_download(&http, &ids, n)
    })
    .await?;
    aws(&endpoint, &["s3", "mb", "s3://bench"])?;
    let dir = |name: &str| work.path().join(name);
    for (client, direction, run) in [
        (
            "aws s3 cp",
            "upload",
            Tool::Aws(up.clone(), "s3://bench/aws/".into()),
        ),
        (
            "aws s3 cp",
            "download",
            Tool::Aws("s3://bench/aws/".into(), dir("aws")),
        ),
        (
            "s5cmd",
            "upload",
            Tool::S5cmd(format!("{}/*", up.display()), "s3://bench/s5cmd/".into()),
        ),
        (
            "s5cmd",
            "download",
            Tool::S5cmd(
                "s3://bench/s5cmd/*".into(),
                dir("s5cmd").display().to_string(),
            ),
        ),
        ("boto3", "upload", Tool::Boto3("put", up.clone())),
        ("boto3", "download", Tool::Boto3("get", dir("boto3"))),
    ] {
        let started = Instant::now();
        run.run(&endpoint, n)?;
        times.push((client, direction, started.elapsed().as_secs_f64()));
    }
    for name in ["aws", "s5cmd", "boto3"] {
        let got = std::fs::read_dir(dir(name))?.count();
        ensure!(
            got == photos.len(),
            "{name} downloaded {got} of {} files",
            photos.len()
        );
    }
    running.stop().await?;
    let rows = rows(&times, photos.len(), megabytes);
    print_table(&rows);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn timed<T, F, Fut>(
    times: &mut Vec<(&'static str, &'static str, f64)>,
    client: &'static str,
    direction: &'static str,
    f: F,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = Instant::now();
    let out = f().await?;
    times.push((client, direction, started.elapsed().as_secs_f64()));
    Ok(out)
}

async fn v1_upload(http: &Client, photos: &[Vec<u8>], n: usize) -> Result<Vec<u64>> {
    let mut results = futures::stream::iter(photos.iter().cloned())
        .map(|bytes| {
            let http = http.clone();
            async move { http.upload(bytes, None, None).await }
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
    Aws(PathBuf, PathBuf),
    S5cmd(String, String),
    Boto3(&'static str, PathBuf),
}

const BOTO3: &str = r#"
import os, sys, boto3, botocore
from concurrent.futures import ThreadPoolExecutor
from botocore.config import Config
endpoint, op, folder, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s3 = boto3.client('s3', endpoint_url=endpoint, region_name='us-east-1',
                  config=Config(signature_version=botocore.UNSIGNED, max_pool_connections=workers))
def put(name):
    with open(os.path.join(folder, name), 'rb') as f:
        s3.put_object(Bucket='bench', Key='boto3/' + name, Body=f.read())
def get(key):
    body = s3.get_object(Bucket='bench', Key=key)['Body'].read()
    with open(os.path.join(folder, key.split('/')[-1]), 'wb') as f:
        f.write(body)
with ThreadPoolExecutor(workers) as pool:
    if op == 'put':
        list(pool.map(put, sorted(os.listdir(folder))))
    else:
        os.makedirs(folder, exist_ok=True)
        pages = s3.get_paginator('list_objects_v2').paginate(Bucket='bench', Prefix='boto3/')
        list(pool.map(get, [o['Key'] for p in pages for o in p.get('Contents', [])]))
"#;

impl Tool {
    fn run(&self, endpoint: &str, n: usize) -> Result<()> {
        match self {
            Tool::Aws(from, to) => {
                let (from, to) = (from.to_string_lossy(), to.to_string_lossy());
                aws(
                    endpoint,
                    &["s3", "cp", "--recursive", "--quiet", &from, &to],
                )
            }
            Tool::S5cmd(from, to) => run_quiet(
                clean(Command::new("s5cmd"))
                    .args(["--no-sign-request", "--endpoint-url", endpoint])
                    .args(["--numworkers", &n.to_string(), "cp", from, to]),
            ),
            Tool::Boto3(op, folder) => run_quiet(
                clean(Command::new("python3"))
                    .args(["-c", BOTO3, endpoint, op])
                    .arg(folder)
                    .arg(n.to_string()),
            ),
        }
    }
}

fn aws(endpoint: &str, args: &[&str]) -> Result<()> {
    run_quiet(
        clean(Command::new("aws"))
            .args(["--endpoint-url", endpoint, "--no-sign-request"])
            .args(args),
    )
}

/// `cmd` without the user's AWS configuration or credentials.
fn clean(mut cmd: Command) -> Command {
    cmd.env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    cmd
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (tools/setup.sh installs the S3 clients)"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn rows(times: &[(&'static str, &'static str, f64)], files: usize, mb: f64) -> Vec<Row> {
    let v1 = |direction: &str| {
        times
            .iter()
            .find(|(c, d, _)| *c == "/v1" && *d == direction)
            .map_or(f64::NAN, |t| mb / t.2)
    };
    times
        .iter()
        .map(|&(client, direction, seconds)| Row {
            client,
            direction,
            files,
            megabytes: mb,
            seconds,
            mb_per_s: mb / seconds,
            ratio_to_v1: mb / seconds / v1(direction),
        })
        .collect()
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| {:<10} | {:<8} | {:>5} | {:>7} | {:>7} | {:>7} | {:>8} |",
        "client", "way", "files", "MB", "s", "MB/s", "vs /v1"
    );
    println!(
        "|{:-<12}|{:-<10}|{:->7}|{:->9}|{:->9}|{:->9}|{:->10}|",
        "", "", "", "", "", "", ""
    );
    for r in rows {
        println!(
            "| {:<10} | {:<8} | {:>5} | {:>7.1} | {:>7.2} | {:>7.1} | {:>7.0}% |",
            r.client,
            r.direction,
            r.files,
            r.megabytes,
            r.seconds,
            r.mb_per_s,
            r.ratio_to_v1 * 100.0
        );
    }
    println!(
        "vs /v1 = throughput / the /v1 throughput in the same direction (same photos, same run); target >= 90% for uploads"
    );
}
