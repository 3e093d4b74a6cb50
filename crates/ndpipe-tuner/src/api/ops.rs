//! Health, readiness and metrics of a standalone Tuner (an embedded one leaves them to its
//! PipeStore): `GET /healthz` (the process serves), `GET /readyz` (its catalog answers; 503
//! otherwise) and `GET /metrics` (nodes and jobs, OpenMetrics).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::NodeState;
use ndpipe_util::http::error_response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::Tuner;

/// `GET /healthz`: the process is alive and serves HTTP; `insecure_cluster` when its gRPC runs
/// without a cluster secret and without mutual TLS.
pub(crate) async fn health(State(tuner): State<Arc<Tuner>>) -> Json<Value> {
    Json(json!({"status": "ok", "insecure_cluster": tuner.insecure_cluster()}))
}

/// `GET /readyz`: 200 with the node counts when the catalog answers, else 503.
pub(crate) async fn ready(State(tuner): State<Arc<Tuner>>) -> Response {
    match tuner.nodes() {
        Ok(nodes) => Json(json!({
            "status": "ready",
            "nodes": nodes.len(),
            "live": nodes.iter().filter(|n| n.live).count(),
        }))
        .into_response(),
        Err(e) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            &format!("the catalog does not answer: {e}"),
        ),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    state: String,
    live: String,
    in_sync: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    kind: String,
    phase: String,
}

/// `GET /metrics`: registered nodes by state, liveness and sync, and jobs by kind and phase,
/// read from the catalog at each scrape.
pub(crate) async fn metrics(State(tuner): State<Arc<Tuner>>) -> Response {
    let (nodes, jobs) = match (tuner.nodes(), tuner.jobs()) {
        (Ok(nodes), Ok(jobs)) => (nodes, jobs),
        (Err(e), _) | (_, Err(e)) => {
            return error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", &e.to_string());
        }
    };
    let by_node = Family::<NodeLabels, Gauge>::default();
    for n in &nodes {
        let state = match n.state {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
        };
        by_node
            .get_or_create(&NodeLabels {
                state: state.into(),
                live: n.live.to_string(),
                in_sync: n.in_sync.to_string(),
            })
            .inc();
    }
    let by_job = Family::<JobLabels, Gauge>::default();
    for j in &jobs {
        let name = |v: Value| v.as_str().unwrap_or("unknown").to_string();
        by_job
            .get_or_create(&JobLabels {
                kind: name(json!(j.kind)),
                phase: name(json!(j.phase)),
            })
            .inc();
    }
    let mut registry = Registry::with_prefix("ndpipe_tuner");
    registry.register("nodes", "Registered PipeStores", by_node);
    registry.register("jobs", "Jobs in the job log", by_job);
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &registry) {
        return error_response(StatusCode::INTERNAL_SERVER_ERROR, "metrics", &e.to_string());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
