//! `ndpipe models add|list`: the backbones the Tuner keeps for rollouts. `add` uploads an ONNX
//! file with its manifest (and the manifest's class names); the Tuner verifies that it loads as
//! the manifest says before keeping it. `ndpipe rollout BACKBONE` starts a rollout of one on
//! the Tuner and follows it (Ctrl-C stops following, not the job).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_model::ModelManifest;
use ndpipe_model::manifest::MANIFEST_FILE;
use ndpipe_tuner::{BackboneUpload, BackboneView, JobResult, JobView, RolloutReport};

/// Flags of `ndpipe models`.
#[derive(Debug, Args)]
pub(crate) struct ModelsArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Upload a backbone (an ONNX file and its manifest) to the Tuner, which verifies and keeps it.
    Add {
        /// The ONNX file.
        #[arg(long)]
        onnx: PathBuf,
        /// Its manifest; the class names are read from the classes file it names [default:
        /// model.json next to the ONNX file].
        #[arg(long)]
        manifest: Option<PathBuf>,
    },
    /// The backbones the Tuner keeps.
    List,
}

/// Runs `ndpipe models`.
pub(crate) async fn run(args: ModelsArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    match args.action {
        Action::Add { onnx, manifest } => {
            let manifest = manifest.unwrap_or_else(|| {
                onnx.parent()
                    .unwrap_or(std::path::Path::new(""))
                    .join(MANIFEST_FILE)
            });
            let manifest = ModelManifest::load_file(&manifest)?;
            let bytes =
                std::fs::read(&onnx).with_context(|| format!("reading {}", onnx.display()))?;
            let upload = BackboneUpload::new(manifest, &bytes);
            let view: BackboneView = client
                .post_json_body("/v1/tuner/backbones", &upload)
                .await?;
            println!("{}", line(&view));
        }
        Action::List => {
            let list: Vec<BackboneView> = client.get_json("/v1/tuner/backbones").await?;
            for view in &list {
                println!("{}", line(view));
            }
        }
    }
    Ok(())
}

/// Flags of `ndpipe rollout`.
#[derive(Debug, Args)]
pub(crate) struct RolloutArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The backbone to serve: its sha256, as `ndpipe models list` shows it.
    backbone: String,
    /// Start the job and print its id without following it.
    #[arg(long)]
    no_wait: bool,
    /// Commit the backbone even when a task's head cannot be carried to it (that task is then
    /// left without a head until it is fine-tuned again).
    #[arg(long)]
    force: bool,
}

/// Runs `ndpipe rollout`.
pub(crate) async fn rollout(args: RolloutArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let job: JobView = client
        .post_json_body(
            &format!("/v1/tuner/rollout/{}?force={}", args.backbone, args.force),
            &serde_json::json!({}),
        )
        .await
        .context("starting the rollout")?;
    if args.no_wait {
        println!("{}", job.id);
        return Ok(());
    }
    let job = super::finetune::follow(&client, job, "photos").await?;
    let Some(JobResult::Rollout(r)) = &job.result else {
        bail!("job {} ended without a rollout report", job.id);
    };
    print_rollout(r);
    Ok(())
}

fn print_rollout(r: &RolloutReport) {
    println!(
        "rolled out backbone {} ({}) to {} nodes: {} photos re-extracted and labelled; {:.1} photos/s against {:.1} model-only ({:.2}x) over {:.1} s",
        r.backbone,
        r.version,
        r.nodes.len(),
        r.photos,
        r.images_per_second,
        r.model_only_images_per_second,
        r.efficiency,
        r.extract_seconds
    );
    for n in &r.nodes {
        println!(
            "  {}: {} photos, {:.1} photos/s (model only {:.1}), {} given away, {} taken over, resumed {} times, {} caught up at the commit",
            n.node,
            n.photos,
            n.images_per_second,
            n.model_only_images_per_second,
            n.given,
            n.taken,
            n.resumed,
            n.caught_up
        );
    }
    for skipped in &r.skipped {
        println!("  left out {skipped}");
    }
    for t in &r.tasks {
        let figures = match (t.val_top1, t.parent_val_top1) {
            (Some(new), Some(old)) => format!(
                " (validation top-1 {:.1}%, {:.1}% before)",
                100.0 * new,
                100.0 * old
            ),
            _ => String::new(),
        };
        match (&t.version, t.carried) {
            (Some(v), true) => println!("  task {}: {} -> {v}{figures}", t.task, t.from),
            _ => println!(
                "  task {}: not carried, left without a head: {}{figures}",
                t.task,
                t.reason.as_deref().unwrap_or("")
            ),
        }
    }
}

/// One backbone as `ndpipe models` prints it.
fn line(v: &BackboneView) -> String {
    format!(
        "{} {:<24} {:<40} features {:<5} classes {:<5} {} bytes",
        v.backbone, v.name, v.model_version, v.feature_dim, v.num_classes, v.bytes
    )
}
