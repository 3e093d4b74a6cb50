//! `ndpipe-bench cache run` trains through every cache policy against a real PipeStore;
//! `ndpipe-bench cache replay` replays a recorded run's trace through every policy for hit
//! ratios alone; `ndpipe-bench cache report` writes a run's report and plots again.

use std::path::PathBuf;
use std::time::Duration;

use crate::bench::{self, BenchConfig};
use crate::model::ModelKind;
use crate::replay::{Trace, replay};
use crate::report;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};

/// Flags of `ndpipe-bench cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train once per policy, cache size and seed, reading a PipeStore through the cache.
    Run(Box<RunArgs>),
    /// Replay a recorded trace through every policy (hit ratios only, no training).
    Replay(ReplayArgs),
    /// Write the report and plots again from a run's results.json (no training).
    Report(ReportArgs),
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// The results.json a run wrote.
    #[arg(long, default_value = ".cache/bench-cache/results.json")]
    results: PathBuf,
    /// Where results.md and the PNG plots go (next to the results by default).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Time the MLP to this accuracy instead of the run's target.
    #[arg(long)]
    target_accuracy: Option<f64>,
    /// Time the CNN to this accuracy instead of the run's target.
    #[arg(long)]
    cnn_target_accuracy: Option<f64>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Reduced (1000 photos, 3 epochs, 10% cache, three seeds, both models): a few minutes.
    #[arg(long)]
    quick: bool,
    /// Networks to train through every policy, comma-separated: mlp (784-256-128-10) and cnn
    /// (two 3x3 convolutions, a 64-wide embedding). Default: both.
    #[arg(long, value_delimiter = ',')]
    models: Vec<ModelKind>,
    /// Runs trained at the same time, each on its own link to the PipeStore (default 3; 1 runs
    /// them one after another, for undisturbed epoch times).
    #[arg(long)]
    jobs: Option<usize>,
    /// The ndpipe binary to serve and import with (default: this one).
    #[arg(long, env = "NDPIPE_BIN")]
    ndpipe_bin: Option<PathBuf>,
    /// Training photos.
    #[arg(long)]
    train: Option<usize>,
    /// Test photos.
    #[arg(long)]
    test: Option<usize>,
    /// Epoch budget.
    #[arg(long)]
    epochs: Option<u32>,
    /// Minibatch size.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Cache sizes in percent of the training set, comma-separated.
    #[arg(long, value_delimiter = ',')]
    cache_sizes: Vec<f64>,
    /// Latency injected per miss, in milliseconds.
    #[arg(long)]
    latency_ms: Option<f64>,
    /// Bandwidth cap of the remote storage in MiB/s (0: none).
    #[arg(long)]
    bandwidth_mib: Option<f64>,
    /// Seed of every policy's sampler in the first repetition.
    #[arg(long)]
    seed: Option<u64>,
    /// Repetitions, each with the policy and model seeds one higher.
    #[arg(long)]
    seeds: Option<usize>,
    /// The MLP's validation accuracy whose first crossing is timed (default 0.8; quick 0.7).
    #[arg(long)]
    target_accuracy: Option<f64>,
    /// The CNN's validation accuracy whose first crossing is timed (default 0.75; quick 0.6).
    #[arg(long)]
    cnn_target_accuracy: Option<f64>,
    /// Rescale reported embeddings to this L2 norm (SpiderCache's radius
    /// then becomes a cosine threshold); raw activations when absent.
    #[arg(long)]
    embedding_norm: Option<f32>,
    /// SpiderCache's radius: this quantile of nearest-neighbour distances (default 0.5).
    #[arg(long)]
    radius_quantile: Option<f64>,
    /// SpiderCache's radius: this multiple of the quantile (default 2).
    #[arg(long)]
    radius_scale: Option<f64>,
    /// Neighbours one homophily representative stands in for at most (default 10).
    #[arg(long)]
    max_neighbours: Option<usize>,
    /// Fix spidercache+homophily's importance share (0..=1) instead of measuring it.
    #[arg(long)]
    importance_share: Option<f64>,
    /// Ceiling of the measured split's importance share (default 0.95).
    #[arg(long)]
    max_importance_share: Option<f64>,
    /// Homophily representatives promoted per scoring round at most (default 8).
    #[arg(long)]
    promotions_per_round: Option<usize>,
    /// Expected requests per epoch a promotion must newly cover, and by which a replacement must
    /// beat the representative it evicts (default 1: the read it costs).
    #[arg(long)]
    min_gain: Option<f64>,
    /// SpiderCache's neighbours fetched per query (default 500, as the artifact).
    #[arg(long)]
    k: Option<usize>,
    /// SpiderCache scores every this-many reported batches (default 2, as the artifact).
    #[arg(long)]
    scoring_interval: Option<usize>,
    /// iCache's warm-up epochs (default: its artifact's 5 of 90 scaled to the budget, at least 1).
    #[arg(long)]
    icache_warm_up: Option<u32>,
    /// iCache's beta: a sample is kept with probability percentile(loss)^beta (default 0.33).
    #[arg(long)]
    icache_beta: Option<f64>,
    /// Times SHADE's and SpiderCache's samplers repeat a cached draw (default 3.0).
    #[arg(long)]
    rep_factor: Option<f64>,
    /// Only these policies (labels as in the table), comma-separated.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Folder for results.json, results.md, the PNG plots and trace.bin.
    #[arg(long, default_value = ".cache/bench-cache")]
    out: PathBuf,
    /// Also write the per-policy summaries (means and spreads over seeds) to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Hide progress output.
    #[arg(long)]
    no_progress: bool,
}

