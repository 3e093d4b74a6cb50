//! `ndpipe-bench scaling`: NDPipe's scaling experiment on emulated PipeStores.
//!
//! On one machine, N real PipeStores share the same cores, so more nodes measure core sharing,
//! not scaling. Here each PipeStore's model is capped (`model_rate_limit`) at a per-node rate
//! calibrated in the same run: the machine's own extraction rate (the largest N of uncapped
//! nodes at once) times a headroom, divided by that N, so that N capped nodes together ask for
//! less than the machine can do and behave like N machines of that rate. Every figure is labelled "emulated"
//! with that calibration.
//!
//! Two experiments, each `--rounds` times (mean and min..max printed):
//! - weak scaling: 1, 2, 4, 8 nodes with the same photos each, a fine-tune that runs the
//!   backbone (no stored features): throughput (photos/s of extraction) and efficiency,
//!   `throughput(N) / (N x throughput(1))`;
//! - near-data vs conventional under a cap on what the Tuner receives: caps at fractions of
//!   the rate at which the nodes would ship tensors, measured in the same run. Near-data ships
//!   features, so it should stay at the nodes' rate under every cap below the tensors' rate.
//!
//! Tables go to stdout and `OUT/scaling.md`, plots to `OUT/scaling.png` and
//! `OUT/ingress-cap.png`.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe::fashion_mnist;
use ndpipe_tuner::{FinetuneReport, FinetuneRequest, Mode};
use serde::Serialize;

use crate::cluster::{Cluster, Photo};

