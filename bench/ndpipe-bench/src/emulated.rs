//! What the experiments on emulated PipeStores share.
//!
//! On one machine, N real PipeStores share the same cores, so more nodes measure core sharing,
//! not scaling. An emulated PipeStore is a real one whose model is capped (`model_rate_limit`)
//! at a per-node rate calibrated in the same run: the machine's own extraction rate (the
//! largest N of uncapped nodes at once) times a headroom, divided by that N, so that N capped
//! nodes together ask for less than the machine can do and behave like N machines of that rate.
//! Every figure from them is labelled "emulated" with that calibration.

use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use clap::Args;
use ndpipe::fashion_mnist;
use ndpipe_tuner::{FinetuneReport, FinetuneRequest, Mode};
use serde::Serialize;

use crate::cluster::{Cluster, Photo};

/// The emulation's flags, shared by the experiments.
#[derive(Debug, Args)]
pub(crate) struct EmulationArgs {
    /// Fashion-MNIST photos on each node (6:1 train:test).
    #[arg(long, default_value_t = 140)]
    pub(crate) photos_per_node: usize,
    /// Each node's model rate, images/s; 0: calibrate (the machine's rate x headroom / the
    /// largest node count).
    #[arg(long, default_value_t = 0.0)]
    node_rate: f64,
    /// Share of the machine's measured rate that the emulated nodes may ask for together.
    #[arg(long, default_value_t = 0.6)]
    headroom: f64,
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    pub(crate) model_dir: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// Folder for the tables and the plots.
    #[arg(long, default_value = "docs/experiments")]
    pub(crate) out: PathBuf,
}

/// Mean and range of repeated measurements.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Spread {
    pub(crate) mean: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Self {
        let n = values.len().max(1) as f64;
        Spread {
            mean: values.iter().sum::<f64>() / n,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ({:.1}..{:.1})", self.mean, self.min, self.max)
    }
}

/// The per-node rate and how it was found.
#[derive(Debug, Serialize)]
pub(crate) struct Calibration {
    machine_images_per_second: f64,
    /// Nodes uncapped at once when the machine's rate was measured.
    measured_with_nodes: usize,
    pub(crate) node_images_per_second: f64,
    headroom: f64,
}

impl Calibration {
    /// One sentence for a table's heading.
    pub(crate) fn describe(&self, args: &EmulationArgs) -> String {
        format!(
            "Emulated PipeStores: each model capped at {:.1} images/s = {:.0}% of this machine's \
             measured extraction rate ({:.1} images/s with {} uncapped nodes at once) / {} nodes. \
             {} photos per node, {} rounds each (mean, min..max).",
            self.node_images_per_second,
            100.0 * self.headroom,
            self.machine_images_per_second,
            self.measured_with_nodes,
            self.measured_with_nodes,
            args.photos_per_node,
            args.rounds
        )
    }
}

impl EmulationArgs {
    /// `photos_per_node` labelled Fashion-MNIST photos for each of `nodes` nodes, 6:1
    /// train:test.
    pub(crate) fn photos(&self, nodes: usize) -> Result<Vec<Photo>> {
        self.photos_in_all(self.photos_per_node * nodes)
    }

    /// `total` labelled Fashion-MNIST photos, 6:1 train:test.
    pub(crate) fn photos_in_all(&self, total: usize) -> Result<Vec<Photo>> {
        let dir = fashion_mnist::dir(self.fashion_mnist_dir.as_ref());
        let train = fashion_mnist::load(&dir, "train")?;
        let test = fashion_mnist::load(&dir, "test")?;
        let mut out = Vec::with_capacity(total);
        for i in 0..total {
            // Every seventh photo is a test photo; the others train.
            let (set, split, k) = if i % 7 == 6 {
                (&test, "test", i / 7)
            } else {
                (&train, "train", i)
            };
            ensure!(
                k < set.len(),
                "Fashion-MNIST has too few photos for {total}"
            );
            out.push((
                fashion_mnist::png(set.image(k))?,
                fashion_mnist::CLASSES[usize::from(set.labels[k])],
                split,
            ));
        }
        Ok(out)
    }

