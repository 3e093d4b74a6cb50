//! Label and train: per task, how many labelled photos each class has; photos picked from a
//! grid (every photo, or a search by class) get a task's class (`POST /v1/tasks/{task}/labels`);
//! a fine-tune of the task starts on the Tuner (`POST /v1/tuner/finetune`) and is watched on
//! its own page ([`super::train_job`]).

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::{Method, Uri};
use axum::response::Redirect;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, reply};
use super::photos::Card;
use super::train_job::JobView;
use super::tuner::{self, NO_TUNER};
use crate::api::http::{photos, tasks};

/// Photos per page of the picking grid.
const PER_PAGE: usize = 60;
/// Fine-tunes of the task listed on the page.
const RECENT_JOBS: usize = 10;

/// A task as `GET /v1/tasks` shows it.
#[derive(Debug, Deserialize)]
pub(crate) struct TaskRow {
    pub(crate) name: String,
    builtin: bool,
    active_version: Option<VersionId>,
    ground_truth: Vec<ClassCount>,
    labelled: u64,
    other: u64,
}

#[derive(Debug, Deserialize)]
struct VersionId {
    id: String,
}

/// Labelled photos of one class, per split.
#[derive(Debug, Deserialize)]
struct ClassCount {
    class: String,
    train: u64,
    val: u64,
    test: u64,
}

/// The page's query: the task, the grid's page or search, and what the last change did.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TrainQuery {
    task: Option<String>,
    label: Option<String>,
    after: Option<u64>,
    note: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/train.html")]
pub(crate) struct TrainPage {
    chrome: Chrome,
    tasks: Vec<TaskRow>,
    /// The selected task (the first trainable one unless the query names one).
    task: Option<TaskRow>,
    /// The class search of the grid, if any.
    label: String,
    cards: Vec<Card>,
    more: Option<String>,
    /// The task's recent fine-tunes, or why they cannot be seen here.
    jobs: Result<Vec<JobView>, String>,
    note: Option<String>,
}

/// `GET /ui/train`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(query): Query<TrainQuery>,
) -> Result<TrainPage, ConsoleError> {
    let node = console.node_state("tasks")?;
    let mut all: Vec<TaskRow> = reply(tasks::list(State(node)).await).await?;
    let wanted = query.task.clone().filter(|t| !t.is_empty());
    let index = match &wanted {
        Some(name) => all.iter().position(|t| &t.name == name),
        None => all.iter().position(|t| !t.builtin),
    };
    let task = index.map(|i| all.remove(i));
    let label = query.label.clone().unwrap_or_default();
    let task_name = task.as_ref().map_or("", |t| t.name.as_str());
    let (cards, more) = grid(&console, &label, task_name, query.after).await?;
    let jobs = recent_jobs(&console, &viewer, task_name).await;
    Ok(TrainPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        tasks: all,
        task,
        label,
        cards,
        more,
        jobs,
        note: query.note,
    })
}

/// The photos to pick from: a search for class `label` of any task, or every photo in id
/// order after `after`; and the link to the next page.
async fn grid(
    console: &Console,
    label: &str,
    task: &str,
    after: Option<u64>,
) -> Result<(Vec<Card>, Option<String>), ConsoleError> {
    let base = |extra: &str| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("task", task)
            .append_pair("label", label)
            .finish();
        format!("/ui/train?{q}{extra}")
    };
    if !label.trim().is_empty() {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("label", label.trim())
            .append_pair("limit", &PER_PAGE.to_string())
            .finish();
        let uri: Uri = format!("/?{q}").parse().map_err(ConsoleError::internal)?;
        let found = super::search::run(console, &uri).await?;
        return Ok((found.hits.iter().map(|h| h.card()).collect(), None));
    }
    let raw = match after {
        Some(a) => format!("/?after={a}&limit={PER_PAGE}"),
        None => format!("/?limit={PER_PAGE}"),
    };
    let uri: Uri = raw.parse().map_err(ConsoleError::internal)?;
    let listed: Listed =
        reply(photos::list(State(console.front.clone()), Query::try_from_uri(&uri)).await).await?;
    let cards = listed
        .photos
        .iter()
        .map(|p| Card {
            id: p.id,
            labels: Vec::new(),
            score: None,
        })
        .collect();
    let more = listed.next_after.map(|a| base(&format!("&after={a}")));
    Ok((cards, more))
}

