//! `ndpipe-bench rsweep`: NDPipe's pipelined runs on emulated PipeStores (see
//! [`crate::emulated`]), in a training-heavy setting.
//!
//! With r runs the Tuner trains run k while the nodes extract run k + 1, so part of the
//! training hides behind extraction. What that saves is measured, not inferred from overlap:
//! `saved = (extract-only + train-only) - total`, the three measured in the same run on the
//! same cluster: extract-only is the extraction time of a job with one epoch, train-only the
//! training time of a job over stored features (no backbone), total the time of the pipelined
//! job. The epochs are chosen in the same run so that training alone takes about as long as
//! extraction alone (training is otherwise about 1% of a job here and nothing can be saved).
//! Runs are aligned to [`ALIGN`] photos, not the nodes' batch of 32: with a few hundred photos
//! per node, 32-aligned runs leave all but the last run empty and nothing to overlap.
//!
//! The table goes to stdout and `OUT/rsweep.md`, the plot to `OUT/rsweep.png`.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_tuner::Mode;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::emulated::{Calibration, EmulationArgs, Job, Spread, chart};

/// Epochs of the probe that measures training's cost per epoch.
const PROBE_EPOCHS: usize = 30;
/// The most epochs the training-heavy setting may use.
const MAX_EPOCHS: usize = 3000;
/// Photos a run boundary is a multiple of.
const ALIGN: u32 = 8;

/// Flags of `ndpipe-bench rsweep`.
#[derive(Debug, Args)]
pub(crate) struct RsweepBench {
    #[command(flatten)]
    emulation: EmulationArgs,
    /// Emulated PipeStores.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Pipelined runs to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    runs: Vec<u32>,
    /// Epochs per run; 0: chosen so that training alone takes as long as extraction alone.
    #[arg(long, default_value_t = 0)]
    epochs: usize,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    runs: u32,
    total_seconds: Spread,
    extract_only_seconds: Spread,
    train_only_seconds: Spread,
    saved_seconds: Spread,
    /// `saved / train-only`, of the means.
    saved_share_of_training: f64,
    val_top1: Spread,
    /// When each run of the last pipelined job was ready and trained, seconds from its start.
    timeline: Vec<ndpipe_tuner::RunTimeline>,
}

#[derive(Debug, Serialize)]
struct Results {
    calibration: Calibration,
    nodes: usize,
    photos: usize,
    epochs: usize,
    rows: Vec<Row>,
}

/// Runs `ndpipe-bench rsweep`.
pub(crate) async fn run(args: RsweepBench) -> Result<()> {
    ensure!(!args.runs.is_empty(), "--runs needs at least one count");
    let emu = &args.emulation;
    let all = emu.photos(args.nodes)?;
    let calibration = emu.calibrate(&all, args.nodes).await?;
    let rate = calibration.node_images_per_second;
    let cluster = Cluster::start_capped(args.nodes, &all, &emu.model_dir, rate).await?;
    let epochs = match args.epochs {
        0 => heavy_epochs(&cluster).await?,
        e => e,
    };
    let mut rows = Vec::new();
    for &runs in &args.runs {
        rows.push(sweep_point(&cluster, runs, epochs, emu.rounds).await?);
    }
    cluster.stop().await?;
    let results = Results {
        calibration,
        nodes: args.nodes,
        photos: all.len(),
        epochs,
        rows,
    };
    let table = table(&results, emu);
    println!("{table}");
    std::fs::create_dir_all(&emu.out).with_context(|| format!("creating {}", emu.out.display()))?;
    std::fs::write(emu.out.join("rsweep.md"), &table)?;
    let x: Vec<f64> = results.rows.iter().map(|r| f64::from(r.runs)).collect();
    let saved = results.rows.iter().map(|r| r.saved_seconds.mean).collect();
    let train = results
        .rows
        .iter()
        .map(|r| r.train_only_seconds.mean)
        .collect();
    chart(
        &emu.out.join("rsweep.png"),
        "Pipelined runs (emulated): training time saved",
        "runs (r)",
        "seconds",
        &x,
        vec![("saved".into(), saved), ("training alone".into(), train)],
    )?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Epochs for which training alone takes about as long as extraction alone, from one
/// extraction and one training probe.
async fn heavy_epochs(cluster: &Cluster) -> Result<usize> {
    let extract = Job {
        runs: 1,
        epochs: 1,
        ..Job::backbone(Mode::NearData, 0)
    }
    .run(cluster)
    .await?
    .extract_seconds;
    let train = Job {
        runs: 1,
        epochs: PROBE_EPOCHS,
        stored: true,
        ..Job::backbone(Mode::NearData, 0)
    }
    .run(cluster)
    .await?
    .train_seconds;
    let epochs = (PROBE_EPOCHS as f64 * extract / train.max(1e-6)).round() as usize;
    eprintln!(
        "training-heavy: extraction {extract:.1} s, {PROBE_EPOCHS} epochs {train:.2} s: {epochs} epochs"
    );
    Ok(epochs.clamp(PROBE_EPOCHS, MAX_EPOCHS))
}

/// Total, extract-only and train-only times of `runs` pipelined runs, `rounds` times.
async fn sweep_point(cluster: &Cluster, runs: u32, epochs: usize, rounds: usize) -> Result<Row> {
    let (mut total, mut extract, mut train, mut saved, mut top1) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut timeline = Vec::new();
    for round in 0..rounds {
        let job = Job {
            runs,
            epochs,
            align: ALIGN,
            ..Job::backbone(Mode::NearData, round)
        };
        let full = job.run(cluster).await?;
        let extract_only = Job { epochs: 1, ..job }.run(cluster).await?.extract_seconds;
        let train_only = Job {
            stored: true,
            ..job
        }
        .run(cluster)
        .await?
        .train_seconds;
        saved.push(extract_only + train_only - full.seconds);
        total.push(full.seconds);
        extract.push(extract_only);
        train.push(train_only);
        top1.push(100.0 * f64::from(full.val_top1));
        timeline = full.runs;
    }
    let (saved, train) = (Spread::of(&saved), Spread::of(&train));
    Ok(Row {
        runs,
        total_seconds: Spread::of(&total),
        extract_only_seconds: Spread::of(&extract),
        train_only_seconds: train,
        saved_seconds: saved,
        saved_share_of_training: saved.mean / train.mean.max(1e-9),
        val_top1: Spread::of(&top1),
        timeline,
    })
}

fn table(r: &Results, emu: &EmulationArgs) -> String {
    let mut out = format!(
        "{}\n\n{} emulated nodes, {} photos, {} epochs per run (training-heavy: training alone \
         about as long as extraction alone). saved = (extract-only + train-only) - total.\n\n",
        r.calibration.describe(emu),
        r.nodes,
        r.photos,
        r.epochs
    );
    out.push_str(
        "| r | total s | extract-only s | train-only s | saved s | saved / training | top-1 % |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0}% | {} |\n",
            row.runs,
            row.total_seconds,
            row.extract_only_seconds,
            row.train_only_seconds,
            row.saved_seconds,
            100.0 * row.saved_share_of_training,
            row.val_top1
        ));
    }
    out
}
