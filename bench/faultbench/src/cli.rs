//! `ndpipe-bench faults` (cluster rounds) and `ndpipe-bench crash` (crash loops): their tables,
//! and their figures as JSON.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{CrashConfig, CrashMode, CrashModel, CrashReport, FaultConfig, FaultReport, Outcome};

/// Flags of `ndpipe-bench faults`.
#[derive(Debug, Clone, Args)]
pub struct FaultArgs {
    /// Rounds: one job and one fault each.
    #[arg(long, default_value_t = 100)]
    pub rounds: usize,
    /// Seed of the faults, targets and moments.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// PipeStores in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Fashion-MNIST photos per PipeStore.
    #[arg(long, default_value_t = 70)]
    pub photos_per_node: usize,
    /// The Tuner's node timeout (ms): a silent node fails the job after it.
    #[arg(long, default_value_t = 3000)]
    pub node_timeout_ms: u64,
    /// The PipeStores' lease (ms).
    #[arg(long, default_value_t = 3000)]
    pub node_lease_ms: u64,
    /// The latest moment of a fault after the job starts (ms).
    #[arg(long, default_value_t = 2000)]
    pub max_fault_delay_ms: u64,
    /// Each node's extraction rate in a fine-tune (photos/s), so faults land inside the job.
    #[arg(long, default_value_t = 40.0)]
    pub throttle: f64,
    /// A postgres:// catalog for the whole cluster (default: SQLite per process).
    #[arg(long)]
    pub catalog: Option<String>,
    /// The model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder.
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    pub fashion_mnist_dir: PathBuf,
    /// Where the processes keep their data and logs (default: a temporary folder).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl FaultArgs {
    fn config(&self) -> FaultConfig {
        FaultConfig {
            rounds: self.rounds,
            seed: self.seed,
            nodes: self.nodes,
            photos_per_node: self.photos_per_node,
            node_timeout_ms: self.node_timeout_ms,
            node_lease_ms: self.node_lease_ms,
            max_fault_delay_ms: self.max_fault_delay_ms,
            throttle_images_per_second: self.throttle,
            catalog: self.catalog.clone(),
            model_dir: self.model_dir.clone(),
            fashion_mnist_dir: self.fashion_mnist_dir.clone(),
        }
    }
}