impl RunArgs {
    fn config(self) -> BenchConfig {
        let mut c = if self.quick {
            BenchConfig::quick()
        } else {
            BenchConfig::full()
        };
        c.ndpipe_bin = self.ndpipe_bin.unwrap_or_default();
        c.train = self.train.unwrap_or(c.train);
        c.test = self.test.unwrap_or(c.test);
        c.epochs = self.epochs.unwrap_or(c.epochs);
        c.batch_size = self.batch_size.unwrap_or(c.batch_size);
        if !self.cache_sizes.is_empty() {
            c.cache_fractions = self.cache_sizes.iter().map(|p| p / 100.0).collect();
        }
        if let Some(ms) = self.latency_ms {
            c.storage.latency = Duration::from_secs_f64(ms.max(0.0) / 1e3);
        }
        if let Some(mib) = self.bandwidth_mib {
            c.storage.bandwidth = (mib > 0.0).then_some((mib * 1048576.0) as u64);
        }
        if !self.models.is_empty() {
            c.models = self.models;
        }
        c.jobs = self.jobs.unwrap_or(c.jobs).max(1);
        c.seed = self.seed.unwrap_or(c.seed);
        c.seeds = self.seeds.unwrap_or(c.seeds);
        c.target_accuracy = self.target_accuracy.unwrap_or(c.target_accuracy);
        c.cnn_target_accuracy = self.cnn_target_accuracy.unwrap_or(c.cnn_target_accuracy);
        c.embedding_norm = self.embedding_norm.or(c.embedding_norm);
        c.spider = crate::bench::SpiderKnobs {
            radius_quantile: self.radius_quantile,
            radius_scale: self.radius_scale,
            max_neighbours: self.max_neighbours,
            importance_share: self.importance_share,
            max_importance_share: self.max_importance_share,
            promotions_per_round: self.promotions_per_round,
            min_gain: self.min_gain,
            k: self.k,
            scoring_interval: self.scoring_interval,
        };
        c.peers = crate::bench::PeerKnobs {
            icache_warm_up: self.icache_warm_up,
            icache_beta: self.icache_beta,
            rep_factor: self.rep_factor,
        };
        c.policies = self.policies;
        c.out_dir = self.out;
        c.json = self.json;
        c.progress = !self.no_progress;
        c
    }
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The trace `cachebench run` recorded.
    #[arg(long, default_value = ".cache/bench-cache/trace.bin")]
    trace: PathBuf,
    /// Cache sizes in percent of the dataset, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [10.0, 20.0])]
    cache_sizes: Vec<f64>,
    /// Only these policies, comma-separated.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Where replay.json and replay.md go (next to the trace by default).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `ndpipe-bench cache`; `ndpipe_binary` serves the PipeStore unless `--ndpipe-bin` says
/// otherwise.
pub fn run(args: CacheArgs, ndpipe_binary: PathBuf) -> Result<()> {
    match args.command {
        Command::Run(args) => {
            let mut config = args.config();
            if config.ndpipe_bin.as_os_str().is_empty() {
                config.ndpipe_bin = ndpipe_binary;
            }
            let results = bench::run(&config).context("benchmark failed")?;
            println!("{}", report::markdown(&results));
            println!(
                "results, plots (PNG) and trace.bin written to {}",
                config.out_dir.display()
            );
        }
        Command::Report(args) => {
            let bytes = std::fs::read(&args.results)
                .with_context(|| format!("reading {}", args.results.display()))?;
            let mut results: bench::BenchResults = serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing {}", args.results.display()))?;
            let c = &mut results.config;
            c.target_accuracy = args.target_accuracy.unwrap_or(c.target_accuracy);
            c.cnn_target_accuracy = args.cnn_target_accuracy.unwrap_or(c.cnn_target_accuracy);
            let c = results.config.clone();
            results.summaries =
                crate::summary::summarize(&results.runs, |m| c.target_for(m), results.mean_miss_s);
            let dir = args.out.unwrap_or_else(|| {
                args.results
                    .parent()
                    .map_or_else(PathBuf::new, PathBuf::from)
            });
            std::fs::create_dir_all(&dir)?;
            report::write_all(&results, &dir)?;
            println!("{}", report::markdown(&results));
        }
        Command::Replay(args) => {
            let trace = Trace::read(&args.trace)
                .with_context(|| format!("reading {}", args.trace.display()))?;
            let mut results = Vec::new();
            for policy in bench::policy_specs(trace.epochs.len() as u32)
                .into_iter()
                .filter(|p| args.policies.is_empty() || args.policies.contains(&p.label))
            {
                for &size in &args.cache_sizes {
                    results.push(
                        replay(&trace, &policy, size / 100.0)
                            .with_context(|| format!("replaying {}", policy.label))?,
                    );
                }
            }
            let md = report::replay_markdown(&results);
            println!(
                "Replay of {} ({} samples, {} epochs):\n\n{md}",
                args.trace.display(),
                trace.spec.num_samples,
                trace.epochs.len()
            );
            let dir = args
                .out
                .unwrap_or_else(|| args.trace.parent().map_or_else(PathBuf::new, PathBuf::from));
            std::fs::write(dir.join("replay.md"), md)?;
            std::fs::write(
                dir.join("replay.json"),
                serde_json::to_string_pretty(&results)?,
            )?;
        }
    }
    Ok(())
}
