//! `ndpipe-bench finetune`: NDPipe's fine-tuning experiments on loopback, in one run.
//!
//! In-process PipeStores (each with its own store, catalog, model session and gRPC service)
//! register with an in-process Tuner; Fashion-MNIST photos are uploaded to them over HTTP. Then:
//! near-data (features cross the network) vs conventional (preprocessed tensors cross it and the
//! Tuner runs the backbone) under two bandwidth caps; r = 1, 2, 4 pipelined runs; 1, 2 and 4
//! PipeStores. Each row reports bytes on the wire per image, seconds and validation top-1.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ndpipe::fashion_mnist;
use ndpipe_tuner::{FinetuneReport, FinetuneRequest, Mode};
use serde::Serialize;

use crate::cluster::{Cluster, Photo};

/// Flags of `ndpipe-bench finetune`.
#[derive(Debug, Args)]
pub(crate) struct FinetuneBench {
    /// Fashion-MNIST photos in all (6:1 train:test), split evenly across the PipeStores.
    #[arg(long, default_value_t = 1400)]
    images: usize,
    /// Epochs per run.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Training batch size (NDPipe's 1024 leaves one step per epoch on data this small).
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// The two bandwidth caps, in MB/s: NDPipe's 1 and 10 Gbit/s scaled by this machine's
    /// extraction rate (about 120 img/s here vs 1,913 img/s on NDPipe's T4).
    #[arg(long, value_delimiter = ',', default_value = "8,80")]
    caps_mb: Vec<f64>,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// Images/s of the throttled PipeStore in the load-balancing rows.
    #[arg(long, default_value_t = 15.0)]
    throttle: f64,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    experiment: String,
    nodes: usize,
    runs: u32,
    mode: String,
    cap_mb_s: f64,
    bytes_per_image: f64,
    seconds: f64,
    train_seconds: f64,
    hidden_seconds: f64,
    val_top1: f32,
}

