//! The cluster: nodes with their state and free disk, replication health (`GET /v1/cluster`,
//! the `Objects` seam's status), or "single node" where photos have one copy. A cluster that
//! does not answer within [`DEADLINE`] makes the panel say so; the page still renders.

use std::time::Duration;

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, reply};
use crate::api::http::cluster;

/// How long the page waits for the cluster's status.
const DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
pub(crate) struct Status {
    replicas: u32,
    nodes: Vec<Node>,
    at_target: u64,
    under_replicated: u64,
    lost: u64,
    tombstones: u64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Node {
    name: String,
    live: bool,
    active: bool,
    free_bytes: Option<u64>,
    last_seen_ms: Option<i64>,
    photos: Option<u64>,
}

impl Node {
    /// Seconds since its last heartbeat (the age of its lease), or "unknown".
    fn lease_age(&self) -> String {
        let Some(seen) = self.last_seen_ms else {
            return "unknown".into();
        };
        let age_ms = ndpipe_util::time::now_ms().saturating_sub(seen).max(0);
        format!("{:.1} s ago", age_ms as f64 / 1000.0)
    }

    /// The photos it holds, or "unknown".
    fn photos(&self) -> String {
        self.photos
            .map_or_else(|| "unknown".into(), |p| p.to_string())
    }

    fn free(&self) -> String {
        self.free_bytes.map_or_else(
            || "unknown".into(),
            |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        )
    }
}

/// What the panel shows.
pub(crate) enum Panel {
    Cluster(Status),
    SingleNode,
    Unanswered(String),
}

#[derive(Template, WebTemplate)]
#[template(path = "console/cluster.html")]
pub(crate) struct ClusterPage {
    chrome: Chrome,
    panel: Panel,
}

/// `GET /ui/cluster`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> ClusterPage {
    let asked = cluster::status(State(console.front.clone()));
    let panel =
        match tokio::time::timeout(DEADLINE, async { reply::<Status>(asked.await).await }).await {
            Ok(Ok(status)) => Panel::Cluster(status),
            Ok(Err(e)) if e.status() == StatusCode::NOT_FOUND => Panel::SingleNode,
            Ok(Err(e)) => Panel::Unanswered(e.message().to_string()),
            Err(_) => Panel::Unanswered(format!(
                "the cluster did not answer within {} s",
                DEADLINE.as_secs()
            )),
        };
    ClusterPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        panel,
    }
}
