//! `ndpipe cluster status`: a replicated cluster as one of its PipeStores sees it: the nodes
//! placement chooses from, photos and plain objects at the wanted copies, under-replicated
//! and lost, and the node's repair and rebalancing work. `ndpipe cluster init DIR` makes a
//! new cluster's shared files (`cluster_init.rs`).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use ndpipe::client::{Client, ServerArgs};
use serde_json::Value;

/// Flags of `ndpipe cluster`.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Nodes, copy counts (at target, under-replicated, lost) and repair progress.
    Status,
    /// Make a new cluster's files in DIR: the cluster secret, the admin token, the access
    /// keys' master key (mode 0600) and a configuration file naming them; never overwrites.
    Init {
        /// The folder to make them in (created when missing).
        dir: PathBuf,
    },
}

/// Runs `ndpipe cluster`.
pub(crate) async fn run(args: ClusterArgs) -> Result<()> {
    match args.action {
        Action::Status => {
            let client = Client::new(&args.server)?;
            let status: Value = client.get_json("/v1/cluster").await?;
            print!("{}", render(&status));
        }
        Action::Init { dir } => print!("{}", super::cluster_init::init(&dir)?),
    }
    Ok(())
}

/// The status as lines of text.
fn render(s: &Value) -> String {
    let n = |key: &str| s[key].as_u64().unwrap_or(0);
    let mut out = format!(
        "replicas {}: {} photos at target, {} under-replicated, {} lost, {} deleted\n",
        n("replicas"),
        n("at_target"),
        n("under_replicated"),
        n("lost"),
        n("tombstones")
    );
    let files = |key: &str| s["plain_objects"][key].as_u64().unwrap_or(0);
    out += &format!(
        "plain objects: {} at target, {} under-replicated, {} lost\n",
        files("at_target"),
        files("under_replicated"),
        files("lost")
    );
    for node in s["nodes"].as_array().into_iter().flatten() {
        let state = match (node["live"].as_bool(), node["active"].as_bool()) {
            (Some(true), Some(true)) => "live",
            (Some(true), _) => "live, draining",
            _ => "lease ran out",
        };
        let free = match node["free_bytes"].as_u64() {
            Some(b) => format!("{:.1} GiB free", b as f64 / (1u64 << 30) as f64),
            None => "free space not reported yet".into(),
        };
        out += &format!(
            "  {:<20} {:<16} {free}\n",
            node["name"].as_str().unwrap_or("?"),
            state,
        );
    }
    out += &format!(
        "this node: {} copies made by repair, {} received, {} damaged copies replaced, {} photos moved by rebalancing\n",
        n("copies_made"),
        n("copies_received"),
        n("repaired"),
        n("rebalanced")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_names_every_node_and_count() {
        let status = serde_json::json!({
            "replicas": 2, "at_target": 10, "under_replicated": 3, "lost": 1, "tombstones": 4,
            "plain_objects": {"at_target": 9, "under_replicated": 2, "lost": 0},
            "nodes": [{"name": "a", "live": true, "active": true, "free_bytes": 1u64 << 31},
                      {"name": "b", "live": false, "active": true, "free_bytes": null}],
            "copies_made": 5, "copies_received": 6, "repaired": 7, "rebalanced": 8
        });
        let text = render(&status);
        assert!(
            text.starts_with("replicas 2: 10 photos at target, 3 under-replicated, 1 lost"),
            "{text}"
        );
        assert!(
            text.contains("plain objects: 9 at target, 2 under-replicated, 0 lost"),
            "{text}"
        );
        assert!(
            text.contains("a                    live             2.0 GiB free"),
            "{text}"
        );
        assert!(
            text.contains("b                    lease ran out    free space not reported"),
            "{text}"
        );
        assert!(
            text.contains(
                "5 copies made by repair, 6 received, 7 damaged copies replaced, 8 photos moved"
            ),
            "{text}"
        );
    }
}
