//! `ndpipe finetune`, `ndpipe versions` and `ndpipe rollback`: operate the Tuner.

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Value, json};

use crate::client::{Client, ServerArgs};

/// Flags of `ndpipe finetune`.
#[derive(Debug, Args)]
pub struct FinetuneArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Pipelined runs (NDPipe's num_of_run).
    #[arg(long, default_value_t = 2)]
    runs: u32,
    /// Epochs per run.
    #[arg(long, default_value_t = 30)]
    epochs: usize,
    /// Training batch size.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Validation split: val or test (default: val when any node has val photos, else test).
    #[arg(long)]
    val_split: Option<String>,
    /// Run the backbone again even where features are stored.
    #[arg(long)]
    no_stored_features: bool,
    /// Seed of initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train and register the version without deploying it.
    #[arg(long)]
    no_deploy: bool,
}

/// Runs `ndpipe finetune`.
pub async fn finetune(args: FinetuneArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let body = json!({
        "runs": args.runs,
        "epochs": args.epochs,
        "batch": args.batch,
        "val_split": args.val_split.unwrap_or_default(),
        "use_stored_features": !args.no_stored_features,
        "seed": args.seed,
        "deploy": !args.no_deploy,
    });
    let r: Value = client.post_json_body("/v1/tuner/finetune", &body).await?;
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!(
        "new version {} (parent {}): {} classes, {} training and {} validation photos ({} split)",
        r["version"].as_str().unwrap_or("?"),
        r["parent"].as_str().unwrap_or("none"),
        r["classes"].as_array().map_or(0, Vec::len),
        r["train_images"],
        r["val_images"],
        r["val_split"].as_str().unwrap_or("?"),
    );
    println!("| run | images | ready at s | train start s | train s | val top-1 |");
    println!("|-----|--------|------------|---------------|---------|-----------|");
    for run in r["runs"].as_array().into_iter().flatten() {
        println!(
            "| {:>3} | {:>6} | {:>10.2} | {:>13.2} | {:>7.2} | {:>8.1}% |",
            run["run"],
            run["images"],
            f(&run["ready_at"]),
            f(&run["train_start"]),
            f(&run["train_seconds"]),
            100.0 * f(&run["val_top1"])
        );
    }
    println!(
        "validation top-1 {:.1}% (before: {:.1}%); {:.0} bytes/image on the wire ({} chunks re-fetched); \
         extraction {:.1} s, training {:.1} s of which {:.1} s hidden behind extraction; total {:.1} s",
        100.0 * f(&r["val_top1"]),
        100.0 * f(&r["val_top1_before"]),
        f(&r["bytes_per_image"]),
        r["chunks_refetched"],
        f(&r["extract_seconds"]),
        f(&r["train_seconds"]),
        f(&r["train_hidden_seconds"]),
        f(&r["seconds"])
    );
    for n in r["nodes"].as_array().into_iter().flatten() {
        println!(
            "  {}: {} images ({} run through the backbone), {:.0} img/s",
            n["node"].as_str().unwrap_or("?"),
            n["images"],
            n["extracted"],
            f(&n["images_per_second"])
        );
    }
    if let Some(d) = r.get("deploy").filter(|d| !d.is_null()) {
        print_deploy(d);
    }
    Ok(())
}

fn print_deploy(d: &Value) {
    println!(
        "deployed {} to {} nodes; re-labelled {} photos: top-1 changed for {} of {} ({:.1}%) [{}]",
        d["version"].as_str().unwrap_or("?"),
        d["nodes"],
        d["relabelled"],
        d["changed"],
        d["compared"],
        100.0 * d["changed_fraction"].as_f64().unwrap_or(0.0),
        d["modes"]
            .as_array()
            .map(|m| m
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
}

/// Runs `ndpipe versions`.
pub async fn versions(args: ServerArgs) -> Result<()> {
    let client = Client::new(&args)?;
    let list: Value = client.get_json("/v1/tuner/versions").await?;
    for v in list.as_array().into_iter().flatten() {
        println!(
            "{} {:<40} parent {:<40} {}",
            if v["active"].as_bool().unwrap_or(false) {
                "*"
            } else {
                " "
            },
            v["id"].as_str().unwrap_or("?"),
            v["parent"].as_str().unwrap_or("-"),
            v["metrics"]
        );
    }
    Ok(())
}

/// Flags of `ndpipe rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The version to serve again (see `ndpipe versions`).
    version: String,
}

/// Runs `ndpipe rollback`.
pub async fn rollback(args: RollbackArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let d: Value = client
        .post_json_body(&format!("/v1/tuner/deploy/{}", args.version), &json!({}))
        .await
        .context("rolling back")?;
    print_deploy(&d);
    Ok(())
}
