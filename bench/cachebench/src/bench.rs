//! One comparison end to end: a PipeStore process with Fashion-MNIST, the
//! remote-storage model, and a training run per policy and cache size.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use spidercache::{
    ICacheConfig, MeasuredSplit, PolicyKind, SpiderConfig, SplitPolicy, TrainingSpec,
};

use crate::data::{Dataset, PipeStore, PipeStoreClient};
use crate::error::{BenchError, Result};
pub use crate::knobs::{PeerKnobs, SpiderKnobs};
use crate::metrics::RunResult;
use crate::model::{ModelConfig, ModelKind};
use crate::replay::TraceWriter;
use crate::storage::{RemoteStore, StorageModel};
use crate::summary::{PolicySummary, summarize};
use crate::train::{TrainSetup, train_policy};

/// A policy under its table label.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    /// Label in tables, plots and JSON.
    pub label: String,
    /// What to build.
    pub kind: PolicyKind,
}

/// Every policy at its authors' recommended settings for an `epochs` budget,
/// plus two SpiderCache variants: with its homophily cache on (the split
/// set from the measured gain of each part) and with the artifact's
/// absolute radius.
///
/// iCache's warm-up is its artifact's 5 of 90 epochs scaled to the budget
/// (at least 1; beta is the artifact's 0.33); everything else is the
/// crate's defaults.
pub fn policy_specs(epochs: u32) -> Vec<PolicySpec> {
    let mut specs: Vec<PolicySpec> = PolicyKind::all_defaults()
        .into_iter()
        .map(|kind| match kind {
            PolicyKind::ICache(c) => PolicyKind::ICache(ICacheConfig {
                warm_up: (epochs * c.warm_up).div_ceil(90).max(1),
                ..c
            }),
            other => other,
        })
        .map(|kind| PolicySpec {
            label: label_of(&kind).to_owned(),
            kind,
        })
        .collect();
    specs.push(PolicySpec {
        label: "spidercache+homophily".into(),
        kind: PolicyKind::Spider(SpiderConfig {
            split: SplitPolicy::Measured(MeasuredSplit::default()),
            ..SpiderConfig::default()
        }),
    });
    specs.push(PolicySpec {
        label: "spidercache-artifact".into(),
        kind: PolicyKind::Spider(SpiderConfig::artifact()),
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
    /// The networks trained, each through every policy (MLP and CNN).
    #[serde(default = "only_the_mlp")]
    pub models: Vec<ModelKind>,
    /// Model initialisation and optimiser.
    pub model: ModelConfig,
    /// Runs trained at the same time, each on its own link to the PipeStore
    /// (the storage model's latency is a wait, not work, so runs overlap it;
    /// their compute shares the cores).
    #[serde(default = "one_job")]
    pub jobs: usize,
    /// Seed of every policy's sampler in the first repetition; repetition
    /// `i` adds `i` to it and to the model's seed.
    pub seed: u64,
    /// Repetitions with different seeds (3).
    pub seeds: usize,
    /// The MLP's validation accuracy whose first crossing is timed (see
    /// [`BenchConfig::target_for`]).
    pub target_accuracy: f64,
    /// The CNN's target accuracy (it learns slower in the same epochs);
    /// `target_accuracy` is the MLP's.
    #[serde(default = "cnn_target")]
    pub cnn_target_accuracy: f64,
    /// Rescale every reported embedding to this L2 norm, so SpiderCache's
    /// fixed similarity radius (squared distance 2.02) becomes a cosine
    /// threshold (`1 - cos <= 1.01 / norm^2`). `None` reports the raw
    /// activations, as the artifact does.
    pub embedding_norm: Option<f32>,
    /// Overrides of SpiderCache's settings.
    pub spider: SpiderKnobs,
    /// Overrides of the peers' settings.
    #[serde(default)]
    pub peers: PeerKnobs,
    /// Run only the policies with these labels (all when empty).
    pub policies: Vec<String>,
    /// Where results, plots and the trace go.
    pub out_dir: PathBuf,
    /// Also write the per-policy summaries (`--json`) here.
    pub json: Option<PathBuf>,
    /// Show progress bars.
    pub progress: bool,
}

/// What a configuration written before there were two models ran.
fn only_the_mlp() -> Vec<ModelKind> {
    vec![ModelKind::Mlp]
}

/// The CNN's default target accuracy in a full run.
fn cnn_target() -> f64 {
    0.75
}

/// What a configuration written before runs overlapped ran.
fn one_job() -> usize {
    1
}

impl BenchConfig {
    /// The validation accuracy whose first crossing is timed for `model`.
    pub fn target_for(&self, model: ModelKind) -> f64 {
        match model {
            ModelKind::Mlp => self.target_accuracy,
            ModelKind::Cnn => self.cnn_target_accuracy,
        }
    }

    /// The full comparison: 4000 training photos, 6 epochs, a 10% cache,
    /// 1 ms per miss and an 8 MiB/s link, three seeds, the MLP and the CNN,
    /// three runs at a time.
    pub fn full() -> Self {
        Self {
            ndpipe_bin: PathBuf::new(),
            train: 4000,
            test: 1000,
            epochs: 6,
            batch_size: 128,
            cache_fractions: vec![0.1],
            storage: StorageModel {
                latency: Duration::from_millis(1),
                bandwidth: Some(8 << 20),
            },
            models: vec![ModelKind::Mlp, ModelKind::Cnn],
            model: ModelConfig {
                lr: 1e-3,
                weight_decay: 1e-4,
                seed: 42,
            },
            jobs: 3,
            seed: 7,
            seeds: 3,
            target_accuracy: 0.8,
            cnn_target_accuracy: 0.75,
            embedding_norm: None,
            spider: SpiderKnobs::default(),
            peers: PeerKnobs::default(),
            policies: Vec::new(),
            out_dir: PathBuf::from("cachebench-out"),
            json: None,
            progress: true,
        }
    }

    /// The reduced comparison: 1000 training photos, 3 epochs, a 10% cache,
    /// three seeds, both models.
    pub fn quick() -> Self {
        Self {
            train: 1000,
            test: 250,
            epochs: 3,
            batch_size: 64,
            cache_fractions: vec![0.1],
            target_accuracy: 0.7,
            cnn_target_accuracy: 0.6,
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
    /// One run per policy, cache size and seed (no-cache at size 0).
    pub runs: Vec<RunResult>,
    /// The runs per policy and cache size over their seeds.
    pub summaries: Vec<PolicySummary>,
}

/// Runs the comparison `config` describes, writes `results.json`,
/// `results.md`, the PNG plots and `trace.bin` (the first no-cache run, for
/// `cachebench replay`) into `config.out_dir`, and `config.json` if set, and
/// returns the results.
pub fn run(config: &BenchConfig) -> Result<BenchResults> {
    let started = Instant::now();
    let specs: Vec<PolicySpec> = policy_specs(config.epochs)
        .into_iter()
        .filter(|p| config.policies.is_empty() || config.policies.contains(&p.label))
        .collect();
    if specs.is_empty() || config.seeds == 0 {
        return Err(BenchError::Dataset(format!(
            "nothing to run: policies {:?}, {} seeds",
            config.policies, config.seeds
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
    let pipestore = PipeStore::start(&config.ndpipe_bin)?;
    pipestore.import_fashion_mnist(config.train, config.test)?;
    let client = pipestore.client();
    let dataset = Arc::new(Dataset::load(&client, config.train, config.test)?);
    let (test_pixels, test_labels) = dataset.fetch_test(&client)?;
    let setup_s = started.elapsed().as_secs_f64();
    say(format!("setup took {setup_s:.1} s"));

    let specs = &specs;
    let plan: Vec<Planned<'_>> = config
        .models
        .iter()
        .flat_map(|&model| {
            (0..config.seeds as u64).flat_map(move |i| {
                specs.iter().flat_map(move |p| {
                    let sizes = match p.kind {
                        PolicyKind::NoCache => vec![0.0],
                        _ => config.cache_fractions.clone(),
                    };
                    sizes.into_iter().map(move |fraction| Planned {
                        model,
                        repetition: i,
                        policy: p,
                        fraction,
                    })
                })
            })
        })
        .collect();
    if plan.is_empty() {
        return Err(BenchError::Dataset("nothing to run: no model".into()));
    }
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
    let base_spec = TrainingSpec {
        num_samples: dataset.train.len(),
        batch_size: config.batch_size,
        seed: config.seed,
    };
    let sizes: Vec<u32> = dataset.train.iter().map(|i| i.bytes as u32).collect();
    let labels: Vec<_> = dataset.train.iter().map(|i| i.label).collect();
    // The first run (the first model, no-cache, uniform sampling, when selected) is the trace.
    let trace = Mutex::new(Some(TraceWriter::create(
        &config.out_dir.join("trace.bin"),
        base_spec,
        plan[0].model.embedding_dim(),
        &sizes,
        &labels,
    )?));
    let shared = Shared {
        config,
        dataset: &dataset,
        client: &client,
        test_pixels: &test_pixels,
        test_labels: &test_labels,
        base_spec,
        bar: &bar,
        trace: &trace,
    };
    let outcomes = run_plan(&shared, &plan, &Mutex::new(pipestore))?;
    let mut runs = Vec::new();
    let (mut reads, mut read_time) = (0u64, Duration::ZERO);
    for (run, (r, t)) in outcomes {
        reads += r;
        read_time += t;
        runs.push(run);
    }
    bar.finish_and_clear();
    let mean_miss_s = read_time.as_secs_f64() / reads.max(1) as f64;
    let results = BenchResults {
        config: config.clone(),
        classes: dataset.classes.clone(),
        setup_s,
        wall_s: started.elapsed().as_secs_f64(),
        mean_miss_s,
        summaries: summarize(&runs, |m| config.target_for(m), mean_miss_s),
        runs,
    };
    crate::report::write_all(&results, &config.out_dir)?;
    if let Some(path) = &config.json {
        std::fs::write(path, serde_json::to_string_pretty(&results.summaries)?)?;
    }
    Ok(results)
}

/// One run of the plan.
struct Planned<'a> {
    model: ModelKind,
    repetition: u64,
    policy: &'a PolicySpec,
    fraction: f64,
}

/// What every run of one benchmark shares.
struct Shared<'a> {
    config: &'a BenchConfig,
    dataset: &'a Arc<Dataset>,
    client: &'a PipeStoreClient,
    test_pixels: &'a [f32],
    test_labels: &'a [spidercache::Label],
    base_spec: TrainingSpec,
    bar: &'a ProgressBar,
    trace: &'a Mutex<Option<TraceWriter>>,
}

/// A finished run with its trainer's storage reads and their time.
type Outcome = (RunResult, (u64, Duration));

/// Runs `plan` on `config.jobs` threads, each run on its own
/// [`RemoteStore`] (so a run's counters are its own); returns the runs in
/// plan order. The first failure stops the workers at their next run.
fn run_plan(
    shared: &Shared<'_>,
    plan: &[Planned<'_>],
    pipestore: &Mutex<PipeStore>,
) -> Result<Vec<Outcome>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: Mutex<Vec<Option<Outcome>>> = Mutex::new((0..plan.len()).map(|_| None).collect());
    let first_error: Mutex<Option<BenchError>> = Mutex::new(None);
    let out_dir = &shared.config.out_dir;
    std::thread::scope(|scope| {
        for _ in 0..shared.config.jobs.clamp(1, plan.len()) {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    if at >= plan.len() || failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let outcome = run_one(shared, &plan[at], at == 0);
                    // A dead store explains a failed run better than its last request.
                    let outcome = pipestore.lock().check_alive().and(outcome);
                    let outcome = match outcome {
                        Ok(o) => o,
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().get_or_insert(e);
                            return;
                        }
                    };
                    let line = crate::report::run_line(&outcome.0);
                    if shared.config.progress {
                        // println on a hidden (non-terminal) bar prints nothing.
                        if shared.bar.is_hidden() {
                            eprintln!("{line}");
                        } else {
                            shared.bar.println(line);
                        }
                    }
                    let mut done = done.lock();
                    done[at] = Some(outcome);
                    // Keep what is done so far, in case a later run fails.
                    let partial: Vec<&RunResult> = done.iter().flatten().map(|o| &o.0).collect();
                    if let Ok(json) = serde_json::to_string_pretty(&partial) {
                        let _ = std::fs::write(out_dir.join("runs-partial.json"), json);
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    Ok(done.into_inner().into_iter().flatten().collect())
}

/// Trains one planned run on a link of its own; the first run of the plan
/// records the trace.
fn run_one(shared: &Shared<'_>, run: &Planned<'_>, first: bool) -> Result<Outcome> {
    let config = shared.config;
    let store = Arc::new(RemoteStore::new(
        shared.client.clone(),
        shared.dataset.clone(),
        config.storage,
    ));
    let i = run.repetition;
    let setup = TrainSetup {
        dataset: shared.dataset,
        store: &store,
        test_pixels: shared.test_pixels,
        test_labels: shared.test_labels,
        model_kind: run.model,
        model: ModelConfig {
            seed: config.model.seed + i,
            ..config.model
        },
        spec: TrainingSpec {
            seed: config.seed + i,
            ..shared.base_spec
        },
        epochs: config.epochs,
        target_accuracy: config.target_for(run.model),
        embedding_norm: config.embedding_norm,
    };
    let mut trace = if first {
        shared.trace.lock().take()
    } else {
        None
    };
    let result = train_policy(
        &setup,
        &run.policy.label,
        config
            .peers
            .apply(config.spider.apply(run.policy.kind.clone())),
        run.fraction,
        trace.as_mut(),
        shared.bar,
    )?;
    let (reads, _, time) = store.trainer.snapshot();
    Ok((result, (reads, time)))
}
