//! `ndpipe-bench faults`: the fault-injection run, its table, and its figures as JSON.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{FaultConfig, FaultReport, Outcome};

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
