//! The int8 model of `ndpipe-bench infer`: calibrated on real-photo crops, with the layers that
//! lose top-1 agreement kept in fp32 (the search is `bench/python/quantize.py`), then measured
//! against fp32 in the same run: model-only throughput over rounds, and top-1 agreement on
//! held-out crops that neither calibration nor the search saw.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_model::{ImageTensor, InferenceBackend, ModelManifest, Normalizer};
use serde::{Deserialize, Serialize};

use crate::crops::{Sources, drop_shared};

/// Flags of the int8 part of `ndpipe-bench infer`.
#[derive(Debug, Args)]
pub(crate) struct Int8Args {
    /// Folder of wallpaper JPEGs, cropped along with the sample photos.
    #[arg(long, default_value = ".cache/wallpapers")]
    wallpapers: PathBuf,
    /// Real-photo crops the int8 activation ranges are calibrated on.
    #[arg(long, default_value_t = 384)]
    calibration_crops: usize,
    /// Crops (the next seed) that choose the quantiser settings and the layers kept fp32.
    #[arg(long, default_value_t = 256)]
    selection_crops: usize,
    /// Held-out crops (the seed after) on which int8 top-1 agreement with fp32 is reported.
    #[arg(long, default_value_t = 256)]
    agreement_crops: usize,
    /// Seed of the calibration crops; the selection and agreement crops use the next two.
    #[arg(long, default_value_t = 13)]
    crop_seed: u64,
    /// Stop keeping more layers in fp32 once the selection crops agree with fp32 this often.
    #[arg(long, default_value_t = 0.97)]
    int8_target_agreement: f64,
    /// The int8 model kept is the best search step at least this many times fp32's throughput.
    #[arg(long, default_value_t = 1.8)]
    int8_min_speedup: f64,
    /// Most steps of the greedy search (op groups kept fp32 from the input on).
    #[arg(long, default_value_t = 8)]
    int8_max_steps: usize,
    /// Rounds of the int8 vs fp32 model-only comparison.
    #[arg(long, default_value_t = 3)]
    int8_rounds: usize,
}

/// One quantiser setting tried, scored on the selection crops.
#[derive(Debug, Serialize, Deserialize)]
struct Try {
    format: String,
    per_channel: bool,
    symmetric_activations: bool,
    calibration: String,
    agreement: f64,
    speedup: f64,
}

/// Top-1 agreement with one op group alone kept in fp32.
#[derive(Debug, Serialize, Deserialize)]
struct Sensitivity {
    group: String,
    agreement: f64,
}

/// One step of the greedy search: the fp32 layers extended up to a group, and whether it stayed.
#[derive(Debug, Serialize, Deserialize)]
struct Step {
    group: String,
    agreement: f64,
    speedup: f64,
    kept: bool,
}

/// What `quantize.py` chose and why (its REPORT.json).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Search {
    calibration_tensors: usize,
    selection_tensors: usize,
    tries: Vec<Try>,
    sensitivity: Vec<Sensitivity>,
    steps: Vec<Step>,
    kept_fp32: Vec<String>,
    selection_agreement: f64,
    selection_speedup: f64,
}

/// The int8 model against fp32, measured in one run.
#[derive(Debug, Serialize)]
pub(crate) struct Int8Results {
    search: Search,
    agreement_crops: usize,
    /// Top-1 agreement with fp32 on the held-out crops.
    agreement: f64,
    fp32_images_per_second: Vec<f64>,
    int8_images_per_second: Vec<f64>,
    speedups: Vec<f64>,
    target_agreement: f64,
    min_speedup: f64,
}

impl Int8Results {
    /// The median int8 / fp32 model-only throughput ratio over the rounds.
    pub(crate) fn speedup(&self) -> f64 {
        let mut s = self.speedups.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    }
}

/// Everything the int8 measurement needs from the rest of the bench.
pub(crate) struct Int8Run<'a> {
    pub(crate) args: &'a Int8Args,
    pub(crate) python: &'a Path,
    pub(crate) model_dir: &'a Path,
    pub(crate) samples: &'a Path,
    pub(crate) work: &'a Path,
    pub(crate) threads: usize,
    pub(crate) batch: usize,
}

