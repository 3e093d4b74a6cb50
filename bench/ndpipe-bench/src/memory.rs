//! `ndpipe-bench memory`: how much memory `ndpipe serve` keeps after hostile uploads. Each
//! round starts a fresh server (its own process, so that its RSS is its own), uploads N valid
//! images and then N mutations of them (see [`crate::hostile_images`]), and reads the
//! server's RSS at the start, after the valid ones and after the mutated ones. The ratio
//! mutated / valid is the figure: memory that corrupt input leaves behind shows as a ratio
//! well over 1. The table gives each round and the mean with the spread (min-max).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use futures::StreamExt;
use ndpipe::client::{Client, UploadError};

use crate::cluster::client;
use crate::hostile_images;
use crate::serve_process::Server;

/// Flags of `ndpipe-bench memory`.
#[derive(Debug, Args)]
pub(crate) struct MemoryBench {
    /// Valid images per round, and as many mutated ones.
    #[arg(long, default_value_t = 20_000)]
    photos: usize,
    /// Rounds, each on a fresh server.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Uploads in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Distinct valid images the uploads cycle through (the mutations are all distinct).
    #[arg(long, default_value_t = 300)]
    pool: usize,
    /// Seconds to wait after each phase before reading the RSS (queues drain).
    #[arg(long, default_value_t = 3)]
    settle_secs: u64,
    /// The model's folder; the server runs without a model unless --with-model.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = "model")]
    model_dir: PathBuf,
    /// Label the photos with the model as they arrive.
    #[arg(long)]
    with_model: bool,
    /// `KEY=VALUE` set in the server's environment (e.g. `MALLOC_ARENA_MAX=2`), to compare
    /// allocator settings; repeatable.
    #[arg(long = "server-env")]
    server_env: Vec<String>,
    /// More `ndpipe serve` flags, e.g. `--server-flag=--max-decode-bytes=...`; repeatable.
    #[arg(long = "server-flag", allow_hyphen_values = true)]
    server_flags: Vec<String>,
}

/// One round's figures, in MB of RSS.
#[derive(Debug, Clone, Copy)]
struct Round {
    start: f64,
    valid: f64,
    mutated: f64,
    peak: f64,
    server_errors: usize,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.mutated / self.valid
    }
}

/// Answers of one phase: accepted, refused (4xx) and server errors (5xx or failures).
#[derive(Debug, Default)]
struct Answers {
    stored: usize,
    refused: usize,
    server_errors: usize,
}

/// Runs `ndpipe-bench memory`.
pub(crate) async fn run(args: MemoryBench) -> Result<()> {
    ensure!(
        args.photos > 0 && args.pool > 0 && args.rounds > 0,
        "--photos, --pool and --rounds must be > 0"
    );
    let env = parse_env(&args.server_env)?;
    let pool = tokio::task::spawn_blocking({
        let n = args.pool;
        move || hostile_images::valid(n, 42)
    })
    .await??;
    println!(
        "bench memory: {} valid then {} mutated JPEG/PNG/WebP uploads per round, {} in flight, \
         {} rounds; server {} model{}",
        args.photos,
        args.photos,
        args.concurrency,
        args.rounds,
        if args.with_model {
            "with a"
        } else {
            "without a"
        },
        if env.is_empty() {
            String::new()
        } else {
            format!(", env {}", args.server_env.join(" "))
        }
    );
    let mut rounds = Vec::new();
    for r in 0..args.rounds {
        let round = one_round(&args, &env, &pool, r as u64).await?;
        print_row(&format!("round {}", r + 1), &round, rounds.is_empty());
        rounds.push(round);
    }
    print_summary(&rounds);
    Ok(())
}

