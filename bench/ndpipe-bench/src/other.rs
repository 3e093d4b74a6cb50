//! `ndpipe-bench other`: how well a task's label rules send photos outside the task to `other`
//! while keeping the task's own photos in their classes.
//!
//! A task's head says `other` by calibrated rejection, not by an `other` class trained from
//! outside photos: a score floor (the best class's probability) and a novelty check (cosine to
//! the nearest class centroid, calibrated on the validation photos). Per seed, one PipeStore and
//! a Tuner run in this process; Fashion-MNIST photos of all but the held-out classes get ground
//! truth (train split for training and calibration, test split for scoring), while photos of the
//! held-out classes and real photos (the sample photos, the wallpapers and random crops of them)
//! are uploaded unlabelled. The same head is then trained and deployed under each rule, and the
//! labels the store gives every photo are read back. The control, no rule at all, must reject
//! nothing: it is what a head without `other` does to the cat.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe::client::{Client, Truth};
use ndpipe::fashion_mnist::{self, CLASSES};
use ndpipe_tuner::FinetuneRequest;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

use crate::cluster::{Cluster, client};
use crate::crops::Sources;
use crate::emulated::{Spread, chart};

/// Flags of `ndpipe-bench other`.
#[derive(Debug, Args)]
pub(crate) struct OtherBench {
    /// Fashion-MNIST classes left out of the task; their photos must come out `other`.
    #[arg(long, value_delimiter = ',', default_value = "Bag,Ankle boot")]
    held_out: Vec<String>,
    /// Training photos per task class (the Tuner carves its validation photos from them).
    #[arg(long, default_value_t = 100)]
    train_per_class: usize,
    /// Test photos per task class, scored and never trained on.
    #[arg(long, default_value_t = 30)]
    test_per_class: usize,
    /// Photos per held-out class.
    #[arg(long, default_value_t = 60)]
    held_out_per_class: usize,
    /// Random crops of the real photos, besides the photos themselves.
    #[arg(long, default_value_t = 100)]
    crops: usize,
    /// Seeds: each draws its own photos and crops and trains its own head.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Epochs per run.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// The sample photos.
    #[arg(
        long,
        env = "NDPIPE_SAMPLES_DIR",
        default_value = ".cache/model/samples"
    )]
    samples: PathBuf,
    /// More real photos (Debian's wallpapers, fetched by setup).
    #[arg(long, default_value = ".cache/wallpapers")]
    wallpapers: PathBuf,
    /// Folder for the table and the plot.
    #[arg(long, default_value = "docs/experiments")]
    out: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A label rule: the floor and the novelty quantile of the fine-tune request.
struct Rule {
    name: &'static str,
    floor: f32,
    novelty_quantile: f32,
}

const RULES: [Rule; 4] = [
    Rule {
        name: "none (control)",
        floor: 0.0,
        novelty_quantile: 0.0,
    },
    Rule {
        name: "floor 0.5",
        floor: 0.5,
        novelty_quantile: 0.0,
    },
    Rule {
        name: "novelty q=0.99",
        floor: 0.0,
        novelty_quantile: 0.99,
    },
    Rule {
        name: "floor 0.5 + novelty q=0.99 (default)",
        floor: 0.5,
        novelty_quantile: 0.99,
    },
];

