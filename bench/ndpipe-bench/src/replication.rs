//! `ndpipe-bench replication`: a Tuner and three PipeStores in this process on one PostgreSQL
//! catalog, with 1, 2 and 3 copies of every photo. For each: upload throughput through node 0's
//! front door (ratio to one copy, where each photo stays on the node it was uploaded to, in the
//! same run), read throughput of every photo through node 0 (for more than one copy, a photo
//! node 0 does not hold is read from another node), and with two copies, the repair rate after
//! node 2 is stopped and removed (photos and MB per second until none is under-replicated).
//! Then plain objects (64 KiB files that are not photos) put and read through node 0's S3 API,
//! and with more than one copy, photos through a gateway's `/v1` and plain objects through its
//! S3 API (`replication_s3.rs`).
//! Every round starts a fresh cluster on a fresh database; mean and range over the rounds.
//! Then, with real processes (the `ndpipe` binary beside this one; `faultbench`'s
//! `failover.rs`), the time of a fine-tune over three nodes with two copies that loses a node
//! (kill -9 mid-extraction) vs one that does not, on a fresh cluster per round.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use futures::StreamExt;
use ndpipe::client::Client;
use ndpipe_catalog::test_postgres;
use ndpipe_store::PipeStore;
use ndpipe_tuner::Tuner;
use serde_json::Value;

use crate::cluster::{any_port, client, store_config};
use crate::replication_s3 as s3;

/// PipeStores in every cluster.
const NODES: usize = 3;