impl Int8Run<'_> {
    /// Builds the int8 model folder (model.json, ONNX, classes) under `work` and the search's
    /// report; the crops held out for agreement come back with them.
    pub(crate) fn quantise(&self) -> Result<(PathBuf, Search, Vec<ImageTensor>)> {
        let a = self.args;
        let sources = Sources::load(&[self.samples, &a.wallpapers])?;
        eprintln!(
            "int8: cutting {} + {} + {} crops from {} real photos...",
            a.calibration_crops,
            a.selection_crops,
            a.agreement_crops,
            sources.len()
        );
        let calibration = sources.crops(a.calibration_crops, a.crop_seed)?;
        let mut selection = sources.crops(a.selection_crops, a.crop_seed + 1)?;
        let mut agreement = sources.crops(a.agreement_crops, a.crop_seed + 2)?;
        let shared = drop_shared(&mut selection, &[&calibration])
            + drop_shared(&mut agreement, &[&calibration, &selection]);
        ensure!(
            !agreement.is_empty() && !selection.is_empty(),
            "no crops left once those shared between the sets were dropped"
        );
        if shared > 0 {
            eprintln!("int8: dropped {shared} crops that another set also holds");
        }
        let manifest = ModelManifest::load(self.model_dir)?;
        let normalizer = Normalizer::new(&manifest);
        let dir = self.work.join("int8");
        std::fs::create_dir_all(&dir)?;
        let calibration_npy = self.work.join("calibration.npy");
        let selection_npy = self.work.join("selection.npy");
        write_npy(&calibration_npy, &normalizer, &calibration)?;
        write_npy(&selection_npy, &normalizer, &selection)?;
        let out_model = dir.join("model-int8.onnx");
        let report = self.work.join("int8-search.json");
        eprintln!("int8: choosing settings and the layers kept fp32 (bench/python/quantize.py)...");
        let status = Command::new(self.python)
            .arg("bench/python/quantize.py")
            .arg(manifest.model_path())
            .args([&calibration_npy, &selection_npy, &out_model, &report])
            .args(["--threads", &self.threads.to_string()])
            .args(["--batch", &self.batch.to_string()])
            .args(["--target-agreement", &a.int8_target_agreement.to_string()])
            .args(["--min-speedup", &a.int8_min_speedup.to_string()])
            .args(["--max-steps", &a.int8_max_steps.to_string()])
            .status()
            .with_context(|| format!("running {}", self.python.display()))?;
        ensure!(status.success(), "quantisation failed");
        let search: Search = serde_json::from_slice(&std::fs::read(&report)?)
            .context("reading the quantiser's report")?;
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.model_dir.join("model.json"))?)?;
        json["model_file"] = "model-int8.onnx".into();
        json["name"] = format!("{}-int8", json["name"].as_str().unwrap_or("model")).into();
        std::fs::write(dir.join("model.json"), serde_json::to_vec_pretty(&json)?)?;
        let classes = json["classes_file"]
            .as_str()
            .unwrap_or("imagenet_classes.txt")
            .to_string();
        std::fs::copy(self.model_dir.join(&classes), dir.join(&classes))?;
        Ok((dir, search, agreement))
    }

    /// Model-only throughput of both models over `tensors`, alternating for `int8_rounds`, and
    /// top-1 agreement on the held-out crops.
    pub(crate) fn measure(
        &self,
        fp32: &dyn InferenceBackend,
        int8: &dyn InferenceBackend,
        tensors: &[ImageTensor],
        search: Search,
        agreement: &[ImageTensor],
    ) -> Result<Int8Results> {
        let mut r = Int8Results {
            search,
            agreement_crops: agreement.len(),
            agreement: 0.0,
            fp32_images_per_second: Vec::new(),
            int8_images_per_second: Vec::new(),
            speedups: Vec::new(),
            target_agreement: self.args.int8_target_agreement,
            min_speedup: self.args.int8_min_speedup,
        };
        for round in 1..=self.args.int8_rounds.max(1) {
            eprintln!("int8: round {round}, model-only fp32 then int8...");
            let f = crate::infer::model_only(fp32, tensors, self.batch)?;
            let i = crate::infer::model_only(int8, tensors, self.batch)?;
            r.fp32_images_per_second.push(f);
            r.int8_images_per_second.push(i);
            r.speedups.push(i / f);
        }
        let (a, b) = (
            top1(fp32, agreement, self.batch)?,
            top1(int8, agreement, self.batch)?,
        );
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        r.agreement = same as f64 / a.len() as f64;
        Ok(r)
    }
}

