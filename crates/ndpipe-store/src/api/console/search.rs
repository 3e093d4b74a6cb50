//! Search: by class (`label`, with `task`), in words (`q`, the matcher of `/v1/search?q=`),
//! both through `/v1/search`'s handler; and by an uploaded photo, the similarity query of
//! `POST /v1/similar`. Results show their score.

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::{Multipart, Query, State};
use axum::http::Uri;
use serde::Deserialize;

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, reply};
use super::photos::Card;
use crate::api::http::labels;

/// A search's answer, in words or by class.
#[derive(Debug, Deserialize)]
pub(crate) struct Searched {
    /// The classes the words mapped onto (a search in words only).
    #[serde(default)]
    pub(crate) matched: Vec<Matched>,
    pub(crate) hits: Vec<Hit>,
    pub(crate) next_offset: Option<usize>,
}

/// A class that words matched.
#[derive(Debug, Deserialize)]
pub(crate) struct Matched {
    pub(crate) task: String,
    pub(crate) class: String,
    pub(crate) score: f32,
}

/// One photo found.
#[derive(Debug, Deserialize)]
pub(crate) struct Hit {
    id: u64,
    label: String,
    score: f32,
    task: String,
    /// A search in words ranks by relevance (label score times match score).
    #[serde(default)]
    relevance: Option<f32>,
}

impl Hit {
    /// The hit as a card of the grid.
    pub(crate) fn card(&self) -> Card {
        Card {
            id: self.id,
            labels: vec![format!("{}: {}", self.task, self.label)],
            score: Some(self.relevance.unwrap_or(self.score)),
        }
    }
}

/// `/v1/search` with the query of `uri` (`label`, `q`, `task`, `offset`); a gateway has none.
pub(crate) async fn run(console: &Console, uri: &Uri) -> Result<Searched, ConsoleError> {
    let node = console.node.clone().ok_or_else(|| {
        ConsoleError::new(
            axum::http::StatusCode::NOT_FOUND,
            "a gateway has no search by class or in words; ask a PipeStore",
        )
    })?;
    let uri = without_empty(uri);
    reply(labels::search(State(node), Query::try_from_uri(&uri)).await).await
}

/// `uri` without the query's empty fields: a form's blank "task" means none, not a task named "".
fn without_empty(uri: &Uri) -> Uri {
    let pairs = form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes());
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs.filter(|(_, v)| !v.trim().is_empty()))
        .finish();
    format!("/?{query}").parse().unwrap_or_default()
}

/// What the search form was given.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SearchQuery {
    label: Option<String>,
    q: Option<String>,
    task: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/search.html")]
pub(crate) struct SearchPage {
    chrome: Chrome,
    label: String,
    q: String,
    task: String,
    /// What was searched for, when something was.
    found: Option<Searched>,
    /// Photos similar to an uploaded one.
    similar: Option<crate::similar::Answer>,
}

impl SearchPage {
    fn new(chrome: Chrome, query: SearchQuery) -> Self {
        SearchPage {
            chrome,
            label: query.label.unwrap_or_default(),
            q: query.q.unwrap_or_default(),
            task: query.task.unwrap_or_default(),
            found: None,
            similar: None,
        }
    }
}

/// `GET /ui/search?label=&task=` or `?q=`: the form, and what it found.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(query): Query<SearchQuery>,
    uri: Uri,
) -> Result<SearchPage, ConsoleError> {
    let asked = [&query.label, &query.q]
        .into_iter()
        .any(|v| v.as_ref().is_some_and(|v| !v.trim().is_empty()));
    let mut page = SearchPage::new(Chrome::of(&viewer, console.node.is_some()), query);
    if asked {
        page.found = Some(run(&console, &uri).await?);
    }
    Ok(page)
}

/// `POST /ui/search/similar` (multipart: `csrf`, `photo`): photos similar to the upload.
pub(crate) async fn similar(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<SearchPage, ConsoleError> {
    let files = super::upload::read_form(&viewer, multipart).await?;
    let photo = (files.into_iter().find(|f| f.field == "photo")).map(|f| f.bytes);
    let photo = photo
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ConsoleError::bad_request("choose a photo to search with"))?;
    let front = console
        .similar
        .as_ref()
        .ok_or_else(|| ConsoleError::new(axum::http::StatusCode::CONFLICT, "no model is loaded"))?;
    let k = front
        .k(None)
        .map_err(|e| ConsoleError::bad_request(e.to_string()))?;
    let answer = (front.by_upload(photo, k).await)
        .map_err(|e| ConsoleError::from(crate::api::http::ApiError::from(e)))?;
    let mut page = SearchPage::new(
        Chrome::of(&viewer, console.node.is_some()),
        SearchQuery::default(),
    );
    page.similar = Some(answer);
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_fields_are_left_out() {
        let uri: Uri = "/ui/search?label=tabby&task=&q=+".parse().unwrap();
        assert_eq!(without_empty(&uri).query(), Some("label=tabby"));
    }
}