/// Flags of `ndpipe-bench replication`.
#[derive(Debug, Args)]
pub(crate) struct ReplicationBench {
    /// Photos uploaded per cluster (distinct JPEGs, about 20 KB each).
    #[arg(long, default_value_t = 600)]
    photos: u32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Plain objects (64 KiB each) put and read through S3 per cluster.
    #[arg(long, default_value_t = 300)]
    plain_objects: usize,
    /// Rounds per copy count (a fresh cluster each; 0: only the fine-tune losing a node).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Copy counts to measure (1 is the reference).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<u32>,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Rounds of the fine-tune losing a node vs not (0: none).
    #[arg(long, default_value_t = 3)]
    failover_rounds: usize,
    /// Fashion-MNIST photos of those fine-tunes (two copies each on three nodes).
    #[arg(long, default_value_t = 300)]
    failover_photos: usize,
    /// Each node's extraction rate in those fine-tunes (photos/s), so that the kill lands
    /// inside the extraction.
    #[arg(long, default_value_t = 40.0)]
    failover_throttle: f64,
    /// Milliseconds into the extraction that the node is killed.
    #[arg(long, default_value_t = 1000)]
    failover_kill_ms: u64,
    /// The Fashion-MNIST folder.
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    fashion_mnist_dir: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One round of one copy count.
#[derive(Debug, Clone, serde::Serialize)]
struct Round {
    replicas: u32,
    upload_photos_per_s: f64,
    upload_mb_per_s: f64,
    /// Photos uploaded and labelled per second, until the last one's labels are filed (one
    /// copy acknowledges before labelling, more copies after).
    labelled_photos_per_s: f64,
    read_photos_per_s: f64,
    repair_photos_per_s: Option<f64>,
    repair_mb_per_s: Option<f64>,
    /// Plain objects through node 0's S3 API.
    plain_put_per_s: f64,
    plain_get_per_s: f64,
    /// Photos through a gateway's `/v1` (more than one copy only).
    gateway_upload_photos_per_s: Option<f64>,
    /// Plain objects through a gateway's S3 API (more than one copy only).
    gateway_plain_put_per_s: Option<f64>,
}

/// What every round uploads.
struct Workload {
    photos: Vec<Vec<u8>>,
    megabytes: f64,
    /// Other photos, for the gateway.
    gateway_photos: Vec<Vec<u8>>,
    plain: Vec<Vec<u8>>,
}

/// Runs `ndpipe-bench replication`.
pub(crate) async fn run(args: ReplicationBench) -> Result<()> {
    ensure!(
        args.replicas.contains(&1),
        "--replicas must include 1, the reference"
    );
    let photos: Vec<Vec<u8>> = (0..args.photos).map(jpeg).collect();
    let megabytes = photos.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    println!(
        "bench replication: {NODES} PipeStores on PostgreSQL, {} JPEGs ({megabytes:.1} MB), {} plain objects of {} KiB, {} in flight, {} rounds",
        photos.len(),
        args.plain_objects,
        s3::PLAIN_BYTES >> 10,
        args.concurrency,
        args.rounds
    );
    let work = Workload {
        gateway_photos: (0..args.photos / 2).map(|i| jpeg(1_000_000 + i)).collect(),
        plain: s3::plain_objects(args.plain_objects),
        photos,
        megabytes,
    };
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        for &r in &args.replicas {
            let db = tokio::task::spawn_blocking(move || {
                test_postgres::database(&format!("bench_r{r}_{round}"))
            })
            .await?
            .context("PostgreSQL is needed (NDPIPE_SKIP_POSTGRES is set)")?;
            let result = one_round(&args, &db.url, r, &work).await;
            tokio::task::spawn_blocking(move || drop(db)).await?;
            let result = result.with_context(|| format!("round {round}, {r} copies"))?;
            eprintln!("  round {round}, {r} copies: {result:?}");
            rounds.push(result);
        }
    }
    let mut failover = Vec::new();
    for round in 0..args.failover_rounds {
        let result = failover_round(&args, round).await;
        let result = result.with_context(|| format!("fine-tune losing a node, round {round}"))?;
        eprintln!("  fine-tune losing a node, round {round}: {result:?}");
        failover.push(result);
    }
    print_table(&rounds, &args.replicas);
    print_s3_table(&rounds, &args.replicas);
    print_failover(&failover);
    if let Some(path) = &args.json {
        let all = serde_json::json!({"copies": rounds, "failover": failover});
        std::fs::write(path, serde_json::to_vec_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One round of the fine-tune losing a node vs not, on a fresh database and cluster.
async fn failover_round(
    args: &ReplicationBench,
    round: usize,
) -> Result<faultbench::FailoverRound> {
    let db = tokio::task::spawn_blocking(move || {
        test_postgres::database(&format!("bench_failover_{round}"))
    })
    .await?
    .context("PostgreSQL is needed (NDPIPE_SKIP_POSTGRES is set)")?;
    let config = faultbench::FailoverConfig {
        catalog: db.url.clone(),
        model_dir: args.model_dir.clone(),
        fashion_mnist_dir: args.fashion_mnist_dir.clone(),
        photos: args.failover_photos,
        throttle_images_per_second: args.failover_throttle,
        kill_after_ms: args.failover_kill_ms,
    };
    let exe = crate::ndpipe_binary()?;
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().context("making a work folder")?;
        let result = faultbench::compare_failover(&config, &exe, dir.path());
        drop(db);
        result
    })
    .await?
}

/// The fine-tune losing a node vs not: seconds (mean and range) and the ratio to the
/// fine-tune that keeps every node, per round.
fn print_failover(rounds: &[faultbench::FailoverRound]) {
    if rounds.is_empty() {
        return;
    }
    let range = |v: Vec<f64>| {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{mean:.2} ({lo:.2}-{hi:.2})")
    };
    println!("\n| fine-tune over 3 nodes, 2 copies | seconds | ratio to keeping every node |");
    println!("|---|---|---|");
    println!(
        "| keeps every node | {} | 1.00 |",
        range(rounds.iter().map(|r| r.intact_s).collect())
    );
    println!(
        "| loses a node (kill -9 mid-extraction, its photos not yet received taken over) | {} | {} |",
        range(rounds.iter().map(|r| r.losing_s).collect()),
        range(rounds.iter().map(|r| r.losing_s / r.intact_s).collect())
    );
    println!(
        "(mean over {} rounds, range in brackets; per round, the lost node's photos passed to \
         their copies, kept as received, taken over, and whether the job ran again: {:?})",
        rounds.len(),
        rounds
            .iter()
            .map(|r| (r.failed_over_photos, r.kept, r.taken_over, r.rerun))
            .collect::<Vec<_>>()
    );
}

/// A fresh cluster with `replicas` copies: uploads, reads, and (two copies) repair.
async fn one_round(
    args: &ReplicationBench,
    url: &str,
    replicas: u32,
    work: &Workload,
) -> Result<Round> {
    let (photos, megabytes) = (&work.photos, work.megabytes);
    let dir = tempfile::tempdir()?;
    let tuner_config = ndpipe_tuner::Config {
        data: dir.path().join("tuner"),
        listen: any_port(),
        grpc_listen: any_port(),
        catalog: Some(url.to_string()),
        node_lease_ms: 3000,
        ..ndpipe_tuner::Config::default()
    };
    // The PostgreSQL client blocks: the Tuner's catalog calls run off the async threads.
    let opening = tuner_config.clone();
    let tuner = std::sync::Arc::new(
        tokio::task::spawn_blocking(move || Tuner::open(&opening))
            .await?
            .context("opening the Tuner")?,
    );
    let keys = tuner.access_keys();
    let tuner_running = tuner
        .clone()
        .start(&tuner_config, |router| {
            ndpipe_store::guard_router(router, keys, None)
        })
        .await?;
    let grpc = format!("http://{}", tuner_running.grpc_addr());
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let config = ndpipe_store::Config {
            intra_threads: 1,
            tuner: Some(grpc.clone()),
            name: Some(format!("bench-{i}")),
            catalog: Some(url.to_string()),
            replicas: Some(replicas),
            repair_interval_ms: 200,
            scrub_photos_per_second: 0,
            s3_listen: (i == 0).then(any_port),
            ..store_config(dir.path().join(format!("node{i}")), Some(&args.model_dir))
        };
        nodes.push(PipeStore::open(config).await?.start(None, None).await?);
    }
    wait_live(&tuner, NODES).await?;
    let front = client(nodes[0].http_addr())?;
    let started = Instant::now();
    let ids = upload_all(&front, photos, args.concurrency).await?;
    let upload_s = started.elapsed().as_secs_f64();
    wait_labelled(&nodes, photos.len()).await?;
    let labelled_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    read_all(&front, &ids, args.concurrency).await?;
    let read_s = started.elapsed().as_secs_f64();
    let s3_addr = nodes[0].s3_addr().context("node 0 serves S3")?;
    let plain = work.plain.len() as f64;
    let put_s = s3::put_plain(s3_addr, "bench", &work.plain, args.concurrency).await?;
    let get_s = s3::get_plain(s3_addr, "bench", &work.plain, args.concurrency).await?;
    let mut round = Round {
        replicas,
        upload_photos_per_s: photos.len() as f64 / upload_s,
        upload_mb_per_s: megabytes / upload_s,
        labelled_photos_per_s: photos.len() as f64 / labelled_s,
        read_photos_per_s: ids.len() as f64 / read_s,
        repair_photos_per_s: None,
        repair_mb_per_s: None,
        plain_put_per_s: plain / put_s,
        plain_get_per_s: plain / get_s,
        gateway_upload_photos_per_s: None,
        gateway_plain_put_per_s: None,
    };
    if replicas > 1 {
        let (gateway, _staging) = s3::start_gateway(url, replicas).await?;
        let photos_s = s3::gateway_photos(&gateway, &work.gateway_photos, args.concurrency).await?;
        let gw_s3 = gateway.s3_addr().context("the gateway serves S3")?;
        let plain_s = s3::put_plain(gw_s3, "gateway", &work.plain, args.concurrency).await?;
        round.gateway_upload_photos_per_s = Some(work.gateway_photos.len() as f64 / photos_s);
        round.gateway_plain_put_per_s = Some(plain / plain_s);
        gateway.stop().await?;
    }
    if replicas == 2 {
        let lost = nodes.pop().context("three nodes")?;
        lost.stop().await?;
        let started = Instant::now();
        let (t, name) = (tuner.clone(), format!("bench-{}", NODES - 1));
        tokio::task::spawn_blocking(move || t.remove_node(&name)).await??;
        wait_repaired(&front).await?;
        let seconds = started.elapsed().as_secs_f64();
        let (copies, bytes) = repair_work(&nodes).await?;
        round.repair_photos_per_s = Some(copies / seconds);
        round.repair_mb_per_s = Some(bytes / 1e6 / seconds);
    }
    for node in nodes {
        node.stop().await?;
    }
    tuner_running.stop().await?;
    Ok(round)
}

