//! Jobs: the re-labelling jobs of `/v1/jobs` with their phase, progress, rate and ETA, the
//! table refreshed live by htmx polling; a form starts a re-labelling (`POST /v1/jobs/relabel`).

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Redirect;

use super::Console;
use super::access::{Checked, Viewer};
use super::page::{Chrome, ConsoleError, iso};
use crate::api::http::{AppState, jobs};
use crate::jobs::JobView;

/// A job as a row: its values, progress and what is left.
pub(crate) struct Row {
    id: String,
    kind: String,
    status: String,
    failed: bool,
    done: u64,
    total: u64,
    percent: u32,
    rate: f64,
    /// Seconds left at the current rate, while running.
    eta_seconds: Option<u64>,
    created: String,
}

impl Row {
    fn of(job: &JobView) -> Self {
        let r = &job.report;
        let percent = (r.done * 100).checked_div(r.total).unwrap_or(100).min(100) as u32;
        let running = job.status == "running";
        let left = r.total.saturating_sub(r.done);
        let eta_seconds = (running && r.images_per_second > 0.0)
            .then(|| (left as f64 / r.images_per_second).ceil() as u64);
        Row {
            id: job.id.clone(),
            kind: job.kind.clone(),
            status: job.status.clone(),
            failed: job.status.starts_with("failed"),
            done: r.done,
            total: r.total,
            percent,
            rate: r.images_per_second,
            eta_seconds,
            created: iso(job.created_ms),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "console/jobs.html")]
pub(crate) struct JobsPage {
    chrome: Chrome,
    rows: Vec<Row>,
}

/// The table alone, for htmx's polling.
#[derive(Template, WebTemplate)]
#[template(path = "console/jobs_table.html")]
pub(crate) struct JobsTable {
    rows: Vec<Row>,
}

/// A PipeStore's state; a gateway runs no jobs.
fn node(console: &Console) -> Result<AppState, ConsoleError> {
    console.node.clone().ok_or_else(|| {
        ConsoleError::new(
            StatusCode::NOT_FOUND,
            "a gateway runs no jobs; see a PipeStore's console",
        )
    })
}

/// Every job, newest first.
async fn rows(console: &Console) -> Result<Vec<Row>, ConsoleError> {
    let listed = jobs::list(State(node(console)?)).await?.0;
    Ok(listed.iter().rev().map(Row::of).collect())
}

/// `GET /ui/jobs`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Result<JobsPage, ConsoleError> {
    Ok(JobsPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        rows: rows(&console).await?,
    })
}

/// `GET /ui/jobs/table`: the rows, polled by the page.
pub(crate) async fn table(State(console): State<Console>) -> Result<JobsTable, ConsoleError> {
    Ok(JobsTable {
        rows: rows(&console).await?,
    })
}

/// `POST /ui/jobs/relabel`: starts re-labelling every photo with the active version.
pub(crate) async fn relabel(
    State(console): State<Console>,
    _: Checked,
) -> Result<Redirect, ConsoleError> {
    let query = Query::try_from_uri(&Uri::from_static("/"));
    let _started = jobs::start_relabel(State(node(&console)?), query).await?;
    Ok(Redirect::to("/ui/jobs"))
}