/// The photos one seed scores, by id: in-task test photos with their class, held-out and real.
#[derive(Default)]
struct Scored {
    in_task: Vec<(u64, &'static str)>,
    held_out: Vec<u64>,
    real: Vec<u64>,
}

/// One rule's figures in one seed, as shares.
#[derive(Debug, Clone, Copy, Serialize)]
struct Outcome {
    /// In-task test photos labelled `other` (false rejects).
    in_task_other: f64,
    /// In-task test photos whose top label is their class (`other` counts as wrong).
    in_task_top1: f64,
    /// Held-out-class photos labelled `other`.
    held_out_other: f64,
    /// Real photos labelled `other`.
    real_other: f64,
}

#[derive(Debug, Serialize)]
struct Row {
    rule: &'static str,
    floor: f32,
    novelty_quantile: f32,
    per_seed: Vec<Outcome>,
    in_task_other: Spread,
    in_task_top1: Spread,
    held_out_other: Spread,
    real_other: Spread,
}

/// Runs `ndpipe-bench other`.
pub(crate) async fn run(args: OtherBench) -> Result<()> {
    let held_out: Vec<usize> = (args.held_out.iter())
        .map(|name| {
            CLASSES
                .iter()
                .position(|c| c == name)
                .with_context(|| format!("{name:?} is not a Fashion-MNIST class"))
        })
        .collect::<Result<_>>()?;
    ensure!(
        CLASSES.len() - held_out.len() >= 2,
        "the task needs at least 2 classes"
    );
    ensure!(args.seeds > 0, "--seeds must be at least 1");
    let dir = fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let train = fashion_mnist::load(&dir, "train")?;
    let test = fashion_mnist::load(&dir, "test")?;
    let sources = Sources::load(&[&args.samples, &args.wallpapers])?;
    let real_photos = whole_photos(&[&args.samples, &args.wallpapers])?;
    let mut outcomes: Vec<Vec<Outcome>> = vec![Vec::new(); RULES.len()];
    for seed in 0..args.seeds {
        let cluster = Cluster::start(1, &[], &args.model_dir).await?;
        let node = client(cluster.node_addr(0))?;
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut scored = Scored::default();
        let mut uploaded = 0;
        for (class, &name) in CLASSES.iter().enumerate() {
            if held_out.contains(&class) {
                for png in pick(&test, class, args.held_out_per_class, &mut rng)? {
                    scored.held_out.push(upload(&node, png, None).await?);
                }
                continue;
            }
            for png in pick(&train, class, args.train_per_class, &mut rng)? {
                upload(&node, png, Some(truth(name, "train"))).await?;
                uploaded += 1;
            }
            for png in pick(&test, class, args.test_per_class, &mut rng)? {
                let id = upload(&node, png, Some(truth(name, "test"))).await?;
                scored.in_task.push((id, name));
            }
        }
        let crops = sources.crop_pngs(args.crops, seed)?;
        for png in real_photos.iter().cloned().chain(crops) {
            scored.real.push(upload(&node, png, None).await?);
        }
        let total = uploaded + scored.in_task.len() + scored.held_out.len() + scored.real.len();
        eprintln!("seed {seed}: {total} photos uploaded; training a head under each rule");
        cluster.wait_labelled(0, total).await?;
        for (r, rule) in RULES.iter().enumerate() {
            let report = cluster
                .tuner()
                .finetune(FinetuneRequest {
                    epochs: args.epochs,
                    batch: 64,
                    chunk_size: 64,
                    seed,
                    from_scratch: true,
                    force: true,
                    floor: rule.floor,
                    novelty_quantile: rule.novelty_quantile,
                    ..FinetuneRequest::default()
                })
                .await?;
            ensure!(
                report.deploy.is_some(),
                "the version of rule {:?} was not deployed",
                rule.name
            );
            let outcome = score(&node, &scored, &report.version).await?;
            eprintln!("  {}: {outcome:?}", rule.name);
            outcomes[r].push(outcome);
        }
        cluster.stop().await?;
    }
    let rows: Vec<Row> = RULES
        .iter()
        .zip(outcomes)
        .map(|(rule, per_seed)| row(rule, per_seed))
        .collect();
    let table = table(&rows, &args);
    println!("\n{table}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("other.md"), &table)?;
    plot(&rows, &args.out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn truth(label: &'static str, split: &'static str) -> Truth<'static> {
    Truth {
        label,
        split,
        task: None,
    }
}

async fn upload(node: &Client, png: Vec<u8>, truth: Option<Truth<'_>>) -> Result<u64> {
    node.upload(png, truth)
        .await
        .map_err(|e| anyhow::anyhow!("upload failed: {e:?}"))
}

/// `n` photos of `class` from `split`, drawn by `rng`, as PNG.
fn pick(
    split: &fashion_mnist::Split,
    class: usize,
    n: usize,
    rng: &mut Pcg64Mcg,
) -> Result<Vec<Vec<u8>>> {
    let mut of_class: Vec<usize> = (0..split.len())
        .filter(|&i| usize::from(split.labels[i]) == class)
        .collect();
    of_class.shuffle(rng);
    ensure!(
        of_class.len() >= n,
        "{} has {} photos of {}, {n} asked",
        split.name,
        of_class.len(),
        CLASSES[class]
    );
    of_class[..n]
        .iter()
        .map(|&i| fashion_mnist::png(split.image(i)))
        .collect()
}

/// The PNG and JPEG files of `folders`, as they are.
fn whole_photos(folders: &[&Path]) -> Result<Vec<Vec<u8>>> {
    let mut paths = Vec::new();
    for folder in folders {
        for entry in std::fs::read_dir(folder)
            .with_context(|| format!("listing {} (run make setup)", folder.display()))?
        {
            let path = entry?.path();
            let ext = path.extension().and_then(|e| e.to_str());
            if matches!(ext, Some("png" | "jpg" | "jpeg")) {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect()
}

/// The labels `version` gave the scored photos, as shares.
async fn score(node: &Client, scored: &Scored, version: &str) -> Result<Outcome> {
    let mut in_task = (0usize, 0usize);
    for (id, class) in &scored.in_task {
        let top = top_label(node, *id, version).await?;
        in_task.0 += usize::from(top == "other");
        in_task.1 += usize::from(top == *class);
    }
    let held_out_other = other_share(node, &scored.held_out, version).await?;
    let real_other = other_share(node, &scored.real, version).await?;
    let n = scored.in_task.len().max(1) as f64;
    Ok(Outcome {
        in_task_other: in_task.0 as f64 / n,
        in_task_top1: in_task.1 as f64 / n,
        held_out_other,
        real_other,
    })
}

/// The share of `ids` that `version` labelled `other`.
async fn other_share(node: &Client, ids: &[u64], version: &str) -> Result<f64> {
    let mut n = 0usize;
    for id in ids {
        n += usize::from(top_label(node, *id, version).await? == "other");
    }
    Ok(n as f64 / ids.len().max(1) as f64)
}

/// The top label `version` gave photo `id`; an error when it gave none.
async fn top_label(node: &Client, id: u64, version: &str) -> Result<String> {
    let labels: Vec<serde_json::Value> = node.get_json(&format!("/v1/photos/{id}/labels")).await?;
    labels
        .iter()
        .find(|v| v["model_version"] == version)
        .and_then(|v| v["labels"][0]["label"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("photo {id} has no label of {version}"))
}

fn row(rule: &Rule, per_seed: Vec<Outcome>) -> Row {
    let pct = |f: fn(&Outcome) -> f64| {
        Spread::of(&per_seed.iter().map(|o| 100.0 * f(o)).collect::<Vec<_>>())
    };
    Row {
        rule: rule.name,
        floor: rule.floor,
        novelty_quantile: rule.novelty_quantile,
        in_task_other: pct(|o| o.in_task_other),
        in_task_top1: pct(|o| o.in_task_top1),
        held_out_other: pct(|o| o.held_out_other),
        real_other: pct(|o| o.real_other),
        per_seed,
    }
}

fn table(rows: &[Row], args: &OtherBench) -> String {
    let mut out = format!(
        "A task of {} Fashion-MNIST classes ({} train + {} test photos each), rejection by \
         calibrated rules (no `other` class is trained). Held out: {} ({} photos each); real \
         photos: the sample photos, the wallpapers and {} crops of them. {} seeds, mean \
         (min..max), in %.\n\n",
        CLASSES.len() - args.held_out.len(),
        args.train_per_class,
        args.test_per_class,
        args.held_out.join(", "),
        args.held_out_per_class,
        args.crops,
        args.seeds,
    );
    out.push_str(
        "| rule | in-task -> other (false reject) | in-task top-1 | held-out classes -> other | real photos -> other |\n",
    );
    out.push_str("|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.rule, r.in_task_other, r.in_task_top1, r.held_out_other, r.real_other
        ));
    }
    out.push_str(
        "\nThe control (no rule) must reject nothing: every photo gets one of the task's \
         classes, the cat included. A rule earns its place when it rejects far more outside \
         photos than it loses of the task's own, beyond the seeds' spread.\n",
    );
    out
}

/// Share labelled `other` per rule, for each set of photos.
fn plot(rows: &[Row], out: &Path) -> Result<()> {
    let x: Vec<f64> = (0..rows.len()).map(|i| i as f64).collect();
    let series = |f: fn(&Row) -> Spread| rows.iter().map(|r| f(r).mean).collect::<Vec<_>>();
    chart(
        &out.join("other.png"),
        "Photos labelled other, per rule (0 none, 1 floor, 2 novelty, 3 both)",
        "rule",
        "% labelled other",
        &x,
        vec![
            ("in-task (false reject)".into(), series(|r| r.in_task_other)),
            ("held-out classes".into(), series(|r| r.held_out_other)),
            ("real photos".into(), series(|r| r.real_other)),
        ],
    )
}
