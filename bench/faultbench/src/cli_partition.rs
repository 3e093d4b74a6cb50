//! `ndpipe-bench partition`: partition rounds (and rolling upgrades) on a cluster in network
//! namespaces, a table per round kind with totals, the requests against their deadlines, and
//! the figures as JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{CUTS, Deadlines, PartitionConfig, PartitionReport, PartitionRound, RoundKind};

/// Flags of `ndpipe-bench partition`.
#[derive(Debug, Clone, Args)]
pub struct PartitionArgs {
    /// Rounds: requests, a job and one cut (or rolling upgrade) each.
    #[arg(long, default_value_t = 100)]
    pub rounds: usize,
    /// Seed of the kinds, targets, moments and photos.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The round kinds drawn from (default: the four cuts).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kinds: Vec<RoundKind>,
    /// The shortest cut (ms).
    #[arg(long, default_value_t = 1000)]
    pub min_hold_ms: u64,
    /// The longest cut (ms).
    #[arg(long, default_value_t = 8000)]
    pub max_hold_ms: u64,
    /// The latest moment of a cut after the job starts (ms).
    #[arg(long, default_value_t = 2000)]
    pub max_cut_delay_ms: u64,
    /// Threads sending uploads, reads and deletes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Fashion-MNIST photos per PipeStore, for the fine-tunes.
    #[arg(long, default_value_t = 60)]
    pub photos_per_node: usize,
    /// The PipeStores' catalog_timeout_ms.
    #[arg(long, default_value_t = 3000)]
    pub catalog_timeout_ms: u64,
    /// The PipeStores' catalog_checkout_ms.
    #[arg(long, default_value_t = 2000)]
    pub catalog_checkout_ms: u64,
    /// The PipeStores' peer_timeout_ms.
    #[arg(long, default_value_t = 5000)]
    pub peer_timeout_ms: u64,
    /// The PipeStores' copy_timeout_ms.
    #[arg(long, default_value_t = 3000)]
    pub copy_timeout_ms: u64,
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

impl PartitionArgs {
    fn config(&self) -> PartitionConfig {
        PartitionConfig {
            rounds: self.rounds,
            seed: self.seed,
            kinds: if self.kinds.is_empty() {
                CUTS.to_vec()
            } else {
                self.kinds.clone()
            },
            hold_ms: (self.min_hold_ms, self.max_hold_ms),
            max_cut_delay_ms: self.max_cut_delay_ms,
            workers: self.workers,
            photos_per_node: self.photos_per_node,
            deadlines: Deadlines {
                catalog_timeout_ms: self.catalog_timeout_ms,
                catalog_checkout_ms: self.catalog_checkout_ms,
                peer_timeout_ms: self.peer_timeout_ms,
                copy_timeout_ms: self.copy_timeout_ms,
            },
            model_dir: self.model_dir.clone(),
            fashion_mnist_dir: self.fashion_mnist_dir.clone(),
        }
    }
}

/// Runs the rounds against a cluster of `ndpipe` (the binary), prints the tables, writes the
/// JSON; fails when a count with a target of 0 is not 0.
pub fn run(args: PartitionArgs, ndpipe: PathBuf) -> Result<()> {
    if let Some(why) = crate::namespaces_unavailable() {
        bail!("partition rounds need network namespaces: {why}");
    }
    let tmp = tempfile::tempdir().context("making a work folder")?;
    let dir = args.work_dir.clone().unwrap_or_else(|| tmp.path().into());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bar = ProgressBar::new(args.rounds as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} rounds {msg} [{elapsed}]")
            .context("progress style")?,
    );
    let report = crate::partition(&args.config(), &ndpipe, &dir, |round| {
        // On standard error even without a terminal, so that a long run shows its rounds.
        bar.suspend(|| eprintln!("{}", round_line(round)));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    print_tables(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.clean() || report.late() > 0 {
        bail!("partition rounds found losses, splits, hangs or late requests (see the tables)");
    }
    Ok(())
}

fn round_line(r: &PartitionRound) -> String {
    let mut problems = r.problems.join("; ");
    if !r.one_version {
        problems.push_str(&format!(" SPLIT VERSIONS {:?}", r.versions));
    }
    format!(
        "round {:>3}  {:<16} {:<28} hold {:>5} ms  {:<18} {:>3} up {:>3} del  {:?}  {problems}",
        r.round,
        format!("{:?}", r.kind),
        r.detail,
        r.hold_ms,
        r.job.chars().take(18).collect::<String>(),
        r.uploads_acked,
        r.deletes_acked,
        r.outcome,
    )
}

/// Counts of a set of rounds.
#[derive(Default)]
struct Tally {
    rounds: usize,
    uploads: usize,
    deletes: usize,
    lost: usize,
    resurrected: usize,
    short: usize,
    split: usize,
    job_hangs: usize,
    unresolved: usize,
    request_hangs: usize,
    late: usize,
    done: usize,
    failed: usize,
}

impl Tally {
    fn add(&mut self, r: &PartitionRound) {
        use crate::Outcome;
        self.rounds += 1;
        self.uploads += r.uploads_acked;
        self.deletes += r.deletes_acked;
        self.lost += r.lost;
        self.resurrected += r.resurrected;
        self.short += r.short_of_copies;
        self.split += usize::from(!r.one_version);
        self.job_hangs += usize::from(r.outcome == Outcome::Hang);
        self.unresolved += usize::from(matches!(r.outcome, Outcome::Unresolved(_)));
        self.done += usize::from(r.outcome == Outcome::Done);
        self.failed += usize::from(matches!(r.outcome, Outcome::Failed(_)));
        self.request_hangs += r.requests.values().map(|s| s.hangs).sum::<usize>();
        self.late += r.requests.values().map(|s| s.late).sum::<usize>();
    }

    fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.rounds,
            self.uploads,
            self.deletes,
            self.lost,
            self.resurrected,
            self.short,
            self.split,
            self.job_hangs,
            self.request_hangs,
            self.unresolved,
            self.late,
            format_args!("{} / {}", self.done, self.failed),
        )
    }
}

fn print_tables(report: &PartitionReport) {
    let mut by_kind: BTreeMap<RoundKind, Tally> = BTreeMap::new();
    let mut total = Tally::default();
    for r in &report.rounds {
        by_kind.entry(r.kind).or_default().add(r);
        total.add(r);
    }
    println!(
        "| round kind | rounds | uploads acked | deletes acked | lost | deletes back | short of 2 copies | split versions | job hangs | request hangs | jobs unresolved | requests past deadline | jobs done / failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (kind, tally) in &by_kind {
        println!("{}", tally.row(&format!("{kind:?}")));
    }
    println!("{}", total.row("**total**"));
    println!(
        "| target | | | | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | |\n\nat the end: {} acknowledged photos not deleted, {} of them not read back through every door (target 0)",
        report.present_at_end, report.lost_at_end
    );
    println!();
    println!(
        "| request | sent | 2xx | refused | no answer | hangs (30 s) | past deadline | max ms | deadline ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (kind, s) in report.requests() {
        println!(
            "| {kind} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.sent, s.ok, s.refused, s.unanswered, s.hangs, s.late, s.max_ms, s.deadline_ms
        );
    }
    for p in &report.problems_at_end {
        println!("problem at the end: {p}");
    }
    if let Some(why) = &report.aborted {
        println!("the run stopped early: {why}");
    }
}