/// Runs `ndpipe-bench finetune`.
pub(crate) async fn run(args: FinetuneBench) -> Result<()> {
    let photos = photos(&args)?;
    let mut rows = Vec::new();
    {
        let cluster = Cluster::start(2, &photos, &args.model_dir).await?;
        for &cap in &args.caps_mb {
            for mode in [Mode::NearData, Mode::Conventional] {
                let r = finetune(&cluster, mode, 2, cap, &args, false).await?;
                rows.push(row("mode x bandwidth", 2, 2, mode.as_str(), cap, &r));
            }
        }
        let r = finetune(&cluster, Mode::NearData, 2, 0.0, &args, true).await?;
        rows.push(row(
            "stored features (no backbone run)",
            2,
            2,
            "near-data",
            0.0,
            &r,
        ));
        for lb in [false, true] {
            let r = finetune_throttled(&cluster, lb, &args).await?;
            let name = if lb {
                "throttled node, load balancing on"
            } else {
                "throttled node, load balancing off"
            };
            rows.push(row(name, 2, 2, "near-data", 0.0, &r));
        }
        for runs in [1, 2, 4] {
            let r = finetune(&cluster, Mode::NearData, runs, 0.0, &args, false).await?;
            rows.push(row("pipelined runs", 2, runs, "near-data", 0.0, &r));
        }
        cluster.stop().await?;
    }
    for n in [1, 2, 4] {
        let cluster = Cluster::start(n, &photos, &args.model_dir).await?;
        let r = finetune(&cluster, Mode::NearData, 2, 0.0, &args, false).await?;
        rows.push(row("PipeStores", n, 2, "near-data", 0.0, &r));
        cluster.stop().await?;
    }
    print(&rows, &args);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn row(experiment: &str, nodes: usize, runs: u32, mode: &str, cap: f64, r: &FinetuneReport) -> Row {
    Row {
        experiment: experiment.into(),
        nodes,
        runs,
        mode: mode.into(),
        cap_mb_s: cap,
        bytes_per_image: r.bytes_per_image,
        seconds: r.seconds,
        train_seconds: r.train_seconds,
        hidden_seconds: r.train_hidden_seconds,
        val_top1: r.val_top1,
    }
}

/// The photos used.
fn photos(args: &FinetuneBench) -> Result<Vec<Photo>> {
    let dir = fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let train = fashion_mnist::load(&dir, "train")?;
    let test = fashion_mnist::load(&dir, "test")?;
    let n_train = (args.images * 6).div_ceil(7);
    let mut out = Vec::with_capacity(args.images);
    for i in 0..n_train.min(train.len()) {
        out.push((
            fashion_mnist::png(train.image(i))?,
            fashion_mnist::CLASSES[usize::from(train.labels[i])],
            "train",
        ));
    }
    for i in 0..(args.images - n_train).min(test.len()) {
        out.push((
            fashion_mnist::png(test.image(i))?,
            fashion_mnist::CLASSES[usize::from(test.labels[i])],
            "test",
        ));
    }
    Ok(out)
}

/// Near-data fine-tuning with PipeStore 1 throttled to `args.throttle` images/s.
async fn finetune_throttled(
    cluster: &Cluster,
    load_balance: bool,
    args: &FinetuneBench,
) -> Result<FinetuneReport> {
    eprintln!(
        "  {} PipeStores, bench-1 throttled, load balancing {load_balance}",
        cluster.len()
    );
    let req = FinetuneRequest {
        runs: 2,
        epochs: args.epochs,
        batch: args.batch,
        use_stored_features: false,
        deploy: false,
        chunk_size: 32,
        load_balance,
        throttle: [("bench-1".to_string(), args.throttle)]
            .into_iter()
            .collect(),
        ..FinetuneRequest::default()
    };
    Ok(cluster.tuner().finetune(req).await?)
}

/// One fine-tuning in `mode` with `runs` pipelined runs under a `cap_mb` MB/s cap per node.
async fn finetune(
    cluster: &Cluster,
    mode: Mode,
    runs: u32,
    cap_mb: f64,
    args: &FinetuneBench,
    stored: bool,
) -> Result<FinetuneReport> {
    eprintln!(
        "  {} PipeStores, {}, r = {runs}, cap {cap_mb} MB/s, stored features: {stored}",
        cluster.len(),
        mode.as_str()
    );
    let req = FinetuneRequest {
        runs,
        epochs: args.epochs,
        batch: args.batch,
        mode,
        bandwidth_bytes_per_second: cap_mb * 1e6,
        use_stored_features: stored,
        deploy: false,
        chunk_size: 64,
        load_balance: false,
        ..FinetuneRequest::default()
    };
    Ok(cluster.tuner().finetune(req).await?)
}

fn print(rows: &[Row], args: &FinetuneBench) {
    println!();
    println!(
        "bench finetune: {} Fashion-MNIST photos (6:1 train:test), {} epochs per run, EfficientNet-Lite0 features",
        args.images, args.epochs
    );
    println!(
        "| {:<34} | {:>5} | {:>4} | {:<12} | {:>8} | {:>10} | {:>8} | {:>8} | {:>8} | {:>7} |",
        "experiment",
        "nodes",
        "runs",
        "mode",
        "cap MB/s",
        "bytes/img",
        "total s",
        "train s",
        "hidden s",
        "top-1"
    );
    println!(
        "|{:-<36}|{:->7}|{:->6}|{:-<14}|{:->10}|{:->12}|{:->10}|{:->10}|{:->10}|{:->9}|",
        "", "", "", "", "", "", "", "", "", ""
    );
    for r in rows {
        let cap = if r.cap_mb_s > 0.0 {
            format!("{:.0}", r.cap_mb_s)
        } else {
            "none".into()
        };
        println!(
            "| {:<34} | {:>5} | {:>4} | {:<12} | {:>8} | {:>10.0} | {:>8.1} | {:>8.2} | {:>8.2} | {:>6.1}% |",
            r.experiment,
            r.nodes,
            r.runs,
            r.mode,
            cap,
            r.bytes_per_image,
            r.seconds,
            r.train_seconds,
            r.hidden_seconds,
            100.0 * r.val_top1
        );
    }
    for &cap in &args.caps_mb {
        let pick = |mode: &str| {
            rows.iter()
                .find(|r| r.experiment == "mode x bandwidth" && r.mode == mode && r.cap_mb_s == cap)
        };
        if let (Some(n), Some(c)) = (pick("near-data"), pick("conventional")) {
            println!(
                "cap {cap} MB/s: near-data sends {:.1}x fewer bytes per image and finishes in {:.2}x the time of conventional",
                c.bytes_per_image / n.bytes_per_image,
                n.seconds / c.seconds
            );
        }
    }
}
