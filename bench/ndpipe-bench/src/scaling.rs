//! `ndpipe-bench scaling`: NDPipe's scaling experiment on emulated PipeStores (see
//! [`crate::emulated`] for the emulation and its calibration).
//!
//! Two experiments, each `--rounds` times (mean and min..max printed):
//! - weak scaling: 1, 2, 4, 8 nodes with the same photos each, a fine-tune that runs the
//!   backbone (no stored features): throughput (photos/s of extraction) and efficiency,
//!   `throughput(N) / (N x throughput(1))`;
//! - near-data vs conventional under a cap on what the Tuner receives: caps at fractions of
//!   the rate at which the nodes would ship tensors, measured in the same run (bytes counted
//!   at the transport). Near-data ships features, so it should stay at the nodes' rate under
//!   every cap below the tensors' rate.
//!
//! Tables go to stdout and `OUT/scaling.md`, plots to `OUT/scaling.png` and
//! `OUT/ingress-cap.png`.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_tuner::Mode;
use serde::Serialize;

use crate::cluster::{Cluster, Photo};
use crate::emulated::{Calibration, EmulationArgs, Job, Spread, chart, extraction_rate};

/// Flags of `ndpipe-bench scaling`.
#[derive(Debug, Args)]
pub(crate) struct ScalingBench {
    #[command(flatten)]
    emulation: EmulationArgs,
    /// Node counts of the weak-scaling experiment.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    nodes: Vec<usize>,
    /// Nodes of the ingress-cap experiment.
    #[arg(long, default_value_t = 4)]
    cap_nodes: usize,
    /// Tuner-ingress caps, as fractions of the rate at which the nodes would ship tensors.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1")]
    cap_fractions: Vec<f64>,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
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
    let emu = &args.emulation;
    let all = emu.photos(most.max(args.cap_nodes))?;
    let calibration = emu.calibrate(&all, most).await?;
    let rate = calibration.node_images_per_second;
    let mut scaling = Vec::new();
    for &n in &args.nodes {
        let share = &all[..n * emu.photos_per_node];
        let cluster = Cluster::start_capped(n, share, &emu.model_dir, rate).await?;
        let mut rates = Vec::new();
        let mut top1 = 0.0;
        for round in 0..emu.rounds {
            let r = Job::backbone(Mode::NearData, round).run(&cluster).await?;
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
    std::fs::create_dir_all(&emu.out).with_context(|| format!("creating {}", emu.out.display()))?;
    std::fs::write(emu.out.join("scaling.md"), &table)?;
    plots(&results, &args)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Near-data vs conventional on `args.cap_nodes` capped nodes, under Tuner-ingress caps at
/// fractions of the tensors' rate (measured first, uncapped, in conventional mode).
async fn ingress_caps(args: &ScalingBench, all: &[Photo], rate: f64) -> Result<(f64, Vec<CapRow>)> {
    let (n, emu) = (args.cap_nodes, &args.emulation);
    let share = &all[..n * emu.photos_per_node];
    let cluster = Cluster::start_capped(n, share, &emu.model_dir, rate).await?;
    let probe = Job::backbone(Mode::Conventional, 0).run(&cluster).await?;
    let tensors = n as f64 * rate * probe.wire_bytes_per_image;
    let mut rows = Vec::new();
    for &fraction in &args.cap_fractions {
        let cap = tensors * fraction;
        let (mut near, mut conv) = (Vec::new(), Vec::new());
        let (mut near_bytes, mut conv_bytes) = (0.0, 0.0);
        for round in 0..emu.rounds {
            let capped = |mode| Job {
                ingress: cap,
                ..Job::backbone(mode, round)
            };
            let r = capped(Mode::NearData).run(&cluster).await?;
            near.push(extraction_rate(&r));
            near_bytes = r.wire_bytes_per_image;
            let r = capped(Mode::Conventional).run(&cluster).await?;
            conv.push(extraction_rate(&r));
            conv_bytes = r.wire_bytes_per_image;
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

fn table(r: &Results, args: &ScalingBench) -> String {
    let c = &r.calibration;
    let mut out = format!("{}\n\n", c.describe(&args.emulation));
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
    out.push_str("| cap (x tensors' rate) | cap MB/s | near-data photos/s | conventional photos/s | near-data / conventional | wire bytes/photo near-data | wire bytes/photo conventional |\n");
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
    let out = &args.emulation.out;
    chart(
        &out.join("scaling.png"),
        "Emulated PipeStores: extraction throughput",
        "PipeStores (emulated)",
        "photos/s",
        &x,
        vec![
            ("measured".into(), measured),
            ("ideal (N x 1 node)".into(), ideal),
        ],
    )?;
    let x: Vec<f64> = r.caps.iter().map(|c| c.cap_mb_s).collect();
    let near: Vec<f64> = r.caps.iter().map(|c| c.near_data.mean).collect();
    let conv: Vec<f64> = r.caps.iter().map(|c| c.conventional.mean).collect();
    chart(
        &out.join("ingress-cap.png"),
        "Near-data vs conventional under a Tuner-ingress cap (emulated)",
        "Tuner ingress cap, MB/s",
        "photos/s",
        &x,
        vec![("near-data".into(), near), ("conventional".into(), conv)],
    )
}