/// Flags of `ndpipe-bench scaling`.
#[derive(Debug, Args)]
pub(crate) struct ScalingBench {
    /// Node counts of the weak-scaling experiment.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    nodes: Vec<usize>,
    /// Fashion-MNIST photos on each node (6:1 train:test).
    #[arg(long, default_value_t = 140)]
    photos_per_node: usize,
    /// Each node's model rate, images/s; 0: calibrate (the machine's rate x headroom / the
    /// largest node count).
    #[arg(long, default_value_t = 0.0)]
    node_rate: f64,
    /// Share of the machine's measured rate that the emulated nodes may ask for together.
    #[arg(long, default_value_t = 0.6)]
    headroom: f64,
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Nodes of the ingress-cap experiment.
    #[arg(long, default_value_t = 4)]
    cap_nodes: usize,
    /// Tuner-ingress caps, as fractions of the rate at which the nodes would ship tensors.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1")]
    cap_fractions: Vec<f64>,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// Folder for the table and the plots.
    #[arg(long, default_value = "docs/experiments")]
    out: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Mean and range of repeated measurements.
#[derive(Debug, Clone, Copy, Serialize)]
struct Spread {
    mean: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let n = values.len().max(1) as f64;
        Spread {
            mean: values.iter().sum::<f64>() / n,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ({:.1}..{:.1})", self.mean, self.min, self.max)
    }
}

#[derive(Debug, Serialize)]
struct Calibration {
    machine_images_per_second: f64,
    node_images_per_second: f64,
    headroom: f64,
}

#[derive(Debug, Serialize)]
struct ScaleRow {
    nodes: usize,
    images: usize,
    images_per_second: Spread,
    efficiency: f64,
    val_top1: f64,
}

#[derive(Debug, Serialize)]
struct CapRow {
    fraction: f64,
    cap_mb_s: f64,
    near_data: Spread,
    conventional: Spread,
    near_data_bytes_per_image: f64,
    conventional_bytes_per_image: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    calibration: Calibration,
    scaling: Vec<ScaleRow>,
    tensors_mb_s: f64,
    caps: Vec<CapRow>,
}

/// Runs `ndpipe-bench scaling`.
pub(crate) async fn run(args: ScalingBench) -> Result<()> {
    ensure!(!args.nodes.is_empty(), "--nodes needs at least one count");
    let most = *args.nodes.iter().max().unwrap_or(&1);
    let all = photos(&args, most.max(args.cap_nodes))?;
    let calibration = calibrate(&args, &all, most).await?;
    let rate = calibration.node_images_per_second;
    let mut scaling = Vec::new();
    for &n in &args.nodes {
        let share = &all[..n * args.photos_per_node];
        let cluster = Cluster::start_capped(n, share, &args.model_dir, rate).await?;
        let mut rates = Vec::new();
        let mut top1 = 0.0;
        for round in 0..args.rounds {
            let r = finetune(&cluster, Mode::NearData, 0.0, round).await?;
            rates.push(extraction_rate(&r));
            top1 = f64::from(r.val_top1);
        }
        cluster.stop().await?;
        scaling.push(ScaleRow {
            nodes: n,
            images: share.len(),
            images_per_second: Spread::of(&rates),
            efficiency: 0.0,
            val_top1: top1,
        });
    }
    let base = scaling
        .iter()
        .find(|r| r.nodes == 1)
        .map(|r| r.images_per_second.mean);
    for row in &mut scaling {
        row.efficiency = base.map_or(f64::NAN, |b| {
            row.images_per_second.mean / (b * row.nodes as f64)
        });
    }
    let (tensors_mb_s, caps) = ingress_caps(&args, &all, rate).await?;
    let results = Results {
        calibration,
        scaling,
        tensors_mb_s,
        caps,
    };
    let table = table(&results, &args);
    println!("{table}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("scaling.md"), &table)?;
    plots(&results, &args)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The machine's extraction rate: `most` uncapped nodes at once (what that many model sessions
/// can do together here), and the per-node rate from it.
async fn calibrate(args: &ScalingBench, all: &[Photo], most: usize) -> Result<Calibration> {
    if args.node_rate > 0.0 {
        return Ok(Calibration {
            machine_images_per_second: f64::NAN,
            node_images_per_second: args.node_rate,
            headroom: args.headroom,
        });
    }
    eprintln!("calibrating: {most} uncapped PipeStores, the backbone over their photos...");
    let cluster =
        Cluster::start(most, &all[..most * args.photos_per_node], &args.model_dir).await?;
    let mut rates = Vec::new();
    for round in 0..args.rounds {
        rates.push(extraction_rate(
            &finetune(&cluster, Mode::NearData, 0.0, round).await?,
        ));
    }
    cluster.stop().await?;
    let machine = Spread::of(&rates).mean;
    Ok(Calibration {
        machine_images_per_second: machine,
        node_images_per_second: machine * args.headroom / most as f64,
        headroom: args.headroom,
    })
}

/// Near-data vs conventional on `args.cap_nodes` capped nodes, under Tuner-ingress caps at
/// fractions of the tensors' rate (measured first, uncapped, in conventional mode).
async fn ingress_caps(args: &ScalingBench, all: &[Photo], rate: f64) -> Result<(f64, Vec<CapRow>)> {
    let n = args.cap_nodes;
    let cluster =
        Cluster::start_capped(n, &all[..n * args.photos_per_node], &args.model_dir, rate).await?;
    let probe = finetune(&cluster, Mode::Conventional, 0.0, 0).await?;
    let tensors = n as f64 * rate * probe.bytes_per_image;
    let mut rows = Vec::new();
    for &fraction in &args.cap_fractions {
        let cap = tensors * fraction;
        let (mut near, mut conv) = (Vec::new(), Vec::new());
        let (mut near_bytes, mut conv_bytes) = (0.0, 0.0);
        for round in 0..args.rounds {
            let r = finetune(&cluster, Mode::NearData, cap, round).await?;
            near.push(extraction_rate(&r));
            near_bytes = r.bytes_per_image;
            let r = finetune(&cluster, Mode::Conventional, cap, round).await?;
            conv.push(extraction_rate(&r));
            conv_bytes = r.bytes_per_image;
        }
        rows.push(CapRow {
            fraction,
            cap_mb_s: cap / 1e6,
            near_data: Spread::of(&near),
            conventional: Spread::of(&conv),
            near_data_bytes_per_image: near_bytes,
            conventional_bytes_per_image: conv_bytes,
        });
    }
    cluster.stop().await?;
    Ok((tensors / 1e6, rows))
}

/// Photos per second of extraction: every training and validation photo over the time until
/// the last node sent its last run.
fn extraction_rate(r: &FinetuneReport) -> f64 {
    (r.train_images + r.val_images) as f64 / r.extract_seconds.max(1e-9)
}

/// One fine-tune that runs the backbone on every photo, with the Tuner's ingress capped at
/// `ingress` bytes/s (0: none); short training, so extraction dominates.
async fn finetune(
    cluster: &Cluster,
    mode: Mode,
    ingress: f64,
    seed: usize,
) -> Result<FinetuneReport> {
    eprintln!(
        "  {} emulated PipeStores, {}, Tuner ingress cap {:.1} MB/s, round {seed}",
        cluster.len(),
        mode.as_str(),
        ingress / 1e6
    );
    let req = FinetuneRequest {
        runs: 2,
        epochs: 2,
        batch: 128,
        mode,
        ingress_bytes_per_second: ingress,
        use_stored_features: false,
        deploy: false,
        chunk_size: 32,
        load_balance: false,
        seed: seed as u64,
        ..FinetuneRequest::default()
    };
    Ok(cluster.tuner().finetune(req).await?)
}

/// `per_node` labelled Fashion-MNIST photos for each of `nodes` nodes, 6:1 train:test.
fn photos(args: &ScalingBench, nodes: usize) -> Result<Vec<Photo>> {
    let dir = fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let train = fashion_mnist::load(&dir, "train")?;
    let test = fashion_mnist::load(&dir, "test")?;
    let total = args.photos_per_node * nodes;
    let mut out = Vec::with_capacity(total);
    for i in 0..total {
        // Every seventh photo is a test photo; the others train.
        let (set, split, k) = if i % 7 == 6 {
            (&test, "test", i / 7)
        } else {
            (&train, "train", i)
        };
        ensure!(
            k < set.len(),
            "Fashion-MNIST has too few photos for {total}"
        );
        out.push((
            fashion_mnist::png(set.image(k))?,
            fashion_mnist::CLASSES[usize::from(set.labels[k])],
            split,
        ));
    }
    Ok(out)
}

fn table(r: &Results, args: &ScalingBench) -> String {
    let c = &r.calibration;
    let mut out = String::new();
    out.push_str(&format!(
        "Emulated PipeStores: each model capped at {:.1} images/s = {:.0}% of this machine's measured \
         extraction rate ({:.1} images/s, that many uncapped nodes at once) / {} nodes. {} photos per node, \
         {} rounds each (mean, min..max).\n\n",
        c.node_images_per_second,
        100.0 * c.headroom,
        c.machine_images_per_second,
        args.nodes.iter().max().unwrap_or(&1),
        args.photos_per_node,
        args.rounds
    ));
    out.push_str("| nodes (emulated) | photos | extraction photos/s | ideal (N x 1 node) | efficiency | top-1 |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    let base = r
        .scaling
        .iter()
        .find(|s| s.nodes == 1)
        .map(|s| s.images_per_second.mean);
    for s in &r.scaling {
        let ideal = base.map_or("n/a".to_string(), |b| format!("{:.1}", b * s.nodes as f64));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.1}% |\n",
            s.nodes,
            s.images,
            s.images_per_second,
            ideal,
            s.efficiency,
            100.0 * s.val_top1
        ));
    }
    out.push_str(&format!(
        "\nNear-data vs conventional on {} emulated nodes under a cap on what the Tuner receives \
         (the tensors' rate, {:.1} images/s x bytes per tensor, is {:.1} MB/s):\n\n",
        args.cap_nodes,
        args.cap_nodes as f64 * c.node_images_per_second,
        r.tensors_mb_s
    ));
    out.push_str("| cap (x tensors' rate) | cap MB/s | near-data photos/s | conventional photos/s | near-data / conventional | bytes/photo near-data | bytes/photo conventional |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for row in &r.caps {
        out.push_str(&format!(
            "| {:.2} | {:.2} | {} | {} | {:.2} | {:.0} | {:.0} |\n",
            row.fraction,
            row.cap_mb_s,
            row.near_data,
            row.conventional,
            row.near_data.mean / row.conventional.mean.max(1e-9),
            row.near_data_bytes_per_image,
            row.conventional_bytes_per_image
        ));
    }
    out
}

fn plots(r: &Results, args: &ScalingBench) -> Result<()> {
    let x: Vec<f64> = r.scaling.iter().map(|s| s.nodes as f64).collect();
    let measured: Vec<f64> = r.scaling.iter().map(|s| s.images_per_second.mean).collect();
    let base = r
        .scaling
        .iter()
        .find(|s| s.nodes == 1)
        .map_or(0.0, |s| s.images_per_second.mean);
    let ideal: Vec<f64> = x.iter().map(|n| n * base).collect();
    throughput_chart(
        &args.out.join("scaling.png"),
        "Emulated PipeStores: extraction throughput",
        "PipeStores (emulated)",
        &x,
        vec![
            ("measured".into(), measured),
            ("ideal (N x 1 node)".into(), ideal),
        ],
    )?;
    let x: Vec<f64> = r.caps.iter().map(|c| c.cap_mb_s).collect();
    let near: Vec<f64> = r.caps.iter().map(|c| c.near_data.mean).collect();
    let conv: Vec<f64> = r.caps.iter().map(|c| c.conventional.mean).collect();
    throughput_chart(
        &args.out.join("ingress-cap.png"),
        "Near-data vs conventional under a Tuner-ingress cap (emulated)",
        "Tuner ingress cap, MB/s",
        &x,
        vec![("near-data".into(), near), ("conventional".into(), conv)],
    )
}

/// A PNG chart of photos/s over `x`, the y axis from 0 to a tenth above the highest value.
fn throughput_chart(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    x: &[f64],
    series: Vec<(String, Vec<f64>)>,
) -> Result<()> {
    let top = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    cachebench::plot::xy_chart(path, title, x_label, "photos/s", x, 0.0..top, &series)?;
    Ok(())
}
