//! `ndpipe finetune`, `ndpipe versions` and `ndpipe rollback`: operate the Tuner over HTTP, with
//! the Tuner's own request, job and report types. A fine-tune or rollback starts a job on the
//! Tuner (202) and follows it with a progress bar (phase, photos done); Ctrl-C stops following,
//! not the job.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_catalog::ModelVersion;
use ndpipe_tuner::{
    DeployReport, FinetuneReport, FinetuneRequest, JobResult, JobView, Phase, ValSplit,
};

/// Flags of `ndpipe finetune`; unset ones keep the Tuner's defaults.
#[derive(Debug, Args)]
pub(crate) struct FinetuneArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Pipelined runs, NDPipe's num_of_run [default: 2].
    #[arg(long)]
    runs: Option<u32>,
    /// Epochs per run [default: 30].
    #[arg(long)]
    epochs: Option<usize>,
    /// Training batch size [default: 1024].
    #[arg(long)]
    batch: Option<usize>,
    /// Validation split: val, or carve (a tenth of the training photos, by photo id); the test
    /// split never validates [default: val when any node has val photos, else carve].
    #[arg(long, value_parser = parse_val_split)]
    val_split: Option<ValSplit>,
    /// Run the backbone again even where features are stored.
    #[arg(long)]
    no_stored_features: bool,
    /// Seed of initialisation and shuffling [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Train a new head from scratch on every labelled photo instead of fine-tuning the active
    /// version's.
    #[arg(long)]
    from_scratch: bool,
    /// The task to train (its ground truth labels the photos; `general` never trains)
    /// [default: the default task].
    #[arg(long)]
    task: Option<String>,
    /// Train and register the version without deploying it.
    #[arg(long)]
    no_deploy: bool,
    /// Deploy even when validation top-1 falls below the parent's by more than the margin.
    #[arg(long)]
    force: bool,
    /// How far below its parent's the new version's validation top-1 may fall and still deploy,
    /// in points [default: the Tuner's deploy_margin, 1 point].
    #[arg(long)]
    deploy_margin: Option<f32>,
    /// The least probability of a label the new head keeps; below it a photo is `other`
    /// [default: 0.5].
    #[arg(long)]
    floor: Option<f32>,
    /// The share of validation photos the novelty check keeps (0 turns it off): photos less
    /// like the training photos than the rest are `other` [default: 0.99].
    #[arg(long)]
    novelty_quantile: Option<f32>,
    /// Start the job and print its id without following it.
    #[arg(long)]
    no_wait: bool,
}

fn parse_val_split(s: &str) -> Result<ValSplit, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?} is not a validation split: use val or carve"))
}

impl FinetuneArgs {
    fn request(&self) -> Result<FinetuneRequest> {
        let d = FinetuneRequest::default();
        let task = match &self.task {
            Some(t) => t.parse().with_context(|| format!("--task {t}"))?,
            None => d.task.clone(),
        };
        Ok(FinetuneRequest {
            task,
            force: self.force,
            deploy_margin: self.deploy_margin.map(|points| points / 100.0),
            floor: self.floor.unwrap_or(d.floor),
            novelty_quantile: self.novelty_quantile.unwrap_or(d.novelty_quantile),
            runs: self.runs.unwrap_or(d.runs),
            epochs: self.epochs.unwrap_or(d.epochs),
            batch: self.batch.unwrap_or(d.batch),
            val_split: self.val_split.unwrap_or(d.val_split),
            use_stored_features: d.use_stored_features && !self.no_stored_features,
            seed: self.seed.unwrap_or(d.seed),
            from_scratch: self.from_scratch,
            deploy: d.deploy && !self.no_deploy,
            ..d
        })
    }
}

/// Runs `ndpipe finetune`.
pub(crate) async fn finetune(args: FinetuneArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let job: JobView = client
        .post_json_body("/v1/tuner/finetune", &args.request()?)
        .await?;
    if args.no_wait {
        println!("{}", job.id);
        return Ok(());
    }
    let job = follow(&client, job, "photos").await?;
    let Some(JobResult::Finetune(r)) = &job.result else {
        bail!("job {} ended without a fine-tuning report", job.id);
    };
    print_finetune(r);
    Ok(())
}

/// Polls a job until it ends, showing its phase and what its progress rows have done (counted
/// in `unit`); returns the finished job, or its error.
pub(super) async fn follow(client: &Client, mut job: JobView, unit: &str) -> Result<JobView> {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(&format!(
        "{{spinner}} [{{elapsed_precise}}] {{msg:12}} {{bar:40}} {{pos}}/{{len}} {unit}"
    ))?);
    let path = format!("/v1/tuner/jobs/{}", job.id);
    loop {
        let (done, total) = job
            .progress
            .iter()
            .fold((0, 0), |(d, t), p| (d + p.done, t + p.total));
        bar.set_message(phase_name(job.phase));
        bar.set_length(total);
        bar.set_position(done.min(total));
        if matches!(job.phase, Phase::Done | Phase::Failed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        job = client.get_json(&path).await?;
    }
    bar.finish_and_clear();
    for skipped in &job.skipped {
        println!("left out {skipped}");
    }
    if let Some(e) = &job.error {
        bail!("job {} failed: {} ({})", job.id, e.message, e.kind);
    }
    Ok(job)
}

