//! `ndpipe relabel`: re-label every stored photo on the store itself, with progress.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use ndpipe::client::{Client, ServerArgs};

/// Flags of `ndpipe relabel`.
#[derive(Debug, Args)]
pub(super) struct RelabelArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Model version to label with (default: the one the store runs).
    #[arg(long)]
    model: Option<String>,
    /// Start the job and return its id without waiting.
    #[arg(long)]
    no_wait: bool,
}

/// Runs `ndpipe relabel`.
pub(super) async fn run(args: RelabelArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let path = match &args.model {
        Some(m) => format!("/v1/jobs/relabel?model={m}"),
        None => "/v1/jobs/relabel".to_string(),
    };
    let started: Value = client.post_json(&path).await?;
    let id = started["id"].as_str().unwrap_or_default().to_string();
    if args.no_wait {
        println!("{id}");
        return Ok(());
    }
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} photos, {msg}",
    )?);
    let job = loop {
        let job: Value = client.get_json(&format!("/v1/jobs/{id}")).await?;
        let report = &job["report"];
        bar.set_length(report["total"].as_u64().unwrap_or(0));
        bar.set_position(
            report["done"]
                .as_u64()
                .unwrap_or(0)
                .min(report["total"].as_u64().unwrap_or(0)),
        );
        bar.set_message(format!(
            "{:.0} img/s",
            report["images_per_second"].as_f64().unwrap_or(0.0)
        ));
        if job["status"] != "running" {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    bar.finish_and_clear();
    let r = &job["report"];
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    println!(
        "re-labelled {} photos with {} in {:.1} s: {:.1} img/s wall-clock, {:.1} img/s model-only; \
         top-1 changed for {} of {} ({:.1}%); skipped {}",
        r["done"],
        r["model_version"].as_str().unwrap_or("?"),
        f("wall_seconds"),
        f("images_per_second"),
        f("model_images_per_second"),
        r["changed"],
        r["compared"],
        100.0 * f("changed_fraction"),
        r["skipped"].as_array().map_or(0, Vec::len)
    );
    for s in r["skipped"].as_array().into_iter().flatten().take(10) {
        println!("  skipped photo {}: {}", s[0], s[1].as_str().unwrap_or(""));
    }
    match job["status"].as_str() {
        Some("done") => Ok(()),
        Some(other) => bail!("job {id} ended as {other}"),
        None => bail!("job {id} has no status"),
    }
}
