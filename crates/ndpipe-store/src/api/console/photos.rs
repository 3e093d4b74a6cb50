//! The photos: a grid of thumbnails with each task's top label, paged and filtered by task
//! and class (the search of `/v1/search`), and a photo's page (the original, labels per
//! version, metadata, similar photos, its duplicates group), with its deletion.

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::Console;
use super::access::{Checked, Viewer};
use super::page::{Chrome, ConsoleError, iso, reply};
use super::search::{Hit, Searched};
use crate::api::http::{FrontState, duplicates, labels, parse_id, photos};
use crate::similar::Answer;

/// Photos per page of the grid.
const PER_PAGE: usize = 60;
/// Similar photos on a photo's page.
const SIMILAR: usize = 12;

/// One photo of the grid.
pub(crate) struct Card {
    pub(crate) id: u64,
    /// Each task's top label, or the search's hit.
    pub(crate) labels: Vec<String>,
    /// The search's score, when the grid is a search.
    pub(crate) score: Option<f32>,
}

/// The grid's filter and page, as its query string gives them.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct GridQuery {
    label: Option<String>,
    task: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/photos.html")]
pub(crate) struct GridPage {
    chrome: Chrome,
    label: String,
    task: String,
    cards: Vec<Card>,
    more: Option<String>,
}

