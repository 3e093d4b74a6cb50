//! The model registry: the Tuner's backbones and, per task, its versions with their parents
//! and metrics (`GET /v1/tuner/backbones`, `GET /v1/tuner/versions`); Deploy a candidate and
//! Rollback to the active version's parent, both `POST /v1/tuner/deploy/{version}`.

use std::collections::BTreeMap;

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::{Form, State};
use axum::http::Method;
use axum::response::Redirect;
use ndpipe_catalog::ModelVersion;
use serde::Deserialize;

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, iso};
use super::train_job::JobView;
use super::tuner::{self, NO_TUNER};

/// A backbone the Tuner keeps.
#[derive(Debug, Deserialize)]
struct Backbone {
    backbone: String,
    name: String,
    model_version: String,
    feature_dim: usize,
    num_classes: usize,
    bytes: u64,
}

/// A version as a row of the registry.
struct Row {
    id: String,
    backbone: String,
    parent: Option<String>,
    created: String,
    active: bool,
    val_top1: Option<f64>,
    gate_passed: Option<bool>,
    train_images: Option<u64>,
}

impl Row {
    fn of(v: &ModelVersion) -> Self {
        Row {
            id: v.id.clone(),
            backbone: short(&v.backbone),
            parent: v.parent.clone(),
            created: iso(v.created_ms),
            active: v.active,
            val_top1: v.metrics["val_top1"].as_f64(),
            gate_passed: v.metrics["gate_passed"].as_bool(),
            train_images: v.metrics["train_images"].as_u64(),
        }
    }
}

/// A task's versions, newest first, and the version a rollback returns to.
struct TaskVersions {
    task: String,
    rows: Vec<Row>,
    /// The active version's parent, when it has one.
    rollback_to: Option<String>,
}

/// The first 12 hex digits of a sha256.
fn short(hash: &str) -> String {
    hash.chars().take(12).collect()
}

#[derive(Template, WebTemplate)]
#[template(path = "console/models.html")]
pub(crate) struct ModelsPage {
    chrome: Chrome,
    /// The registry, or why it cannot be seen here.
    registry: Result<(Vec<Backbone>, Vec<TaskVersions>), String>,
}

/// Versions grouped by task (in name order), newest first.
fn by_task(versions: Vec<ModelVersion>) -> Vec<TaskVersions> {
    let mut tasks: BTreeMap<String, Vec<ModelVersion>> = BTreeMap::new();
    for v in versions {
        tasks.entry(v.task.to_string()).or_default().push(v);
    }
    tasks
        .into_iter()
        .map(|(task, mut versions)| {
            versions.sort_by_key(|v| std::cmp::Reverse(v.created_ms));
            let rollback_to = versions
                .iter()
                .find(|v| v.active)
                .and_then(|v| v.parent.clone());
            TaskVersions {
                task,
                rows: versions.iter().map(Row::of).collect(),
                rollback_to,
            }
        })
        .collect()
}

/// `GET /ui/models`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Result<ModelsPage, ConsoleError> {
    let registry = if console.tuner.is_none() {
        Err(NO_TUNER.to_string())
    } else {
        let backbones: Vec<Backbone> = tuner::call(
            &console,
            &viewer,
            (Method::GET, "/v1/tuner/backbones"),
            None,
        )
        .await?;
        let versions: Vec<ModelVersion> =
            tuner::call(&console, &viewer, (Method::GET, "/v1/tuner/versions"), None).await?;
        Ok((backbones, by_task(versions)))
    };
    Ok(ModelsPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        registry,
    })
}

/// The deploy form (a candidate's Deploy, or a Rollback to the parent).
#[derive(Debug, Deserialize)]
pub(crate) struct DeployForm {
    csrf: Option<String>,
    version: String,
}

/// `POST /ui/models/deploy`: deploys the version to every node (`POST
/// /v1/tuner/deploy/{version}`) and shows the job running.
pub(crate) async fn deploy(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Form(form): Form<DeployForm>,
) -> Result<Redirect, ConsoleError> {
    viewer.check_csrf(form.csrf.as_deref())?;
    let version: String = form_urlencoded::byte_serialize(form.version.as_bytes()).collect();
    let path = format!("/v1/tuner/deploy/{version}");
    let started: JobView = tuner::call(&console, &viewer, (Method::POST, &path), None).await?;
    Ok(Redirect::to(&format!("/ui/train/jobs/{}", started.id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndpipe_catalog::TaskName;

    fn version(id: &str, parent: Option<&str>, created_ms: i64, active: bool) -> ModelVersion {
        ModelVersion {
            id: id.into(),
            task: "tops".parse::<TaskName>().unwrap(),
            backbone: "ab".repeat(32),
            parent: parent.map(str::to_string),
            metrics: serde_json::json!({"val_top1": 0.9, "gate_passed": true}),
            created_ms,
            active,
        }
    }

    #[test]
    fn a_rollback_returns_to_the_active_versions_parent() {
        let tasks = by_task(vec![
            version("v1", None, 1, false),
            version("v2", Some("v1"), 2, true),
            version("v3", Some("v2"), 3, false),
        ]);
        assert_eq!(tasks.len(), 1);
        let ids: Vec<&str> = tasks[0].rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["v3", "v2", "v1"], "newest first");
        assert_eq!(tasks[0].rollback_to.as_deref(), Some("v1"));
        assert_eq!(tasks[0].rows[0].backbone.len(), 12);
    }
}