/// Runs the rounds against a cluster of `ndpipe` (the binary), prints the table, writes the
/// JSON; fails when a count with a target of 0 is not 0.
pub fn run(args: FaultArgs, ndpipe: PathBuf) -> Result<()> {
    let tmp = tempfile::tempdir().context("making a work folder")?;
    let dir = args.work_dir.clone().unwrap_or_else(|| tmp.path().into());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bar = ProgressBar::new(args.rounds as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} rounds {msg} [{elapsed}]")
            .context("progress style")?,
    );
    let report = crate::run(&args.config(), &ndpipe, &dir, |round| {
        bar.set_message(format!("{:?} {}", round.fault, round.target));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    print_table(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.clean() {
        bail!("fault injection found hangs, split versions or unresolved jobs (see the table)");
    }
    Ok(())
}

fn print_table(report: &FaultReport) {
    println!(
        "round  job                               fault    target  at ms  hold ms  in job  outcome"
    );
    for r in &report.rounds {
        let outcome = match &r.outcome {
            Outcome::Done => "done".to_string(),
            Outcome::Failed(m) => format!("failed: {}", m.chars().take(60).collect::<String>()),
            Outcome::Unresolved(m) => format!("UNRESOLVED: {m}"),
            Outcome::Hang => "HANG".to_string(),
        };
        let versions = if r.one_version {
            String::new()
        } else {
            format!("  SPLIT VERSIONS {:?}", r.versions)
        };
        println!(
            "{:>5}  {:<32}  {:<7}  {:<6}  {:>5}  {:>7}  {:<6}  {outcome}{versions}",
            r.round,
            r.job.chars().take(32).collect::<String>(),
            format!("{:?}", r.fault),
            r.target,
            r.at_ms,
            r.hold_ms,
            if r.during_job { "yes" } else { "no" }
        );
    }
    println!();
    println!("| count | rounds | target |");
    println!("|---|---|---|");
    println!("| faults while the job ran | {} | |", report.during_job);
    println!("| jobs done | {} | |", report.done);
    println!("| jobs failed with a message | {} | |", report.failed);
    println!("| hangs | {} | 0 |", report.hangs);
    println!(
        "| rounds ending on split versions | {} | 0 |",
        report.split_versions
    );
    println!(
        "| jobs neither done nor failed with a message | {} | 0 |",
        report.unresolved
    );
}

/// Flags of `ndpipe-bench crash`.
#[derive(Debug, Clone, Args)]
pub struct CrashArgs {
    /// Kill-and-restart cycles.
    #[arg(long, default_value_t = 100)]
    pub cycles: usize,
    /// Seed of the photos and the moments.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Concurrent uploaders.
    #[arg(long, default_value_t = 4)]
    pub uploaders: usize,
    /// The latest moment of the kill after the writes start (ms).
    #[arg(long, default_value_t = 1500)]
    pub max_kill_ms: u64,
    /// What runs during the kill: uploads; uploads with deletes and compactions; uploads with
    /// re-labelling jobs; uploads with fine-tunes that deploy (these two with the model); or
    /// uploads through three PipeStores with two copies of each photo, one killed per cycle.
    #[arg(long, value_enum, default_value_t = CrashMode::Compaction)]
    pub mode: CrashMode,
    /// The postgres:// catalog of mode replicated (default from `ndpipe-bench`: a throw-away
    /// database of the test server).
    #[arg(long)]
    pub catalog: Option<String>,
    /// The model folder (modes relabel, finetune and replicated).
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    pub model_dir: PathBuf,
    /// The Fashion-MNIST folder (modes relabel and finetune).
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    pub fashion_mnist_dir: PathBuf,
    /// Fashion-MNIST photos imported before the first cycle (modes relabel and finetune).
    #[arg(long, default_value_t = 300)]
    pub training_photos: usize,
    /// Where the store keeps its data and log (default: a temporary folder).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the crash loop against `ndpipe serve` (the binary), prints the table, writes the JSON;
/// fails when an acknowledged write was lost.
pub fn run_crash(args: CrashArgs, ndpipe: PathBuf) -> Result<()> {
    let tmp = tempfile::tempdir().context("making a work folder")?;
    let dir = args.work_dir.clone().unwrap_or_else(|| tmp.path().into());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let config = CrashConfig {
        cycles: args.cycles,
        seed: args.seed,
        uploaders: args.uploaders,
        max_kill_ms: args.max_kill_ms,
        mode: args.mode,
        model: Some(CrashModel {
            model_dir: args.model_dir.clone(),
            fashion_mnist_dir: args.fashion_mnist_dir.clone(),
            photos: args.training_photos,
        }),
        catalog: args.catalog.clone(),
    };
    let bar = ProgressBar::new(args.cycles as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} cycles {msg} [{elapsed}]")
            .context("progress style")?,
    );
    let report = crate::crash(&config, &ndpipe, &dir, |cycle| {
        bar.set_message(format!("{} acknowledged", cycle.acknowledged));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    print_crash_table(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report.lost > 0
        || report.resurrected > 0
        || report.unlabelled > 0
        || report.short_of_copies > 0
    {
        bail!("acknowledged writes were lost: {:?}", report.problems);
    }
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn print_crash_table(report: &CrashReport) {
    let mut restarts: Vec<u64> = report.cycles.iter().map(|c| c.restart_ms).collect();
    restarts.sort_unstable();
    println!("| count | value | target |");
    println!("|---|---|---|");
    println!("| cycles (kill -9, restart) | {} | |", report.cycles.len());
    println!(
        "| of those, killed while a job ran | {} | |",
        report.kills_during_job
    );
    println!("| uploads acknowledged | {} | |", report.acknowledged);
    println!("| of those, lost or changed | {} | 0 |", report.lost);
    println!("| deletes acknowledged | {} | |", report.deleted);
    println!(
        "| of those, back after a restart | {} | 0 |",
        report.resurrected
    );
    println!(
        "| acknowledged photos without labels (with a model) | {} | 0 |",
        report.unlabelled
    );
    println!(
        "| acknowledged photos short of two copies (mode replicated) | {} | 0 |",
        report.short_of_copies
    );
    if report.uploads_answered > 0 {
        let share = 100.0 * report.uploads_refused as f64 / report.uploads_answered as f64;
        println!(
            "| uploads answered, of those refused (mode replicated) | {}, {} ({share:.2}%) | < 1% |",
            report.uploads_answered, report.uploads_refused
        );
    }
    println!(
        "| restart to /healthz, p50 ms | {} | |",
        percentile(&restarts, 0.5)
    );
    println!(
        "| restart to /healthz, p99 ms | {} | |",
        percentile(&restarts, 0.99)
    );
    for r in &report.refusals {
        println!("refused: {r}");
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
}
