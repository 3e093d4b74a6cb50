//! `ndpipe models add|list`: the backbones the Tuner keeps for rollouts. `add` uploads an ONNX
//! file with its manifest (and the manifest's class names); the Tuner verifies that it loads as
//! the manifest says before keeping it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_model::ModelManifest;
use ndpipe_model::manifest::MANIFEST_FILE;
use ndpipe_tuner::{BackboneUpload, BackboneView};

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

/// One backbone as `ndpipe models` prints it.
fn line(v: &BackboneView) -> String {
    format!(
        "{} {:<24} {:<40} features {:<5} classes {:<5} {} bytes",
        v.backbone, v.name, v.model_version, v.feature_dim, v.num_classes, v.bytes
    )
}
