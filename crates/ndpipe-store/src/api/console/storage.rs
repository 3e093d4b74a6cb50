//! Storage and cache: ingest and label rates over time from the process's own counters (the
//! ring of [`super::history`], drawn with uPlot by `charts.js`, a table without script), and
//! the training cache's hit ratio per policy from the fine-tunes that trained through it (the
//! Tuner's job reports: that is where the cache's counters live).

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::State;
use axum::http::Method;
use axum::{Extension, Json};

use super::Console;
use super::access::Viewer;
use super::history::{EVERY, Rate, Sample};
use super::page::{Chrome, ConsoleError, iso};
use super::train_job::{CacheView, JobView};
use super::tuner::{self, NO_TUNER};

/// Rates shown in the table (the newest).
const TABLE_ROWS: usize = 12;

/// One fine-tune that trained through the cache.
struct CacheRow {
    job: String,
    task: String,
    created: String,
    cache: CacheView,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/storage.html")]
pub(crate) struct StoragePage {
    chrome: Chrome,
    now: Option<Sample>,
    /// The newest rates, newest first, with their time.
    rates: Vec<(String, Rate)>,
    every_secs: u64,
    kept: usize,
    /// The fine-tunes that trained through the cache, or why they cannot be seen here.
    cache: Result<Vec<CacheRow>, String>,
}

/// `GET /ui/storage`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Result<StoragePage, ConsoleError> {
    let samples = console.history.samples();
    let rates = console
        .history
        .rates()
        .into_iter()
        .rev()
        .take(TABLE_ROWS)
        .map(|r| (iso((r.at * 1000.0) as i64), r))
        .collect();
    Ok(StoragePage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        now: samples.last().copied(),
        rates,
        every_secs: EVERY.as_secs(),
        kept: samples.len(),
        cache: cache_rows(&console, &viewer).await,
    })
}

/// The fine-tunes of this process's Tuner that trained through the cache, newest first.
async fn cache_rows(console: &Console, viewer: &Viewer) -> Result<Vec<CacheRow>, String> {
    if console.tuner.is_none() {
        return Err(NO_TUNER.to_string());
    }
    let jobs: Vec<JobView> = tuner::call(console, viewer, (Method::GET, "/v1/tuner/jobs"), None)
        .await
        .map_err(|e| e.message().to_string())?;
    Ok(jobs
        .iter()
        .rev()
        .filter_map(|j| {
            let cache = j.finetune()?.cache?;
            Some(CacheRow {
                job: j.id.clone(),
                task: j.task().to_string(),
                created: j.created(),
                cache,
            })
        })
        .collect())
}

/// `GET /ui/storage/rates`: every rate of the ring, oldest first, for the chart.
pub(crate) async fn rates(State(console): State<Console>) -> Json<Vec<Rate>> {
    Json(console.history.rates())
}
