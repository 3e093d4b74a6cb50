//! `ndpipe-bench drift`: NDPipe's drift scenario. Fashion-MNIST classes arrive in stages; at each
//! stage the photos are labelled on arrival by the model of the previous stage (stale), then the
//! Tuner fine-tunes a new head from the PipeStores' features, deploys it and re-labels the store.
//! As the third column, a head retrained from scratch on every photo so far is deployed and
//! measured too, then the fine-tuned one is deployed again (the next stage goes on from it).
//! Per stage: top-1 on the test photos of every class seen so far, stale, fine-tuned and
//! retrained. Full retraining of the backbone is out of reach: ONNX Runtime runs the backbone,
//! the Tuner trains heads. The table goes to stdout and `OUT/drift.md`, the plot to
//! `OUT/drift.png`.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ndpipe_tuner::FinetuneRequest;
use serde::Serialize;

use ndpipe::client::{Client, ServerArgs};
use ndpipe::fashion_mnist;

use crate::cluster::{Cluster, Photo};
use crate::emulated::chart;

/// Flags of `ndpipe-bench drift`.
#[derive(Debug, Args)]
pub(crate) struct DriftBench {
    /// Class indices arriving at each stage, e.g. "0-3,4-6,7-9".
    #[arg(long, default_value = "0-3,4-6,7-9")]
    stages: String,
    /// Training photos per class.
    #[arg(long, default_value_t = 120)]
    train_per_class: usize,
    /// Test photos per class.
    #[arg(long, default_value_t = 30)]
    test_per_class: usize,
    /// Epochs per run.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Training batch size (NDPipe's 1024 leaves one step per epoch on data this small).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// Seed of the heads' initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Folder for the table and the plot.
    #[arg(long, default_value = "docs/experiments")]
    out: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Stage {
    stage: usize,
    new_classes: Vec<&'static str>,
    classes_seen: usize,
    test_photos: usize,
    stale_version: String,
    stale_top1: f64,
    tuned_version: String,
    tuned_top1: f64,
    label_churn: f64,
    retrained_version: String,
    retrained_top1: f64,
}

/// Runs `ndpipe-bench drift`.
pub(crate) async fn run(args: DriftBench) -> Result<()> {
    let stages = parse_stages(&args.stages)?;
    let dir = fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let train = fashion_mnist::load(&dir, "train")?;
    let test = fashion_mnist::load(&dir, "test")?;
    let cluster = Cluster::start(1, &[], &args.model_dir).await?;
    let client = Client::new(&ServerArgs {
        server: format!("http://{}", cluster.node_addr(0)),
        token: None,
    })?;
    let mut tests: Vec<(u64, &'static str)> = Vec::new();
    let mut rows = Vec::new();
    let mut active = String::new();
    for (stage, classes) in stages.iter().enumerate() {
        let mut photos: Vec<Photo> = Vec::new();
        for &c in classes {
            let name = fashion_mnist::CLASSES[c];
            let pick = |split: &fashion_mnist::Split, n: usize| -> Result<Vec<Vec<u8>>> {
                (0..split.len())
                    .filter(|&i| usize::from(split.labels[i]) == c)
                    .take(n)
                    .map(|i| fashion_mnist::png(split.image(i)))
                    .collect()
            };
            photos.extend(
                pick(&train, args.train_per_class)?
                    .into_iter()
                    .map(|p| (p, name, "train")),
            );
            photos.extend(
                pick(&test, args.test_per_class)?
                    .into_iter()
                    .map(|p| (p, name, "test")),
            );
        }
        eprintln!(
            "stage {stage}: {} new photos of {} new classes",
            photos.len(),
            classes.len()
        );
        for (png, label, split) in &photos {
            let id = client
                .upload(
                    png.clone(),
                    Some(ndpipe::client::Truth {
                        label,
                        split,
                        task: None,
                    }),
                )
                .await
                .map_err(|e| anyhow::anyhow!("upload failed: {e:?}"))?;
            if *split == "test" {
                tests.push((id, label));
            }
        }
        cluster
            .wait_labelled(
                0,
                tests.len() + stage_train_total(&stages[..=stage], args.train_per_class),
            )
            .await?;
        let stale_top1 = if active.is_empty() {
            0.0
        } else {
            accuracy(&client, &tests, &active).await?
        };
        let request = FinetuneRequest {
            runs: 2,
            epochs: args.epochs,
            batch: args.batch,
            deploy: true,
            chunk_size: 64,
            seed: args.seed,
            ..FinetuneRequest::default()
        };
        let report = cluster.tuner().finetune(request.clone()).await?;
        let tuned_top1 = accuracy(&client, &tests, &report.version).await?;
        let retrained = cluster
            .tuner()
            .finetune(FinetuneRequest {
                from_scratch: true,
                ..request
            })
            .await?;
        let retrained_top1 = accuracy(&client, &tests, &retrained.version).await?;
        cluster.tuner().deploy(&report.version).await?;
        rows.push(Stage {
            stage,
            new_classes: classes.iter().map(|&c| fashion_mnist::CLASSES[c]).collect(),
            classes_seen: report.classes.len(),
            test_photos: tests.len(),
            stale_version: if active.is_empty() {
                "pretrained ImageNet head".into()
            } else {
                active.clone()
            },
            stale_top1,
            tuned_version: report.version.clone(),
            tuned_top1,
            label_churn: report.deploy.as_ref().map_or(0.0, |d| d.changed_fraction),
            retrained_version: retrained.version,
            retrained_top1,
        });
        active = report.version;
    }
    cluster.stop().await?;
    let table = table(&rows, &args);
    println!("\n{table}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("drift.md"), &table)?;
    plot(&rows, &args.out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn table(rows: &[Stage], args: &DriftBench) -> String {
    let mut out = format!(
        "Fashion-MNIST classes arrive in stages ({} train + {} test photos per class, {} epochs per run, 2 runs, seed {}).\n\n",
        args.train_per_class, args.test_per_class, args.epochs, args.seed
    );
    out.push_str("| stage | new classes | seen | test photos | stale top-1 | fine-tuned top-1 | retrained from scratch top-1 | label churn |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% |\n",
            r.stage,
            r.new_classes.join(", "),
            r.classes_seen,
            r.test_photos,
            100.0 * r.stale_top1,
            100.0 * r.tuned_top1,
            100.0 * r.retrained_top1,
            100.0 * r.label_churn
        ));
    }
    out.push_str("\nstale = the previous stage's model on every class seen so far (stage 0: the pretrained ImageNet head); fine-tuned = the previous stage's head, fine-tuned; retrained = a new head trained from scratch on every photo so far (the backbone stays frozen).\n");
    out
}

/// Top-1 per stage, stale, fine-tuned and retrained.
fn plot(rows: &[Stage], out: &std::path::Path) -> Result<()> {
    let x: Vec<f64> = rows.iter().map(|r| r.stage as f64).collect();
    let pct = |f: fn(&Stage) -> f64| rows.iter().map(|r| 100.0 * f(r)).collect::<Vec<_>>();
    chart(
        &out.join("drift.png"),
        "Drift: Fashion-MNIST classes arriving in stages",
        "stage",
        "top-1 % on the classes seen so far",
        &x,
        vec![
            ("stale".into(), pct(|r| r.stale_top1)),
            ("fine-tuned".into(), pct(|r| r.tuned_top1)),
            ("retrained from scratch".into(), pct(|r| r.retrained_top1)),
        ],
    )
}

fn stage_train_total(stages: &[Vec<usize>], per_class: usize) -> usize {
    stages.iter().map(Vec::len).sum::<usize>() * per_class
}

fn parse_stages(spec: &str) -> Result<Vec<Vec<usize>>> {
    spec.split(',')
        .map(|part| {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b): (usize, usize) = (a.trim().parse()?, b.trim().parse()?);
            anyhow::ensure!(
                a <= b && b < 10,
                "stage {part:?} must be classes a-b within 0-9"
            );
            Ok((a..=b).collect())
        })
        .collect()
}

/// Top-1 accuracy of `version` on the given test photos, from the labels the store holds.
async fn accuracy(client: &Client, tests: &[(u64, &str)], version: &str) -> Result<f64> {
    let mut correct = 0;
    for (id, truth) in tests {
        let labels: Vec<HashMap<String, serde_json::Value>> =
            client.get_json(&format!("/v1/photos/{id}/labels")).await?;
        let top1 = labels
            .iter()
            .find(|v| v.get("model_version").and_then(|m| m.as_str()) == Some(version))
            .and_then(|v| v.get("labels"))
            .and_then(|l| l[0]["label"].as_str().map(str::to_owned));
        correct += usize::from(top1.as_deref() == Some(*truth));
    }
    Ok(correct as f64 / tests.len().max(1) as f64)
}
