//! One comparison end to end: a PipeStore process with Fashion-MNIST, the
//! remote-storage model, and a training run per policy and cache size.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use spidercache::{AdaptiveSplit, PolicyKind, SpiderConfig, SplitPolicy, TrainingSpec};

use crate::data::{Dataset, PipeStore};
use crate::error::{BenchError, Result};
use crate::model::{EMBEDDING_DIM, ModelConfig};
use crate::replay::TraceWriter;
use crate::storage::{RemoteStore, StorageModel};
use crate::train::{RunResult, TrainSetup, train_policy};

/// A policy under its table label.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    /// Label in tables, plots and JSON.
    pub label: String,
    /// What to build.
    pub kind: PolicyKind,
}

/// Every policy with its defaults, plus SpiderCache with its homophily cache
/// on (the adaptive split; the default split gives it no space).
pub fn policy_specs() -> Vec<PolicySpec> {
    let mut specs: Vec<PolicySpec> = PolicyKind::all_defaults()
        .into_iter()
        .map(|kind| PolicySpec {
            label: label_of(&kind).to_owned(),
            kind,
        })
        .collect();
    specs.push(PolicySpec {
        label: "spidercache+homophily".into(),
        kind: PolicyKind::Spider(SpiderConfig {
            split: SplitPolicy::Adaptive(AdaptiveSplit::default()),
            ..SpiderConfig::default()
        }),
    });
    specs
}

fn label_of(kind: &PolicyKind) -> &'static str {
    match kind {
        PolicyKind::NoCache => "nocache",
        PolicyKind::Lru => "lru",
        PolicyKind::Lfu => "lfu",
        PolicyKind::Static => "static",
        PolicyKind::Shade(_) => "shade",
        PolicyKind::ICache(_) => "icache",
        PolicyKind::Quiver(_) => "quiver",
        PolicyKind::Spider(_) => "spidercache",
    }
}

/// Whether a policy changes which samples are trained when (importance
/// sampling, selective epochs, substitution with other samples' labels).
pub fn steers_sampling(kind: &PolicyKind) -> bool {
    matches!(
        kind,
        PolicyKind::Shade(_)
            | PolicyKind::ICache(_)
            | PolicyKind::Quiver(_)
            | PolicyKind::Spider(_)
    )
}

/// Everything a benchmark run is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// The `ndpipe` binary that serves and imports.
    pub ndpipe_bin: PathBuf,
    /// Training photos.
    pub train: usize,
    /// Test photos.
    pub test: usize,
    /// Epoch budget, the same for every policy.
    pub epochs: u32,
    /// Minibatch size.
    pub batch_size: usize,
    /// Cache sizes as fractions of the training set (items and bytes).
    pub cache_fractions: Vec<f64>,
    /// The remote-storage model.
    pub storage: StorageModel,
    /// Model initialisation and optimiser.
    pub model: ModelConfig,
    /// Seed of every policy's sampler.
    pub seed: u64,
    /// Validation accuracy whose first crossing is timed.
    pub target_accuracy: f64,
    /// Rescale every reported embedding to this L2 norm, so SpiderCache's
    /// fixed similarity radius (squared distance 2.02) becomes a cosine
    /// threshold (`1 - cos <= 1.01 / norm^2`). `None` reports the raw
    /// activations, as the artifact does.
    pub embedding_norm: Option<f32>,
    /// Run only the policies with these labels (all when empty).
    pub policies: Vec<String>,
    /// Where results, plots and the trace go.
    pub out_dir: PathBuf,
    /// Show progress bars.
    pub progress: bool,
}

impl BenchConfig {
    /// The full comparison: 4000 training photos, 6 epochs, caches of 10%
    /// and 20%, 1 ms per miss and an 8 MiB/s link (about 15 minutes on
    /// two cores).
    pub fn full() -> Self {
        Self {
            ndpipe_bin: PathBuf::new(),
            train: 4000,
            test: 1000,
            epochs: 6,
            batch_size: 128,
            cache_fractions: vec![0.1, 0.2],
            storage: StorageModel {
                latency: Duration::from_millis(1),
                bandwidth: Some(8 << 20),
            },
            model: ModelConfig {
                lr: 1e-3,
                weight_decay: 1e-4,
                seed: 42,
            },
            seed: 7,
            target_accuracy: 0.8,
            embedding_norm: None,
            policies: Vec::new(),
            out_dir: PathBuf::from("cachebench-out"),
            progress: true,
        }
    }

    /// The smoke test: 1000 training photos, 3 epochs, a 10% cache.
    pub fn quick() -> Self {
        Self {
            train: 1000,
            test: 250,
            epochs: 3,
            batch_size: 64,
            cache_fractions: vec![0.1],
            target_accuracy: 0.7,
            ..Self::full()
        }
    }
}

