//! `ndpipe label`: give many photos a task's class as ground truth at once (by ids, by a
//! search, from a CSV file), accept their predicted labels, or clear them. Labels given here
//! count as ground truth for the task's next fine-tune.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use ndpipe::client::{Client, ServerArgs};

use super::photos::encode;

/// Most photo ids one labelling call carries.
const BATCH: usize = 10_000;
/// Most hits a search labels.
const MAX_SEARCHED: usize = 100_000;

/// Flags of `ndpipe label`.
#[derive(Debug, Args)]
pub(super) struct LabelArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The task (created with `ndpipe tasks create`).
    #[arg(long)]
    task: String,
    /// The class to give (`other` for "none of this task's classes").
    #[arg(long, required_unless_present_any = ["csv", "accept", "clear"])]
    class: Option<String>,
    /// The split: train, val or test.
    #[arg(long, default_value = "train")]
    split: String,
    /// The photos, by id (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["search", "csv"])]
    ids: Vec<u64>,
    /// The photos a search finds (a class name of any task, as `ndpipe photos search`).
    #[arg(long, conflicts_with = "csv")]
    search: Option<String>,
    /// The task whose labels the search reads [default: every task].
    #[arg(long, requires = "search")]
    search_task: Option<String>,
    /// A CSV file of `id,class[,split]` lines (a header line is skipped).
    #[arg(long, conflicts_with_all = ["class", "accept", "clear"])]
    csv: Option<PathBuf>,
    /// Accept the task's predicted label of these photos as their ground truth.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["class", "clear"])]
    accept: Vec<u64>,
    /// Clear the task's ground truth of the photos given by --ids.
    #[arg(long, requires = "ids")]
    clear: bool,
}

/// Runs `ndpipe label`.
pub(super) async fn run(args: LabelArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let path = format!("/v1/tasks/{}/labels", args.task);
    if !args.accept.is_empty() {
        for id in &args.accept {
            let truth: Value = client
                .post_json_body(
                    &format!("/v1/photos/{id}/labels/{}", args.task),
                    &serde_json::json!({ "split": args.split }),
                )
                .await?;
            println!("photo {id}: {} ({})", truth["label"], args.task);
        }
        return Ok(());
    }
    if args.clear {
        let cleared: Value = client
            .delete_json_body(&path, &serde_json::json!({ "ids": args.ids }))
            .await?;
        println!(
            "cleared the {} labels of {} photos",
            args.task, cleared["cleared"]
        );
        return Ok(());
    }
    let groups = match (&args.csv, &args.search, &args.class) {
        (Some(csv), _, _) => read_csv(csv, &args.split)?,
        (None, Some(query), Some(class)) => {
            let ids = searched(&client, query, args.search_task.as_deref()).await?;
            BTreeMap::from([((class.clone(), args.split.clone()), ids)])
        }
        (None, None, Some(class)) if !args.ids.is_empty() => {
            BTreeMap::from([((class.clone(), args.split.clone()), args.ids.clone())])
        }
        _ => bail!("give the photos: --ids, --search or --csv"),
    };
    let (mut labelled, mut missing) = (0usize, Vec::new());
    for ((class, split), ids) in groups {
        for batch in ids.chunks(BATCH) {
            let reply: Value = client
                .post_json_body(
                    &path,
                    &serde_json::json!({ "class": class, "split": split, "ids": batch }),
                )
                .await?;
            labelled += reply["labelled"].as_array().map_or(0, Vec::len);
            missing.extend(reply["missing"].as_array().into_iter().flatten().cloned());
        }
    }
    println!("labelled {labelled} photos for task {}", args.task);
    if !missing.is_empty() {
        println!(
            "{} photos were not found (deleted, or held by another node): {}",
            missing.len(),
            serde_json::to_string(&missing)?
        );
    }
    Ok(())
}

/// The ids of every photo a search finds (at most [`MAX_SEARCHED`]).
async fn searched(client: &Client, query: &str, task: Option<&str>) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    let mut offset = 0;
    loop {
        let mut path = format!(
            "/v1/search?label={}&limit=1000&offset={offset}",
            encode(query)
        );
        if let Some(task) = task {
            path.push_str(&format!("&task={}", encode(task)));
        }
        let reply: Value = client.get_json(&path).await?;
        ids.extend(
            reply["hits"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|h| h["id"].as_u64()),
        );
        match reply["next_offset"].as_u64() {
            Some(next) if ids.len() < MAX_SEARCHED => offset = next,
            _ => break,
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The photos of a CSV file of `id,class[,split]` lines, by (class, split).
fn read_csv(path: &PathBuf, split: &str) -> Result<BTreeMap<(String, String), Vec<u64>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut groups: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.iter().all(|f| f.is_empty()) {
            continue;
        }
        let Ok(id) = fields[0].parse::<u64>() else {
            if n == 0 {
                continue;
            }
            bail!(
                "{}:{}: {:?} is not a photo id",
                path.display(),
                n + 1,
                fields[0]
            );
        };
        let Some(class) = fields.get(1).filter(|c| !c.is_empty()) else {
            bail!("{}:{}: no class after the id", path.display(), n + 1);
        };
        let split = fields.get(2).filter(|s| !s.is_empty()).unwrap_or(&split);
        groups
            .entry((class.to_string(), split.to_string()))
            .or_default()
            .push(id);
    }
    Ok(groups)
}
