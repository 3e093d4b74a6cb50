//! `ndpipe nodes list|drain|activate|remove`: the Tuner's PipeStores, their state, lease and
//! version, and membership changes (writes need the bearer token).

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_tuner::{JobResult, JobView, NodeView, RepairReport};
use ndpipe_util::time::now_ms;
use serde::Deserialize;

/// Flags of `ndpipe nodes`.
#[derive(Debug, Args)]
pub(crate) struct NodesArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Every registered PipeStore: state, lease, the version it serves.
    List,
    /// Take a node out of new work (fine-tuning jobs and deploys); it keeps serving its photos.
    Drain {
        /// The node's name.
        name: String,
    },
    /// Let a drained node take work again.
    Activate {
        /// The node's name.
        name: String,
    },
    /// Forget a node (one that is gone for good); it must register again to come back. On a
    /// replicated cluster a repair job follows the copies of what it held.
    Remove {
        /// The node's name.
        name: String,
        /// Follow the repair job until every photo and plain object is back at its copies.
        #[arg(long)]
        wait: bool,
    },
}

/// Runs `ndpipe nodes`.
pub(crate) async fn run(args: NodesArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let node = |name: &str, what: &str| format!("/v1/tuner/nodes/{name}/{what}");
    match args.action {
        Action::List => {
            let nodes: Vec<NodeView> = client.get_json("/v1/tuner/nodes").await?;
            for n in &nodes {
                println!("{}", line(n, now_ms()));
            }
        }
        Action::Drain { name } => {
            let n: NodeView = client.post_json(&node(&name, "drain")).await?;
            println!("{}", line(&n, now_ms()));
        }
        Action::Activate { name } => {
            let n: NodeView = client.post_json(&node(&name, "activate")).await?;
            println!("{}", line(&n, now_ms()));
        }
        Action::Remove { name, wait } => {
            let removed: Removed = client
                .delete_json(&format!("/v1/tuner/nodes/{name}"))
                .await?;
            println!("removed {name}");
            let Some(job) = removed.repair_job else {
                return Ok(());
            };
            if !wait {
                println!("repair job {} follows the copies of what it held", job.id);
                return Ok(());
            }
            let job = super::finetune::follow(&client, job, "copies").await?;
            let Some(JobResult::Repair(r)) = &job.result else {
                bail!("job {} ended without a repair report", job.id);
            };
            println!("{}", repaired(r));
        }
    }
    Ok(())
}

/// What removing a node answers.
#[derive(Debug, Deserialize)]
struct Removed {
    repair_job: Option<JobView>,
}

/// A finished repair as one line.
fn repaired(r: &RepairReport) -> String {
    format!(
        "repair after removing {} done in {:.1} s: {} photos and {} plain objects back at {} copies; {} photos and {} plain objects lost",
        r.node,
        r.seconds,
        r.photos_short,
        r.plain_objects_short,
        r.replicas,
        r.photos_lost,
        r.plain_objects_lost
    )
}

/// One node as `ndpipe nodes list` prints it.
fn line(n: &NodeView, now: i64) -> String {
    let lease = if n.live {
        format!(
            "lease {:.0} s left",
            (n.lease_expires_ms - now) as f64 / 1000.0
        )
    } else {
        format!(
            "lease ran out {:.0} s ago",
            (now - n.lease_expires_ms) as f64 / 1000.0
        )
    };
    let sync = match (&n.sync_error, n.in_sync) {
        (_, true) => String::new(),
        (Some(e), false) => format!(" (not on the active version: {e})"),
        (None, false) => " (being brought to the active version)".to_string(),
    };
    format!(
        "{:>3} {:<20} {:<8} {:<22} {:<40} {}{sync}",
        n.id,
        n.name,
        n.state,
        lease,
        n.version.as_deref().unwrap_or("-"),
        n.url
    )
}