/// Everything a benchmark run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// The configuration it ran with.
    pub config: BenchConfig,
    /// Class names of the dataset.
    pub classes: Vec<String>,
    /// Seconds spent starting the PipeStore and importing the photos.
    pub setup_s: f64,
    /// Seconds the whole benchmark took.
    pub wall_s: f64,
    /// Mean seconds of one storage read on the request path (loopback HTTP
    /// plus the injected latency and bandwidth), for comparison with a hit.
    pub mean_miss_s: f64,
    /// One run per policy and cache size (no-cache once, at size 0).
    pub runs: Vec<RunResult>,
}

/// Runs the comparison `config` describes, writes `results.json`,
/// `results.md`, the plots and `trace.bin` (the no-cache run, for
/// `cachebench replay`) into `config.out_dir`, and returns the results.
pub fn run(config: &BenchConfig) -> Result<BenchResults> {
    let started = Instant::now();
    let specs: Vec<PolicySpec> = policy_specs()
        .into_iter()
        .filter(|p| config.policies.is_empty() || config.policies.contains(&p.label))
        .collect();
    if specs.is_empty() {
        return Err(BenchError::Dataset(format!(
            "no policy matches {:?}",
            config.policies
        )));
    }
    std::fs::create_dir_all(&config.out_dir)?;
    let say = |msg: String| {
        if config.progress {
            eprintln!("{msg}");
        }
    };
    say(format!(
        "starting {} and importing {} + {} Fashion-MNIST photos",
        config.ndpipe_bin.display(),
        config.train,
        config.test
    ));
    let mut pipestore = PipeStore::start(&config.ndpipe_bin)?;
    pipestore.import_fashion_mnist(config.train, config.test)?;
    let client = pipestore.client();
    let dataset = Arc::new(Dataset::load(&client, config.train, config.test)?);
    let (test_pixels, test_labels) = dataset.fetch_test(&client)?;
    let setup_s = started.elapsed().as_secs_f64();
    say(format!("setup took {setup_s:.1} s"));

    let store = Arc::new(RemoteStore::new(client, dataset.clone(), config.storage));
    let spec = TrainingSpec {
        num_samples: dataset.train.len(),
        batch_size: config.batch_size,
        seed: config.seed,
    };
    let setup = TrainSetup {
        dataset: &dataset,
        store: &store,
        test_pixels: &test_pixels,
        test_labels: &test_labels,
        model: config.model,
        spec,
        epochs: config.epochs,
        target_accuracy: config.target_accuracy,
        embedding_norm: config.embedding_norm,
    };
    let plan: Vec<(&PolicySpec, f64)> = specs
        .iter()
        .flat_map(|p| match p.kind {
            PolicyKind::NoCache => vec![(p, 0.0)],
            _ => config.cache_fractions.iter().map(|&f| (p, f)).collect(),
        })
        .collect();
    let bar = if config.progress {
        ProgressBar::new(plan.len() as u64 * u64::from(config.epochs))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "[{elapsed_precise}] {bar:30} {pos}/{len} epochs, eta {eta} {msg}",
        )
        .expect("the template is valid"),
    );
    let sizes: Vec<u32> = dataset.train.iter().map(|i| i.bytes as u32).collect();
    let labels: Vec<_> = dataset.train.iter().map(|i| i.label).collect();
    let mut trace = Some(TraceWriter::create(
        &config.out_dir.join("trace.bin"),
        spec,
        EMBEDDING_DIM,
        &sizes,
        &labels,
    )?);
    let mut runs = Vec::new();
    for (policy, fraction) in plan {
        // The first run (no-cache, uniform sampling, when selected) is the trace.
        let run = train_policy(
            &setup,
            &policy.label,
            policy.kind.clone(),
            fraction,
            trace.as_mut(),
            &bar,
        );
        // A dead store explains a failed run better than its last request.
        pipestore.check_alive()?;
        let run = run?;
        trace = None;
        if config.progress {
            // println on a hidden (non-terminal) bar prints nothing.
            if bar.is_hidden() {
                eprintln!("{}", crate::report::run_line(&run));
            } else {
                bar.println(crate::report::run_line(&run));
            }
        }
        runs.push(run);
        // Keep what is done so far, in case a later run fails.
        let partial = serde_json::to_string_pretty(&runs)?;
        std::fs::write(config.out_dir.join("runs-partial.json"), partial)?;
    }
    bar.finish_and_clear();
    let (reads, _, read_time) = store.trainer.snapshot();
    let results = BenchResults {
        config: config.clone(),
        classes: dataset.classes.clone(),
        setup_s,
        wall_s: started.elapsed().as_secs_f64(),
        mean_miss_s: read_time.as_secs_f64() / reads.max(1) as f64,
        runs,
    };
    crate::report::write_all(&results, &config.out_dir)?;
    Ok(results)
}