/// `KEY=VALUE` pairs.
fn parse_env(pairs: &[String]) -> Result<Vec<(String, String)>> {
    pairs
        .iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .with_context(|| format!("--server-env {p}: not KEY=VALUE"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// A fresh server: N valid uploads, then N mutated ones; the RSS at each step.
async fn one_round(
    args: &MemoryBench,
    env: &[(String, String)],
    pool: &[Vec<u8>],
    round: u64,
) -> Result<Round> {
    let temp = tempfile::tempdir().context("creating a temporary directory")?;
    let mut flags = args.server_flags.clone();
    if !args.with_model {
        flags.push("--no-model".into());
    }
    let mut server = Server::start_with_env(
        &temp.path().join("data"),
        &args.model_dir,
        temp.path(),
        &flags,
        env,
    )?;
    let client = client(server.addr)?;
    server.wait_healthy(&client).await?;
    let mb = |s: &Server| -> Result<f64> { Ok(s.rss_kb("VmRSS")? as f64 / 1024.0) };
    let start = mb(&server)?;
    let valid = upload_all(&client, args, |i| pool[i % pool.len()].clone()).await?;
    settle(&mut server, args.settle_secs).await?;
    let after_valid = mb(&server)?;
    let seed = 1000 + round;
    let mutated = upload_all(&client, args, |i| hostile_images::mutated(pool, i, seed)).await?;
    settle(&mut server, args.settle_secs).await?;
    let after_mutated = mb(&server)?;
    let peak = server.rss_kb("VmHWM")? as f64 / 1024.0;
    println!(
        "  round {}: valid {} stored, {} refused; mutated {} stored, {} refused, {} server errors",
        round + 1,
        valid.stored,
        valid.refused,
        mutated.stored,
        mutated.refused,
        mutated.server_errors
    );
    if valid.refused + valid.server_errors > 0 {
        bail!(
            "{} valid uploads failed: the figures would not compare like with like",
            valid.refused + valid.server_errors
        );
    }
    server.stop()?;
    Ok(Round {
        start,
        valid: after_valid,
        mutated: after_mutated,
        peak,
        server_errors: mutated.server_errors,
    })
}

/// Waits `secs`, checking that the server is alive.
async fn settle(server: &mut Server, secs: u64) -> Result<()> {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    server.check_alive()
}

/// Uploads `photo(i)` for i in 0..N, `concurrency` at once; what the server answered.
async fn upload_all(
    client: &Client,
    args: &MemoryBench,
    photo: impl Fn(usize) -> Vec<u8>,
) -> Result<Answers> {
    let mut answers = Answers::default();
    let mut results = futures::stream::iter(0..args.photos)
        .map(|i| client.upload(photo(i), None))
        .buffer_unordered(args.concurrency.max(1));
    while let Some(result) = results.next().await {
        match result {
            Ok(_) => answers.stored += 1,
            Err(UploadError::Rejected(_)) => answers.refused += 1,
            Err(UploadError::Failed(_)) => answers.server_errors += 1,
        }
    }
    Ok(answers)
}

fn print_row(name: &str, r: &Round, header: bool) {
    if header {
        println!(
            "{:<10} {:>10} {:>12} {:>14} {:>8} {:>10} {:>9}",
            "", "start MB", "valid MB", "mutated MB", "ratio", "peak MB", "5xx"
        );
    }
    println!(
        "{:<10} {:>10.0} {:>12.0} {:>14.0} {:>8.2} {:>10.0} {:>9}",
        name,
        r.start,
        r.valid,
        r.mutated,
        r.ratio(),
        r.peak,
        r.server_errors
    );
}

/// The mean of each column with its spread (min-max).
fn print_summary(rounds: &[Round]) {
    let stat = |f: &dyn Fn(&Round) -> f64| {
        let values: Vec<f64> = rounds.iter().map(f).collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let (min, max) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        (mean, min, max)
    };
    println!("mean (min-max):");
    for (name, f) in [
        ("start MB", &(|r: &Round| r.start) as &dyn Fn(&Round) -> f64),
        ("valid MB", &|r: &Round| r.valid),
        ("mutated MB", &|r: &Round| r.mutated),
        ("ratio", &|r: &Round| r.ratio()),
        ("peak MB", &|r: &Round| r.peak),
    ] {
        let (mean, min, max) = stat(f);
        println!("  {name:<11} {mean:>8.2} ({min:.2}-{max:.2})");
    }
}
