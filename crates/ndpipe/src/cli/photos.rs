//! `ndpipe photos ...` and `ndpipe compact`: operate on a running store.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

use ndpipe::client::{Client, ServerArgs};

/// Flags of `ndpipe photos`.
#[derive(Debug, Args)]
pub(super) struct PhotosArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// List photos (id, size, dimensions, ground truth), in id order.
    List {
        /// Start after this id.
        #[arg(long)]
        after: Option<u64>,
        /// How many to list.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Write a photo's original bytes to a file (or stdout with `-`).
    Get {
        /// Photo id.
        id: u64,
        /// Output file.
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Print a photo's metadata as JSON.
    Meta {
        /// Photo id.
        id: u64,
    },
    /// Print a photo's predicted labels, per model version.
    Labels {
        /// Photo id.
        id: u64,
    },
    /// Find photos by predicted label (e.g. "tabby"), best score first, in every task; or with
    /// --words by what they show, in your own words ("kitty", "coffee cup").
    Search {
        /// A class name, or one of its comma-separated synonyms (with --words: any words).
        label: String,
        /// Map the words onto the tasks' class names with the words model first.
        #[arg(long, conflicts_with_all = ["task", "model"])]
        words: bool,
        /// Only this task's labels (its active version).
        #[arg(long)]
        task: Option<String>,
        /// Model version (default: every task's active one).
        #[arg(long)]
        model: Option<String>,
        /// How many results.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Find the photos most similar to a stored photo (itself left out), or to a photo file
    /// (not stored), across the cluster: id, score (cosine similarity) and node, most similar
    /// first.
    Similar {
        /// Photo id (or give --file).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        id: Option<u64>,
        /// A photo file to search with instead of a stored photo.
        #[arg(long)]
        file: Option<PathBuf>,
        /// How many results (default: the server's similar_default_k).
        #[arg(long)]
        k: Option<usize>,
    },
    /// Print the groups of duplicate photos, each member with its reason (exact: the same
    /// bytes; near: a resized, recompressed or cropped copy; semantic: alike features) and the
    /// photo to keep.
    Duplicates {
        /// Levels to look at, comma-separated: exact, near, semantic (semantic needs a
        /// PipeStore with a model).
        #[arg(long, default_value = "exact,near")]
        level: String,
        /// How many groups to print at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Delete a photo.
    Delete {
        /// Photo id.
        id: u64,
    },
}

/// Runs `ndpipe photos`.
pub(super) async fn run(args: PhotosArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    match args.action {
        Action::List { after, limit } => list(&client, after, limit).await,
        Action::Get { id, output } => {
            let bytes = client.get_bytes(&format!("/v1/photos/{id}")).await?;
            if output.as_os_str() == "-" {
                std::io::stdout()
                    .write_all(&bytes)
                    .context("writing to stdout")?;
            } else {
                std::fs::write(&output, &bytes)
                    .with_context(|| format!("writing {}", output.display()))?;
                eprintln!("wrote {} bytes to {}", bytes.len(), output.display());
            }
            Ok(())
        }
        Action::Meta { id } => {
            let meta: Value = client.get_json(&format!("/v1/photos/{id}/meta")).await?;
            println!("{}", serde_json::to_string_pretty(&meta)?);
            Ok(())
        }
        Action::Labels { id } => {
            let labels: Value = client.get_json(&format!("/v1/photos/{id}/labels")).await?;
            for version in labels.as_array().into_iter().flatten() {
                println!("{}:", version["model_version"].as_str().unwrap_or("?"));
                for l in version["labels"].as_array().into_iter().flatten() {
                    println!(
                        "  {:.3}  {}",
                        l["score"].as_f64().unwrap_or(0.0),
                        l["label"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(())
        }
        Action::Search {
            label,
            words: true,
            limit,
            ..
        } => {
            let path = format!("/v1/search?q={}&limit={limit}", encode(&label));
            let reply: Value = client.get_json(&path).await?;
            for m in reply["matched"].as_array().into_iter().flatten() {
                println!(
                    "\"{label}\" -> {} ({}, {:.2}, {})",
                    m["class"].as_str().unwrap_or(""),
                    m["task"].as_str().unwrap_or(""),
                    m["score"].as_f64().unwrap_or(0.0),
                    m["how"].as_str().unwrap_or("")
                );
            }
            for h in reply["hits"].as_array().into_iter().flatten() {
                println!(
                    "{:>10}  {:.3}  {}  ({})  on {}",
                    h["id"].as_u64().unwrap_or(0),
                    h["relevance"].as_f64().unwrap_or(0.0),
                    h["label"].as_str().unwrap_or(""),
                    h["task"].as_str().unwrap_or("?"),
                    h["node"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        Action::Search {
            label,
            task,
            model,
            limit,
            ..
        } => {
            let mut path = format!("/v1/search?label={}&limit={limit}", encode(&label));
            if let Some(t) = task {
                path.push_str(&format!("&task={}", encode(&t)));
            }
            if let Some(m) = model {
                path.push_str(&format!("&model={}", encode(&m)));
            }
            let reply: Value = client.get_json(&path).await?;
            for h in reply["hits"].as_array().into_iter().flatten() {
                println!(
                    "{:>10}  {:.3}  rank {}  {}  ({} {})  on {}",
                    h["id"].as_u64().unwrap_or(0),
                    h["score"].as_f64().unwrap_or(0.0),
                    h["rank"].as_u64().unwrap_or(0) + 1,
                    h["label"].as_str().unwrap_or(""),
                    h["task"].as_str().unwrap_or("?"),
                    h["model_version"].as_str().unwrap_or("?"),
                    h["node"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        Action::Similar { id, file, k } => similar(&client, id, file, k).await,
        Action::Duplicates { level, limit } => duplicates(&client, &level, limit).await,
        Action::Delete { id } => {
            client.delete(&format!("/v1/photos/{id}")).await?;
            println!("deleted photo {id}");
            Ok(())
        }
    }
}

/// Prints up to `limit` duplicate groups at `levels`, a page at a time.
async fn duplicates(client: &Client, levels: &str, limit: usize) -> Result<()> {
    let mut after: Option<u64> = None;
    let mut left = limit;
    while left > 0 {
        let mut path = format!(
            "/v1/duplicates?level={}&limit={}",
            encode(levels),
            left.min(1000)
        );
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let page: Value = client.get_json(&path).await?;
        if after.is_none() {
            print_header(&page);
        }
        let groups = page["groups"].as_array().cloned().unwrap_or_default();
        for g in &groups {
            print_group(g);
        }
        left -= groups.len().min(left);
        match page["next_after"].as_u64() {
            Some(n) if !groups.is_empty() => after = Some(n),
            _ => break,
        }
    }
    Ok(())
}

/// What a duplicates answer was searched with, and the photos it could not see yet.
fn print_header(page: &Value) {
    let levels: Vec<&str> = page["levels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    print!("levels {}", levels.join(","));
    if levels.contains(&"near") {
        print!(
            " (near: {} within {} bits, photos of {} px and up)",
            page["near_hash"].as_str().unwrap_or("?"),
            page["near_hamming"].as_u64().unwrap_or(0),
            page["near_min_side"].as_u64().unwrap_or(0)
        );
    }
    println!();
    if let Some(n) = page["unhashed"].as_u64().filter(|n| *n > 0) {
        println!("{n} photos are not hashed yet: the near level does not see them");
    }
}

/// One group: its keeper, then each member with its reason.
fn print_group(g: &Value) {
    let keeper = g["keeper"].as_u64().unwrap_or(0);
    let members = g["members"].as_array().cloned().unwrap_or_default();
    println!(
        "group {}: {} photos, keep {keeper}",
        g["id"].as_u64().unwrap_or(0),
        members.len()
    );
    for m in &members {
        let id = m["id"].as_u64().unwrap_or(0);
        println!(
            "  {:>10}  {:<8}  {:.3}  with {:<10}  {:>11} px  {:>10} bytes{}",
            id,
            m["reason"].as_str().unwrap_or("?"),
            m["score"].as_f64().unwrap_or(0.0),
            m["linked_to"].as_u64().unwrap_or(0),
            m["pixels"].as_u64().unwrap_or(0),
            m["bytes"].as_u64().unwrap_or(0),
            if id == keeper { "  keeper" } else { "" },
        );
    }
}

async fn list(client: &Client, mut after: Option<u64>, limit: usize) -> Result<()> {
    println!(
        "{:>10}  {:>10}  {:>11}  {:<12}  {:<20}  split",
        "id", "bytes", "size", "type", "label"
    );
    let mut left = limit;
    while left > 0 {
        let page_size = left.min(1000);
        let path = match after {
            Some(a) => format!("/v1/photos?after={a}&limit={page_size}"),
            None => format!("/v1/photos?limit={page_size}"),
        };
        let page: Value = client.get_json(&path).await?;
        let photos = page["photos"].as_array().cloned().unwrap_or_default();
        for p in &photos {
            let truth = &p["ground_truth"];
            let num = |k: &str| p[k].as_u64().unwrap_or(0);
            println!(
                "{:>10}  {:>10}  {:>11}  {:<12}  {:<20}  {}",
                num("id"),
                num("bytes"),
                format!("{}x{}", num("width"), num("height")),
                p["content_type"].as_str().unwrap_or(""),
                truth["label"].as_str().unwrap_or("-"),
                truth["split"].as_str().unwrap_or("-"),
            );
        }
        left -= photos.len().min(left);
        match page["next_after"].as_u64() {
            Some(n) if !photos.is_empty() => after = Some(n),
            _ => break,
        }
    }
    Ok(())
}

/// Prints the photos most similar to stored photo `id`, or to the photo in `file`.
async fn similar(
    client: &Client,
    id: Option<u64>,
    file: Option<PathBuf>,
    k: Option<usize>,
) -> Result<()> {
    let query = k.map(|k| format!("?k={k}")).unwrap_or_default();
    let reply: Value = match (id, file) {
        (_, Some(file)) => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            client
                .post_bytes_json(&format!("/v1/similar{query}"), bytes)
                .await?
        }
        (Some(id), None) => {
            client
                .get_json(&format!("/v1/photos/{id}/similar{query}"))
                .await?
        }
        (None, None) => anyhow::bail!("give a photo id or --file"),
    };
    println!("{:>10}  {:>7}  node", "id", "score");
    for h in reply["hits"].as_array().into_iter().flatten() {
        let available = if h["available"].as_bool().unwrap_or(false) {
            ""
        } else {
            "  (not available)"
        };
        println!(
            "{:>10}  {:>7.4}  {}{available}",
            h["id"].as_u64().unwrap_or(0),
            h["score"].as_f64().unwrap_or(0.0),
            h["node"].as_str().unwrap_or("?"),
        );
    }
    for m in reply["not_answered"].as_array().into_iter().flatten() {
        eprintln!(
            "partial: {} did not answer ({})",
            m["node"].as_str().unwrap_or("?"),
            m["reason"].as_str().unwrap_or("")
        );
    }
    for node in reply["building"].as_array().into_iter().flatten() {
        eprintln!(
            "partial: {} is still building its index",
            node.as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// Runs `ndpipe compact`.
pub(super) async fn compact(args: ServerArgs) -> Result<()> {
    let client = Client::new(&args)?;
    let report: Value = client.post_json("/v1/admin/compact").await?;
    let mb = |v: &Value| v.as_f64().unwrap_or(0.0) / 1e6;
    println!(
        "compacted: {:.1} MB -> {:.1} MB, {} records moved, {} volumes removed, {:.2} s",
        mb(&report["bytes_before"]),
        mb(&report["bytes_after"]),
        report["records_moved"],
        report["volumes_removed"],
        report["seconds"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}

/// Percent-encodes a query value.
/// `s` percent-encoded for a URL's query.
pub(super) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