    /// The machine's extraction rate: `most` uncapped nodes over `all`'s first photos at once
    /// (what that many model sessions can do together here), and the per-node rate from it;
    /// or the rate given by `--node-rate`.
    pub(crate) async fn calibrate(&self, all: &[Photo], most: usize) -> Result<Calibration> {
        if self.node_rate > 0.0 {
            return Ok(Calibration {
                machine_images_per_second: f64::NAN,
                measured_with_nodes: most,
                node_images_per_second: self.node_rate,
                headroom: self.headroom,
            });
        }
        eprintln!("calibrating: {most} uncapped PipeStores, the backbone over their photos...");
        let photos = &all[..most * self.photos_per_node];
        let cluster = Cluster::start(most, photos, &self.model_dir).await?;
        let mut rates = Vec::new();
        for round in 0..self.rounds {
            let job = Job::backbone(Mode::NearData, round);
            rates.push(extraction_rate(&job.run(&cluster).await?));
        }
        cluster.stop().await?;
        let machine = Spread::of(&rates).mean;
        Ok(Calibration {
            machine_images_per_second: machine,
            measured_with_nodes: most,
            node_images_per_second: machine * self.headroom / most as f64,
            headroom: self.headroom,
        })
    }
}

/// One fine-tune of an experiment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub(crate) mode: Mode,
    /// The Tuner's ingress cap, bytes/s (0: none).
    pub(crate) ingress: f64,
    pub(crate) runs: u32,
    pub(crate) epochs: usize,
    /// Read stored features instead of running the backbone.
    pub(crate) stored: bool,
    /// Run boundaries are multiples of this many photos (a run shorter than it is empty).
    pub(crate) align: u32,
    pub(crate) seed: usize,
}

impl Job {
    /// A job that runs the backbone on every photo, in 2 runs with 2 epochs each, so that
    /// extraction dominates.
    pub(crate) fn backbone(mode: Mode, seed: usize) -> Self {
        Job {
            mode,
            ingress: 0.0,
            runs: 2,
            epochs: 2,
            stored: false,
            align: 32,
            seed,
        }
    }

    /// Runs it on `cluster`.
    pub(crate) async fn run(self, cluster: &Cluster) -> Result<FinetuneReport> {
        eprintln!(
            "  {} emulated PipeStores, {}, r = {}, {} epochs, stored features {}, Tuner ingress cap {:.1} MB/s, round {}",
            cluster.len(),
            self.mode.as_str(),
            self.runs,
            self.epochs,
            self.stored,
            self.ingress / 1e6,
            self.seed
        );
        let req = FinetuneRequest {
            runs: self.runs,
            epochs: self.epochs,
            batch: 128,
            mode: self.mode,
            ingress_bytes_per_second: self.ingress,
            use_stored_features: self.stored,
            align: self.align,
            deploy: false,
            chunk_size: 32,
            load_balance: false,
            seed: self.seed as u64,
            ..FinetuneRequest::default()
        };
        Ok(cluster.tuner().finetune(req).await?)
    }
}

/// Photos per second of extraction: every training and validation photo over the time until
/// the last node sent its last run.
pub(crate) fn extraction_rate(r: &FinetuneReport) -> f64 {
    (r.train_images + r.val_images) as f64 / r.extract_seconds.max(1e-9)
}

/// A PNG chart of `series` over `x`, the y axis from 0 to a tenth above the highest value.
pub(crate) fn chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x: &[f64],
    series: Vec<(String, Vec<f64>)>,
) -> Result<()> {
    let top = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    cachebench::plot::xy_chart(path, title, x_label, y_label, x, 0.0..top, &series)?;
    Ok(())
}
