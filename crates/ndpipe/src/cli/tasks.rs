//! `ndpipe tasks`: the store's tasks (named classifiers over the backbone: `general`, the
//! backbone's own, `default`, and your own): list, create, show one, set its score floor.

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::Value;

use ndpipe::client::{Client, ServerArgs};

/// Flags of `ndpipe tasks`.
#[derive(Debug, Args)]
pub(super) struct TasksArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Every task, with its active version, labelled photos and share of `other`.
    List,
    /// Create a task; label photos for it (`ndpipe label`, or `import --task`), then fine-tune
    /// it (`ndpipe finetune --task`).
    Create {
        /// Its name: lower-case letters, digits, `-` and `_`.
        name: String,
        /// The least probability of a label it keeps (default: the one calibrated with each
        /// head, 0.5 unless the fine-tune says otherwise).
        #[arg(long)]
        floor: Option<f32>,
    },
    /// One task, with its ground truth per class and split.
    Show {
        /// The task.
        name: String,
    },
    /// Set (or with --no-floor clear) a task's own score floor: labels from then on keep it.
    Set {
        /// The task.
        name: String,
        /// The least probability of a label it keeps.
        #[arg(
            long,
            conflicts_with = "no_floor",
            required_unless_present = "no_floor"
        )]
        floor: Option<f32>,
        /// Use each head's calibrated floor again.
        #[arg(long)]
        no_floor: bool,
    },
}

/// Runs `ndpipe tasks`.
pub(super) async fn run(args: TasksArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    match args.action {
        Action::List => {
            let tasks: Vec<Value> = client.get_json("/v1/tasks").await?;
            println!(
                "{:<16} {:<42} {:>8} {:>8} {:>7}",
                "task", "active version", "floor", "labelled", "other"
            );
            for t in &tasks {
                println!(
                    "{:<16} {:<42} {:>8} {:>8} {:>6.1}%",
                    text(&t["name"]),
                    t["active_version"]["id"].as_str().unwrap_or("-"),
                    t["floor"]
                        .as_f64()
                        .map_or("head's".to_string(), |f| format!("{f:.2}")),
                    t["labelled"].as_u64().unwrap_or(0),
                    100.0 * t["other_share"].as_f64().unwrap_or(0.0)
                );
            }
        }
        Action::Create { name, floor } => {
            let task: Value = client
                .post_json_body(
                    "/v1/tasks",
                    &serde_json::json!({ "name": name, "floor": floor }),
                )
                .await?;
            println!("created task {}", text(&task["name"]));
        }
        Action::Show { name } => {
            let task: Value = client.get_json(&format!("/v1/tasks/{name}")).await?;
            show(&task);
        }
        Action::Set {
            name,
            floor,
            no_floor,
        } => {
            let floor = if no_floor { None } else { floor };
            let task: Value = client
                .put_json_body(
                    &format!("/v1/tasks/{name}"),
                    &serde_json::json!({ "floor": floor }),
                )
                .await?;
            show(&task);
        }
    }
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

fn show(task: &Value) {
    println!(
        "task {}: active version {}, floor {}, {} photos labelled ({} other, {:.1}%)",
        text(&task["name"]),
        task["active_version"]["id"].as_str().unwrap_or("none"),
        task["floor"]
            .as_f64()
            .map_or("the head's".to_string(), |f| format!("{f:.2}")),
        task["labelled"].as_u64().unwrap_or(0),
        task["other"].as_u64().unwrap_or(0),
        100.0 * task["other_share"].as_f64().unwrap_or(0.0)
    );
    println!("{:<24} {:>7} {:>7} {:>7}", "class", "train", "val", "test");
    for c in task["ground_truth"].as_array().into_iter().flatten() {
        println!(
            "{:<24} {:>7} {:>7} {:>7}",
            text(&c["class"]),
            c["train"].as_u64().unwrap_or(0),
            c["val"].as_u64().unwrap_or(0),
            c["test"].as_u64().unwrap_or(0)
        );
    }
}
