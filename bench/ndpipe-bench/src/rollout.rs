//! `ndpipe-bench rollout`: a backbone rollout on emulated PipeStores (see [`crate::emulated`]
//! for the emulation and its calibration).
//!
//! For each node count, `--rounds` rollouts of a new backbone each (the setup's ONNX file with
//! one unknown protobuf field appended, a genuinely different file ONNX Runtime loads the same
//! way) through the Tuner's rollout job: staging, the pipelined re-extraction and re-labelling
//! on every node, the commit. The figure is the job's aggregate photos/s over the extraction
//! phase against the sum of the nodes' model-only rates, which each node measures in the same
//! job (its new backbone alone on a batch of its own tensors, at its commit). Target: a ratio of
//! at least 0.9. Then the slow-node case ([`crate::rollout_slow`]) unless `--slowdown` is 1.
//!
//! The tables go to stdout and `OUT/rollout.md`, the plots to `OUT/rollout.png` and
//! `OUT/rollout-slow.png`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_model::ModelManifest;
use ndpipe_tuner::{BackboneUpload, RolloutReport};
use serde::Serialize;

use crate::cluster::Cluster;
use crate::emulated::{Calibration, EmulationArgs, Spread, chart};
use crate::rollout_slow::{self, SlowResults};

/// The share of the model-only rate a rollout should reach.
const TARGET: f64 = 0.9;

/// Flags of `ndpipe-bench rollout`.
#[derive(Debug, Args)]
pub(crate) struct RolloutBench {
    #[command(flatten)]
    emulation: EmulationArgs,
    /// Node counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    nodes: Vec<usize>,
    /// How many times slower the second node of the slow-node case is (1: no such case).
    #[arg(long, default_value_t = 4.0)]
    slowdown: f64,
    /// Photos on each of the slow-node case's two nodes.
    #[arg(long, default_value_t = 560)]
    slow_photos_per_node: usize,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    nodes: usize,
    photos: u64,
    images_per_second: Spread,
    model_only_images_per_second: Spread,
    ratio: Spread,
    seconds: Spread,
}

#[derive(Debug, Serialize)]
struct Results {
    calibration: Calibration,
    rows: Vec<Row>,
    slow: Option<SlowResults>,
}

/// Runs `ndpipe-bench rollout`.
pub(crate) async fn run(args: RolloutBench) -> Result<()> {
    ensure!(!args.nodes.is_empty(), "--nodes needs at least one count");
    ensure!(args.slowdown >= 1.0, "--slowdown must be at least 1");
    let most = (*args.nodes.iter().max().unwrap_or(&1)).max(2);
    let emu = &args.emulation;
    let all = emu.photos(most)?;
    let calibration = emu.calibrate(&all, most).await?;
    let rate = calibration.node_images_per_second;
    let variants = tempfile::tempdir().context("creating the backbones' directory")?;
    let mut rows = Vec::new();
    let mut variant = 0u8;
    for &n in &args.nodes {
        let share = &all[..n * emu.photos_per_node];
        let cluster = Cluster::start_capped(n, share, &emu.model_dir, rate).await?;
        let mut reports = Vec::new();
        for round in 0..emu.rounds {
            variant += 1;
            let upload = backbone_variant(&emu.model_dir, variants.path(), variant)?;
            let (added, _) = cluster.tuner().add_backbone(upload).await?;
            eprintln!(
                "  {n} emulated PipeStores, rollout of backbone {} (round {round})",
                &added.backbone[..12]
            );
            reports.push(cluster.tuner().rollout(&added.backbone, false).await?);
        }
        cluster.stop().await?;
        rows.push(row(n, &reports));
    }
    let slow = if args.slowdown > 1.0 {
        let photos = emu.photos_in_all(2 * args.slow_photos_per_node)?;
        let how = (rate, args.slowdown, emu.rounds);
        let dir = variants.path();
        Some(rollout_slow::run(&photos, &emu.model_dir, dir, &mut variant, how).await?)
    } else {
        None
    };
    let results = Results {
        calibration,
        rows,
        slow,
    };
    let mut table = table(&results, &args);
    if let Some(slow) = &results.slow {
        table.push_str(&rollout_slow::table(slow));
    }
    println!("{table}");
    std::fs::create_dir_all(&emu.out).with_context(|| format!("creating {}", emu.out.display()))?;
    std::fs::write(emu.out.join("rollout.md"), &table)?;
    plot(&results, &emu.out)?;
    if let Some(slow) = &results.slow {
        rollout_slow::plot(slow, &emu.out)?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The setup's backbone with protobuf field 1000 = `variant` appended (a message's fields may
/// come in any order and unknown ones are kept, so ONNX Runtime loads the same graph), with
/// its manifest.
pub(crate) fn backbone_variant(
    model_dir: &Path,
    dir: &Path,
    variant: u8,
) -> Result<BackboneUpload> {
    let manifest = ModelManifest::load(model_dir)?;
    let mut onnx = std::fs::read(manifest.model_path())
        .with_context(|| format!("reading {}", manifest.model_path().display()))?;
    // Tag of field 1000, wire type 0 (varint), then the value (< 128: one byte).
    onnx.extend_from_slice(&[0xc0, 0x3e, variant & 0x7f]);
    std::fs::write(dir.join(format!("variant-{variant}.onnx")), &onnx)?;
    Ok(BackboneUpload::new(manifest, &onnx))
}

fn row(nodes: usize, reports: &[RolloutReport]) -> Row {
    let of = |f: fn(&RolloutReport) -> f64| Spread::of(&reports.iter().map(f).collect::<Vec<_>>());
    Row {
        nodes,
        photos: reports.first().map_or(0, |r| r.photos),
        images_per_second: of(|r| r.images_per_second),
        model_only_images_per_second: of(|r| r.model_only_images_per_second),
        ratio: of(|r| r.efficiency),
        seconds: of(|r| r.extract_seconds),
    }
}

fn table(r: &Results, args: &RolloutBench) -> String {
    let mut out = format!("{}\n\n", r.calibration.describe(&args.emulation));
    out.push_str(
        "| nodes (emulated) | photos | rollout photos/s (aggregate) | sum of model-only photos/s | ratio | target 0.9 | extraction phase s |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} ({:.2}..{:.2}) | {} | {} |\n",
            row.nodes,
            row.photos,
            row.images_per_second,
            row.model_only_images_per_second,
            row.ratio.mean,
            row.ratio.min,
            row.ratio.max,
            if row.ratio.mean >= TARGET {
                "met"
            } else {
                "missed"
            },
            row.seconds
        ));
    }
    out
}

fn plot(r: &Results, out: &Path) -> Result<()> {
    let x: Vec<f64> = r.rows.iter().map(|row| row.nodes as f64).collect();
    let measured: Vec<f64> = r
        .rows
        .iter()
        .map(|row| row.images_per_second.mean)
        .collect();
    let model_only: Vec<f64> = r
        .rows
        .iter()
        .map(|row| row.model_only_images_per_second.mean)
        .collect();
    chart(
        &out.join("rollout.png"),
        "Backbone rollout on emulated PipeStores",
        "PipeStores (emulated)",
        "photos/s",
        &x,
        vec![
            ("rollout (aggregate)".into(), measured),
            ("sum of model-only rates".into(), model_only),
        ],
    )
}