/// The next cards of an infinite grid (htmx swaps them in for the "more" link).
#[derive(Template, WebTemplate)]
#[template(path = "console/cards.html")]
pub(crate) struct Cards {
    cards: Vec<Card>,
    more: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ListView {
    photos: Vec<MetaView>,
    next_after: Option<u64>,
}

/// A photo's metadata as `GET /v1/photos/{id}/meta` answers it.
#[derive(Debug, Deserialize)]
pub(crate) struct MetaView {
    pub(crate) id: u64,
    bytes: u64,
    width: u32,
    height: u32,
    content_type: String,
    created_ms: i64,
    #[serde(default)]
    copies: Option<Vec<String>>,
    #[serde(default)]
    bucket: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

impl MetaView {
    fn created(&self) -> String {
        iso(self.created_ms)
    }
}

/// `GET /ui/photos`: every photo in id order, or with `label` (and `task`) the photos a search
/// for that class finds; `HX-Request` asks for the next cards only.
pub(crate) async fn grid(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(filter): Query<GridQuery>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ConsoleError> {
    let label = filter.label.clone().unwrap_or_default();
    let task = filter.task.clone().unwrap_or_default();
    let (cards, more) = if label.trim().is_empty() {
        all_photos(&console, &uri).await?
    } else {
        searched(&console, &uri, &label, &task).await?
    };
    if headers.contains_key("hx-request") {
        return Ok(Cards { cards, more }.into_response());
    }
    let chrome = Chrome::of(&viewer, console.node.is_some());
    Ok(GridPage {
        chrome,
        label,
        task,
        cards,
        more,
    }
    .into_response())
}

/// A page of every photo, each with its tasks' top labels, and the link to the next.
async fn all_photos(
    console: &Console,
    uri: &Uri,
) -> Result<(Vec<Card>, Option<String>), ConsoleError> {
    let query = with_limit(uri);
    let listed: ListView = reply(photos::list(State(console.front.clone()), query).await).await?;
    let mut cards = Vec::with_capacity(listed.photos.len());
    for photo in &listed.photos {
        cards.push(Card {
            id: photo.id,
            labels: top_labels(console, photo.id).await,
            score: None,
        });
    }
    let more = listed.next_after.map(|a| format!("/ui/photos?after={a}"));
    Ok((cards, more))
}

/// `GET /v1/photos`'s query for the grid's `?after=`, with its page size.
fn with_limit(uri: &Uri) -> Result<Query<photos::PageParams>, QueryRejection> {
    let after = Query::<AfterOnly>::try_from_uri(uri)?.0.after;
    let raw = match after {
        Some(a) => format!("/?after={a}&limit={PER_PAGE}"),
        None => format!("/?limit={PER_PAGE}"),
    };
    let uri: Uri = raw.parse().unwrap_or_default();
    Query::try_from_uri(&uri)
}

#[derive(Debug, Deserialize)]
struct AfterOnly {
    after: Option<u64>,
}

/// The photos a search for class `label` (of `task`) finds, best first.
async fn searched(
    console: &Console,
    uri: &Uri,
    label: &str,
    task: &str,
) -> Result<(Vec<Card>, Option<String>), ConsoleError> {
    let found: Searched = super::search::run(console, uri).await?;
    let cards = found.hits.iter().map(Hit::card).collect();
    let more = found.next_offset.map(|o| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("label", label)
            .append_pair("task", task)
            .append_pair("offset", &o.to_string())
            .finish();
        format!("/ui/photos?{q}")
    });
    Ok((cards, more))
}

/// Each task's top label of photo `id` ("task: class"); none while it is not labelled.
async fn top_labels(console: &Console, id: u64) -> Vec<String> {
    let labels = console.front.objects().active_labels(id).await;
    labels
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(task, preds)| preds.first().map(|p| format!("{task}: {}", p.label)))
        .collect()
}

#[derive(Debug, Deserialize)]
struct VersionLabels {
    model_version: String,
    task: Option<String>,
    active: bool,
    labels: Vec<Prediction>,
}

#[derive(Debug, Deserialize)]
struct Prediction {
    label: String,
    score: f32,
}

#[derive(Debug, Deserialize)]
struct PhotoGroupView {
    group: Option<GroupView>,
}

#[derive(Debug, Deserialize)]
struct GroupView {
    keeper: u64,
    members: Vec<MemberView>,
}

#[derive(Debug, Deserialize)]
struct MemberView {
    id: u64,
    reason: String,
    score: f64,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/photo.html")]
pub(crate) struct PhotoPage {
    chrome: Chrome,
    meta: MetaView,
    labels: Vec<VersionLabels>,
    similar: Result<Answer, String>,
    /// Its duplicates group, if any, or why it could not be found.
    duplicates: Result<Option<GroupView>, String>,
}

/// `GET /ui/photos/{id}`.
pub(crate) async fn photo(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(raw): Path<String>,
) -> Result<PhotoPage, ConsoleError> {
    let id = parse_id(&raw)?;
    let front = console.front.clone();
    let meta: MetaView =
        reply(photos::get_meta(State(front.clone()), Path(raw.clone())).await).await?;
    let labels: Vec<VersionLabels> =
        reply(labels::get_labels(State(front.clone()), Path(raw.clone())).await).await?;
    let similar = similar_to(&console, id).await;
    let duplicates = group_of(&front, raw).await;
    Ok(PhotoPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        meta,
        labels,
        similar,
        duplicates,
    })
}

/// Photo `raw`'s group at the default levels (exact and near), as `GET
/// /v1/photos/{id}/duplicates` answers it; `None` when it is in none.
async fn group_of(front: &FrontState, raw: String) -> Result<Option<GroupView>, String> {
    let uri = Uri::from_static("/");
    let query = Query::try_from_uri(&uri);
    let found: PhotoGroupView =
        (reply(duplicates::photo_group(State(front.clone()), Path(raw), query).await))
            .await
            .map_err(|e| e.message().to_string())?;
    Ok(found.group)
}

/// The photos most similar to `id`, or why there are none (no model, not labelled yet).
async fn similar_to(console: &Console, id: u64) -> Result<Answer, String> {
    let front = console.similar.as_ref().ok_or("no model is loaded")?;
    let k = front.k(Some(SIMILAR)).map_err(|e| e.to_string())?;
    front.by_photo(id, k).await.map_err(|e| e.to_string())
}

/// `GET /ui/photos/{id}/original`: the original's bytes (`GET /v1/photos/{id}`).
pub(crate) async fn original(
    State(console): State<Console>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    Ok(photos::get_photo(State(console.front.clone()), Path(raw), headers).await?)
}

/// `POST /ui/photos/{id}/delete`: deletes the photo (`DELETE /v1/photos/{id}`).
pub(crate) async fn delete(
    State(console): State<Console>,
    Path(raw): Path<String>,
    _: Checked,
) -> Result<Redirect, ConsoleError> {
    let id = parse_id(&raw)?;
    photos::delete(State(console.front.clone()), Path(raw)).await?;
    console.thumbs.forget(id);
    Ok(Redirect::to("/ui/photos"))
}