fn phase_name(phase: Phase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn print_finetune(r: &FinetuneReport) {
    println!(
        "new version {} of task {} (parent {}): {} classes, {} training and {} validation photos ({} split)",
        r.version,
        r.task,
        r.parent.as_deref().unwrap_or("none"),
        r.classes.len(),
        r.train_images,
        r.val_images,
        r.val_split,
    );
    println!("| run | images | ready at s | train start s | train s | val top-1 |");
    println!("|-----|--------|------------|---------------|---------|-----------|");
    for run in &r.runs {
        println!(
            "| {:>3} | {:>6} | {:>10.2} | {:>13.2} | {:>7.2} | {:>8.1}% |",
            run.run,
            run.images,
            run.ready_at,
            run.train_start,
            run.train_seconds,
            100.0 * run.val_top1
        );
    }
    println!(
        "validation top-1 {:.1}% (before: {:.1}%); {:.0} bytes/image of features, {:.0} counted at the transport ({} chunks re-fetched); \
         extraction {:.1} s, training {:.1} s of which {:.1} s hidden behind extraction; total {:.1} s",
        100.0 * r.val_top1,
        100.0 * r.val_top1_before,
        r.bytes_per_image,
        r.wire_bytes_per_image,
        r.chunks_refetched,
        r.extract_seconds,
        r.train_seconds,
        r.train_hidden_seconds,
        r.seconds
    );
    for n in &r.nodes {
        println!(
            "  {}: {} images ({} run through the backbone), {:.0} img/s",
            n.node, n.images, n.extracted, n.images_per_second
        );
    }
    print_quality(r);
    match &r.deploy {
        Some(d) => print_deploy(d),
        None => println!(
            "{} is a candidate, not deployed (deploy it with `ndpipe rollback {}`)",
            r.version, r.version
        ),
    }
}

/// The new head's figures: per class, its label rules, and its quality gate.
fn print_quality(r: &FinetuneReport) {
    println!("| class | precision | recall | validation photos |");
    println!("|-------|-----------|--------|-------------------|");
    for c in &r.per_class {
        println!(
            "| {} | {:.1}% | {:.1}% | {} |",
            c.class,
            100.0 * c.precision,
            100.0 * c.recall,
            c.support
        );
    }
    println!(
        "labels kept from {:.0}% up{}; {:.1}% of the validation photos would be `other`",
        100.0 * r.floor,
        r.min_cosine
            .map(|c| format!(", photos unlike the training photos (cosine to every class mean under {c:.3}) are `other`"))
            .unwrap_or_default(),
        100.0 * r.val_other_share
    );
    let g = &r.gate;
    match g.parent_val_top1 {
        Some(parent) => println!(
            "gate: {:.1}% against the parent's {:.1}% on the same photos (margin {:.1} points): {}",
            100.0 * g.val_top1,
            100.0 * parent,
            100.0 * g.margin,
            if g.passed {
                "passed"
            } else if g.forced {
                "failed, deployed anyway (--force)"
            } else {
                "failed"
            }
        ),
        None => println!("gate: the task's first version, nothing to compare with"),
    }
}

fn print_deploy(d: &DeployReport) {
    println!(
        "deployed {} to {} nodes; re-labelled {} photos: top-1 changed for {} of {} ({:.1}%) [{}]",
        d.version,
        d.nodes,
        d.relabelled,
        d.changed,
        d.compared,
        100.0 * d.changed_fraction,
        d.modes.join(", ")
    );
    for lagging in d.lagging.iter().chain(&d.skipped) {
        println!(
            "  not yet on {}: {lagging} (the Tuner brings it there when it is next seen)",
            d.version
        );
    }
}

/// Runs `ndpipe versions`.
pub(crate) async fn versions(args: ServerArgs) -> Result<()> {
    let client = Client::new(&args)?;
    let list: Vec<ModelVersion> = client.get_json("/v1/tuner/versions").await?;
    for v in list {
        let metrics = match v.metrics.get("val_top1") {
            Some(top1) => format!(
                "val top-1 {:.1}%{}",
                100.0 * top1.as_f64().unwrap_or(0.0),
                match v.metrics.get("gate_passed").and_then(|g| g.as_bool()) {
                    Some(false) => " (below its parent: a candidate)",
                    _ => "",
                }
            ),
            None => v.metrics.to_string(),
        };
        println!(
            "{} {:<10} {:<40} parent {:<40} {}",
            if v.active { "*" } else { " " },
            v.task,
            v.id,
            v.parent.as_deref().unwrap_or("-"),
            metrics
        );
    }
    Ok(())
}

/// Flags of `ndpipe rollback`.
#[derive(Debug, Args)]
pub(crate) struct RollbackArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The version to serve again (see `ndpipe versions`).
    version: String,
}

/// Runs `ndpipe rollback`.
pub(crate) async fn rollback(args: RollbackArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let job: JobView = client
        .post_json_body(
            &format!("/v1/tuner/deploy/{}", args.version),
            &serde_json::json!({}),
        )
        .await
        .context("rolling back")?;
    let job = follow(&client, job, "photos")
        .await
        .context("rolling back")?;
    let Some(JobResult::Deploy(d)) = &job.result else {
        bail!("job {} ended without a deploy report", job.id);
    };
    print_deploy(d);
    Ok(())
}