#[derive(Debug, Deserialize)]
struct Listed {
    photos: Vec<Listing>,
    next_after: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Listing {
    id: u64,
}

/// The newest fine-tunes of `task` on this process's Tuner, or why there are none to see.
async fn recent_jobs(
    console: &Console,
    viewer: &Viewer,
    task: &str,
) -> Result<Vec<JobView>, String> {
    if console.tuner.is_none() {
        return Err(NO_TUNER.to_string());
    }
    let all: Vec<JobView> = tuner::call(console, viewer, (Method::GET, "/v1/tuner/jobs"), None)
        .await
        .map_err(|e| e.message().to_string())?;
    Ok(all
        .into_iter()
        .rev()
        .filter(|j| j.kind == "finetune" && j.task() == task)
        .take(RECENT_JOBS)
        .collect())
}

/// The labelling form: the task, the class, the split and the checked photos' ids.
#[derive(Debug, Default)]
struct LabelForm {
    csrf: Option<String>,
    task: String,
    class: String,
    split: Option<String>,
    ids: Vec<u64>,
}

impl LabelForm {
    /// The form from its urlencoded body (`id` repeats, which serde's forms do not take).
    fn parse(body: &[u8]) -> Result<Self, ConsoleError> {
        let mut form = LabelForm::default();
        for (name, value) in form_urlencoded::parse(body) {
            match name.as_ref() {
                "csrf" => form.csrf = Some(value.into_owned()),
                "task" => form.task = value.into_owned(),
                "class" => form.class = value.trim().to_string(),
                "split" if !value.is_empty() => form.split = Some(value.into_owned()),
                "id" => form.ids.push(value.parse().map_err(|_| {
                    ConsoleError::bad_request(format!("photo id {value} is not a number"))
                })?),
                _ => {}
            }
        }
        Ok(form)
    }
}

/// `POST /ui/train/label`: gives the checked photos the class as the task's ground truth,
/// through `POST /v1/tasks/{task}/labels`.
pub(crate) async fn label(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    body: Bytes,
) -> Result<Redirect, ConsoleError> {
    let form = LabelForm::parse(&body)?;
    viewer.check_csrf(form.csrf.as_deref())?;
    if form.ids.is_empty() {
        return Err(ConsoleError::bad_request("check at least one photo"));
    }
    let labelling: tasks::Labelling = serde_json::from_value(json!({
        "class": form.class,
        "split": form.split,
        "ids": form.ids,
    }))
    .map_err(|e| ConsoleError::bad_request(e.to_string()))?;
    let node = console.node_state("tasks")?;
    let done: Labelled = reply(
        tasks::label(
            State(node),
            Path(form.task.clone()),
            Ok(axum::Json(labelling)),
        )
        .await,
    )
    .await?;
    let mut note = format!("{} photos labelled {}", done.labelled.len(), form.class);
    if !done.missing.is_empty() {
        note.push_str(&format!(" ({} not found)", done.missing.len()));
    }
    Ok(Redirect::to(&task_url(&form.task, &note)))
}

#[derive(Debug, Deserialize)]
struct Labelled {
    labelled: Vec<u64>,
    missing: Vec<u64>,
}

/// `/ui/train` for `task`, saying `note`.
fn task_url(task: &str, note: &str) -> String {
    let q = form_urlencoded::Serializer::new(String::new())
        .append_pair("task", task)
        .append_pair("note", note)
        .finish();
    format!("/ui/train?{q}")
}

/// The fine-tune form.
#[derive(Debug, Deserialize)]
pub(crate) struct FinetuneForm {
    csrf: Option<String>,
    task: String,
    runs: Option<u32>,
    epochs: Option<usize>,
    /// Deploy at once when the gate passes (unchecked: the version waits as a candidate).
    deploy: Option<String>,
}

/// `POST /ui/train/finetune`: starts a fine-tune of the task (`POST /v1/tuner/finetune`) and
/// shows it running.
pub(crate) async fn finetune(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Form(form): Form<FinetuneForm>,
) -> Result<Redirect, ConsoleError> {
    viewer.check_csrf(form.csrf.as_deref())?;
    let mut request = json!({"task": form.task, "deploy": form.deploy.is_some()});
    if let Some(runs) = form.runs {
        request["runs"] = json!(runs);
    }
    if let Some(epochs) = form.epochs {
        request["epochs"] = json!(epochs);
    }
    let path = (Method::POST, "/v1/tuner/finetune");
    let started: JobView = tuner::call(&console, &viewer, path, Some(request)).await?;
    Ok(Redirect::to(&format!("/ui/train/jobs/{}", started.id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_form_takes_every_checked_photo() {
        let form = LabelForm::parse(b"csrf=t&task=tops&class=+shirt+&split=&id=3&id=5").unwrap();
        assert_eq!(form.ids, vec![3, 5]);
        assert_eq!((form.task.as_str(), form.class.as_str()), ("tops", "shirt"));
        assert_eq!(form.split, None);
        assert_eq!(form.csrf.as_deref(), Some("t"));
        let bad = LabelForm::parse(b"id=x").err().unwrap();
        assert_eq!(bad.status(), axum::http::StatusCode::BAD_REQUEST);
    }
}