/// A distinct JPEG of 200x150 pixels for each `seed`.
fn jpeg(seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(200, 150, |x, y| {
        image::Rgb([
            (x.wrapping_mul(seed % 7 + 1) + seed) as u8,
            (y * 3 + seed / 256) as u8,
            ((x ^ y) + seed * 7) as u8,
        ])
    });
    let mut out = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut out),
        image::ImageFormat::Jpeg,
    )
    .expect("encoding a JPEG in memory");
    out
}

async fn wait_live(tuner: &std::sync::Arc<Tuner>, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = tuner.clone();
        let nodes = tokio::task::spawn_blocking(move || t.nodes()).await??;
        if nodes.iter().filter(|n| n.live).count() >= n {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "PipeStores did not register");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn upload_all(
    front: &Client,
    photos: &[Vec<u8>],
    concurrency: usize,
) -> Result<Vec<u64>> {
    let uploads = futures::stream::iter(photos.iter().cloned())
        .map(|bytes| async move { front.upload(bytes, None).await })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    uploads
        .into_iter()
        .map(|r| r.map_err(|e| anyhow::anyhow!("upload failed: {e:?}")))
        .collect()
}

async fn read_all(front: &Client, ids: &[u64], concurrency: usize) -> Result<()> {
    let reads = futures::stream::iter(ids.iter().copied())
        .map(|id| async move { front.get_bytes(&format!("/v1/photos/{id}")).await })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    for r in reads {
        r?;
    }
    Ok(())
}

/// Waits until no photo is under-replicated (a hang guard fails after 10 minutes).
async fn wait_repaired(front: &Client) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status: Value = front.get_json("/v1/cluster").await?;
        if status["under_replicated"] == 0 && status["lost"] == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("repair did not finish: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum over `nodes` of each metric in `names`, from their `/metrics`.
async fn metric_sums<const N: usize>(
    nodes: &[ndpipe_store::Running],
    names: [&str; N],
) -> Result<[f64; N]> {
    let mut sums = [0.0; N];
    for node in nodes {
        let text = client(node.http_addr())?.get_bytes("/metrics").await?;
        let text = String::from_utf8_lossy(&text);
        for (sum, name) in sums.iter_mut().zip(names) {
            *sum += text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
        }
    }
    Ok(sums)
}

/// Copies made and bytes copied by repair on the surviving nodes.
async fn repair_work(nodes: &[ndpipe_store::Running]) -> Result<(f64, f64)> {
    let [copies, bytes] = metric_sums(
        nodes,
        [
            "ndpipe_store_replication_copies_made_total",
            "ndpipe_store_replication_copied_bytes_total",
        ],
    )
    .await?;
    Ok((copies, bytes))
}

/// Waits until `nodes` have labelled `photos` photos between them (a hang guard fails after
/// 10 minutes).
async fn wait_labelled(nodes: &[ndpipe_store::Running], photos: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let [labelled] = metric_sums(nodes, ["ndpipe_store_labelled_total"]).await?;
        if labelled >= photos as f64 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{labelled} of {photos} photos labelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Mean and (min, max) of `f` over `rounds`.
fn stats(rounds: &[&Round], f: impl Fn(&Round) -> Option<f64>) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = rounds.iter().filter_map(|r| f(r)).collect();
    if v.is_empty() {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, min, max))
}

fn print_table(rounds: &[Round], replicas: &[u32]) {
    if rounds.is_empty() {
        return; // --rounds 0: the fine-tune losing a node only
    }
    let of = |r: u32| {
        rounds
            .iter()
            .filter(|x| x.replicas == r)
            .collect::<Vec<_>>()
    };
    let reference = stats(&of(1), |r| Some(r.upload_photos_per_s)).map_or(f64::NAN, |s| s.0);
    let labelled_reference =
        stats(&of(1), |r| Some(r.labelled_photos_per_s)).map_or(f64::NAN, |s| s.0);
    let cell = |s: Option<(f64, f64, f64)>| {
        s.map_or("-".to_string(), |(m, lo, hi)| {
            format!("{m:.1} ({lo:.1}-{hi:.1})")
        })
    };
    println!(
        "\n| copies | upload photos/s | upload MB/s | ratio to 1 copy | uploaded and labelled photos/s | ratio to 1 copy | read photos/s | repair photos/s | repair MB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &r in replicas {
        let rows = of(r);
        let up = stats(&rows, |x| Some(x.upload_photos_per_s));
        let labelled = stats(&rows, |x| Some(x.labelled_photos_per_s));
        println!(
            "| {r} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {} |",
            cell(up),
            cell(stats(&rows, |x| Some(x.upload_mb_per_s))),
            up.map_or(f64::NAN, |s| s.0) / reference,
            cell(labelled),
            labelled.map_or(f64::NAN, |s| s.0) / labelled_reference,
            cell(stats(&rows, |x| Some(x.read_photos_per_s))),
            cell(stats(&rows, |x| x.repair_photos_per_s)),
            cell(stats(&rows, |x| x.repair_mb_per_s)),
        );
    }
    println!(
        "(mean over rounds, range in brackets; one copy: each photo stays where it was uploaded)"
    );
}

/// The S3 table: plain objects through node 0 (ratio to one copy) and the gateway's figures.
fn print_s3_table(rounds: &[Round], replicas: &[u32]) {
    if rounds.is_empty() {
        return;
    }
    let of = |r: u32| {
        rounds
            .iter()
            .filter(|x| x.replicas == r)
            .collect::<Vec<_>>()
    };
    let reference = stats(&of(1), |r| Some(r.plain_put_per_s)).map_or(f64::NAN, |s| s.0);
    let cell = |s: Option<(f64, f64, f64)>| {
        s.map_or("-".to_string(), |(m, lo, hi)| {
            format!("{m:.1} ({lo:.1}-{hi:.1})")
        })
    };
    println!(
        "\n| copies | S3 plain PUT objects/s (node 0) | ratio to 1 copy | S3 plain GET objects/s (node 0) | gateway /v1 photos/s | gateway S3 plain PUT objects/s |"
    );
    println!("|---|---|---|---|---|---|");
    for &r in replicas {
        let rows = of(r);
        let put = stats(&rows, |x| Some(x.plain_put_per_s));
        println!(
            "| {r} | {} | {:.2} | {} | {} | {} |",
            cell(put),
            put.map_or(f64::NAN, |s| s.0) / reference,
            cell(stats(&rows, |x| Some(x.plain_get_per_s))),
            cell(stats(&rows, |x| x.gateway_upload_photos_per_s)),
            cell(stats(&rows, |x| x.gateway_plain_put_per_s)),
        );
    }
    println!(
        "(plain objects of {} KiB; one copy: each object stays on node 0; the gateway runs beside node 0's front door, in the same process)",
        s3::PLAIN_BYTES >> 10
    );
}