/// The top-1 class of each tensor.
fn top1(
    backend: &dyn InferenceBackend,
    tensors: &[ImageTensor],
    batch: usize,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(tensors.len());
    for chunk in tensors.chunks(batch.min(backend.max_batch()).max(1)) {
        let outputs = backend.run(chunk)?;
        for i in 0..outputs.len() {
            let best = outputs
                .logits(i)
                .iter()
                .enumerate()
                .max_by(|x, y| x.1.total_cmp(y.1))
                .map_or(0, |(k, _)| k);
            out.push(best);
        }
    }
    Ok(out)
}

/// Writes the normalised tensors as a little-endian f32 `.npy` file.
fn write_npy(path: &Path, normalizer: &Normalizer, tensors: &[ImageTensor]) -> Result<()> {
    let mut values = Vec::new();
    normalizer.fill(tensors, &mut values);
    let dims = normalizer
        .shape(tensors.len())
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Prints the settings tried, the greedy steps, the layers kept fp32 and the verdict.
pub(crate) fn print(r: &Int8Results) {
    let s = &r.search;
    println!();
    println!(
        "int8 settings tried ({} calibration crops; scored on {} selection crops, int8 alone):",
        s.calibration_tensors, s.selection_tensors
    );
    println!(
        "| {:<9} | {:<11} | {:<11} | {:<11} | {:>9} | {:>8} |",
        "format", "weights", "activations", "calibration", "agreement", "speed-up"
    );
    println!(
        "|{:-<11}|{:-<13}|{:-<13}|{:-<13}|{:->11}|{:->10}|",
        "", "", "", "", "", ""
    );
    for t in &s.tries {
        println!(
            "| {:<9} | {:<11} | {:<11} | {:<11} | {:>8.1}% | {:>7.2}x |",
            t.format,
            if t.per_channel {
                "per-channel"
            } else {
                "per-tensor"
            },
            if t.symmetric_activations {
                "symmetric"
            } else {
                "asymmetric"
            },
            t.calibration,
            100.0 * t.agreement,
            t.speedup
        );
    }
    let alone: Vec<String> = s
        .sensitivity
        .iter()
        .map(|g| format!("{} {:.1}%", g.group, 100.0 * g.agreement))
        .collect();
    println!(
        "agreement with one op group alone in fp32: {}",
        alone.join(", ")
    );
    println!("greedy search, fp32 from the input up to (selection crops):");
    for step in &s.steps {
        println!(
            "  {:<10} agreement {:>5.1}%  speed-up {:.2}x  {}",
            step.group,
            100.0 * step.agreement,
            step.speedup,
            if step.kept { "best so far" } else { "" }
        );
    }
    println!(
        "kept fp32: [{}]; on the selection crops {:.1}% agreement at {:.2}x",
        s.kept_fp32.join(", "),
        100.0 * s.selection_agreement,
        s.selection_speedup
    );
    let rounds = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let (lo, hi) = r
        .speedups
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        });
    println!(
        "int8 model-only img/s per round {} vs fp32 {}: {:.2}x median (spread {:.2}-{:.2}x)",
        rounds(&r.int8_images_per_second),
        rounds(&r.fp32_images_per_second),
        r.speedup(),
        lo,
        hi
    );
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "int8 top-1 agreement with fp32 on {} held-out real-photo crops: {:.1}%; \
         targets >= {:.1}x: {}, >= {:.0}% agreement: {}",
        r.agreement_crops,
        100.0 * r.agreement,
        r.min_speedup,
        met(r.speedup() >= r.min_speedup),
        100.0 * r.target_agreement,
        met(r.agreement >= r.target_agreement)
    );
}
