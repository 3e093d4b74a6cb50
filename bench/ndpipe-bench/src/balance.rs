//! `ndpipe-bench balance`: load balancing on emulated PipeStores (see [`crate::emulated`]) with
//! one node `--slowdown` times slower than the others (its model capped at the calibrated rate
//! divided by it), every photo through the backbone (no stored features read).
//!
//! Each round runs the same fine-tune with load balancing off and on, and compares both with
//! the proportional ideal measured in the same round: every node busy until the end, each with
//! a share of the photos in proportion to its rate. The rates are those the nodes reached in
//! the round's job without balancing (photos / seconds of each); the ideal is
//! `photos / sum(rates)`, plus the start-up that job spent before its slowest node began
//! (`extract_seconds - that node's seconds`), which no balancing removes.
//!
//! The table goes to stdout and `OUT/balance.md`, the plot to `OUT/balance.png`.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_tuner::{FinetuneReport, FinetuneRequest};
use serde::Serialize;

use crate::cluster::Cluster;
use crate::emulated::{Calibration, EmulationArgs, Spread, chart};

/// The completion load balancing should reach, as a multiple of the ideal.
const TARGET: f64 = 1.15;

/// Flags of `ndpipe-bench balance`.
#[derive(Debug, Args)]
pub(crate) struct BalanceBench {
    #[command(flatten)]
    emulation: EmulationArgs,
    /// Emulated PipeStores; the last one is the slow one.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// How many times slower the slow node's model is.
    #[arg(long, default_value_t = 4.0)]
    slowdown: f64,
    /// Pipelined runs of the fine-tune.
    #[arg(long, default_value_t = 2)]
    runs: u32,
    /// Photos per chunk on the wire (the least work a node can give away).
    #[arg(long, default_value_t = 16)]
    chunk_size: u32,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Round {
    off_seconds: f64,
    on_seconds: f64,
    ideal_seconds: f64,
    /// Photos/s each node reached without balancing.
    node_rates: Vec<f64>,
    moved: usize,
    moved_from_runs: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct Results {
    calibration: Calibration,
    slow_images_per_second: f64,
    photos: usize,
    rounds: Vec<Round>,
    off: Spread,
    on: Spread,
    ideal: Spread,
    on_over_ideal: Spread,
    off_over_ideal: Spread,
}

/// Runs `ndpipe-bench balance`.
pub(crate) async fn run(args: BalanceBench) -> Result<()> {
    ensure!(args.nodes >= 2, "--nodes must be at least 2");
    ensure!(args.slowdown >= 1.0, "--slowdown must be at least 1");
    let emu = &args.emulation;
    let all = emu.photos(args.nodes)?;
    let calibration = emu.calibrate(&all, args.nodes).await?;
    let fast = calibration.node_images_per_second;
    let mut rates = vec![fast; args.nodes];
    rates[args.nodes - 1] = fast / args.slowdown;
    let cluster = Cluster::start_with_rates(&all, &emu.model_dir, &rates).await?;
    let mut rounds = Vec::new();
    for round in 0..emu.rounds {
        let off = finetune(&cluster, &args, false, round).await?;
        let on = finetune(&cluster, &args, true, round).await?;
        rounds.push(measure(&off, &on));
    }
    cluster.stop().await?;
    let of = |f: fn(&Round) -> f64| Spread::of(&rounds.iter().map(f).collect::<Vec<_>>());
    let results = Results {
        slow_images_per_second: rates[args.nodes - 1],
        photos: all.len(),
        off: of(|r| r.off_seconds),
        on: of(|r| r.on_seconds),
        ideal: of(|r| r.ideal_seconds),
        on_over_ideal: of(|r| r.on_seconds / r.ideal_seconds),
        off_over_ideal: of(|r| r.off_seconds / r.ideal_seconds),
        rounds,
        calibration,
    };
    let table = table(&results, &args);
    println!("{table}");
    std::fs::create_dir_all(&emu.out).with_context(|| format!("creating {}", emu.out.display()))?;
    std::fs::write(emu.out.join("balance.md"), &table)?;
    plot(&results, &args)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One fine-tune that runs the backbone on every photo, balanced or not.
async fn finetune(
    cluster: &Cluster,
    args: &BalanceBench,
    load_balance: bool,
    round: usize,
) -> Result<FinetuneReport> {
    eprintln!(
        "  {} emulated PipeStores, one {}x slower, r = {}, load balancing {load_balance}, round {round}",
        cluster.len(),
        args.slowdown,
        args.runs
    );
    let req = FinetuneRequest {
        runs: args.runs,
        epochs: 2,
        batch: 128,
        use_stored_features: false,
        align: 8,
        chunk_size: args.chunk_size,
        deploy: false,
        load_balance,
        seed: round as u64,
        ..FinetuneRequest::default()
    };
    Ok(cluster.tuner().finetune(req).await?)
}

/// A round's figures from its job without balancing (`off`) and with (`on`).
fn measure(off: &FinetuneReport, on: &FinetuneReport) -> Round {
    let node_rates: Vec<f64> = off
        .nodes
        .iter()
        .map(|n| n.images as f64 / n.seconds.max(1e-9))
        .collect();
    let slowest = off.nodes.iter().map(|n| n.seconds).fold(0.0, f64::max);
    let start_up = (off.extract_seconds - slowest).max(0.0);
    let photos = (off.train_images + off.val_images) as f64;
    let mut runs: Vec<u32> = on.rebalanced.iter().flat_map(|m| m.runs.clone()).collect();
    runs.sort_unstable();
    runs.dedup();
    Round {
        off_seconds: off.extract_seconds,
        on_seconds: on.extract_seconds,
        ideal_seconds: start_up + photos / node_rates.iter().sum::<f64>().max(1e-9),
        node_rates,
        moved: on.rebalanced.iter().map(|m| m.photos).sum(),
        moved_from_runs: runs,
    }
}

fn table(r: &Results, args: &BalanceBench) -> String {
    let mut out = format!(
        "{} The last node's model is {}x slower ({:.1} images/s); r = {} runs, chunks of {}, \
         every photo through the backbone. Completion is the time until the last photo's \
         features reached the Tuner.\n\n",
        r.calibration.describe(&args.emulation),
        args.slowdown,
        r.slow_images_per_second,
        args.runs,
        args.chunk_size
    );
    out.push_str("| round | LB off s | LB on s | proportional ideal s | on / ideal | off / ideal | photos moved | from runs | node rates (photos/s) |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for (i, round) in r.rounds.iter().enumerate() {
        let rates: Vec<String> = round.node_rates.iter().map(|v| format!("{v:.1}")).collect();
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {:?} | {} |\n",
            i + 1,
            round.off_seconds,
            round.on_seconds,
            round.ideal_seconds,
            round.on_seconds / round.ideal_seconds,
            round.off_seconds / round.ideal_seconds,
            round.moved,
            round.moved_from_runs,
            rates.join(", ")
        ));
    }
    out.push_str(&format!(
        "| mean (min..max) | {} | {} | {} | {:.2} ({:.2}..{:.2}) | {:.2} ({:.2}..{:.2}) | | | |\n",
        r.off,
        r.on,
        r.ideal,
        r.on_over_ideal.mean,
        r.on_over_ideal.min,
        r.on_over_ideal.max,
        r.off_over_ideal.mean,
        r.off_over_ideal.min,
        r.off_over_ideal.max
    ));
    let verdict = if r.on_over_ideal.max <= TARGET {
        "met in every round"
    } else if r.on_over_ideal.mean <= TARGET {
        "met on average, missed in some round"
    } else {
        "missed"
    };
    out.push_str(&format!(
        "\nTarget: load balancing within {TARGET:.2}x of the ideal: {verdict} (mean {:.2}x); \
         without it, {:.2}x.\n",
        r.on_over_ideal.mean, r.off_over_ideal.mean
    ));
    out
}

fn plot(r: &Results, args: &BalanceBench) -> Result<()> {
    let x: Vec<f64> = (1..=r.rounds.len()).map(|i| i as f64).collect();
    let series = |f: fn(&Round) -> f64| r.rounds.iter().map(f).collect::<Vec<_>>();
    chart(
        &args.emulation.out.join("balance.png"),
        &format!(
            "Load balancing, {} emulated nodes, one {}x slower",
            args.nodes, args.slowdown
        ),
        "round",
        "completion, s",
        &x,
        vec![
            ("LB off".into(), series(|r| r.off_seconds)),
            ("LB on".into(), series(|r| r.on_seconds)),
            ("proportional ideal".into(), series(|r| r.ideal_seconds)),
        ],
    )
}
