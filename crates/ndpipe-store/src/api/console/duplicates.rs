//! Duplicates review: the groups of `GET /v1/duplicates` side by side, each member with its
//! reason (exact, near, semantic) and the suggested keeper; one form per group deletes the
//! checked others (`DELETE /v1/photos/{id}`'s handler for each).

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::Uri;
use axum::response::Redirect;
use bytes::Bytes;
use serde::Deserialize;

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, reply};
use crate::api::http::{duplicates, photos};

/// A page of groups as `GET /v1/duplicates` answers it.
#[derive(Debug, Deserialize)]
struct Page {
    levels: Vec<String>,
    #[serde(default)]
    unhashed: Option<u64>,
    groups: Vec<Group>,
    next_after: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Group {
    id: u64,
    keeper: u64,
    members: Vec<Member>,
}

#[derive(Debug, Deserialize)]
struct Member {
    id: u64,
    reason: String,
    score: f64,
    linked_to: u64,
    pixels: u64,
    bytes: u64,
}

/// The page's query: the levels and the page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct DuplicatesQuery {
    level: Option<String>,
    after: Option<u64>,
    note: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/duplicates.html")]
pub(crate) struct DuplicatesPage {
    chrome: Chrome,
    level: String,
    levels: Vec<String>,
    unhashed: Option<u64>,
    groups: Vec<Group>,
    more: Option<String>,
    note: Option<String>,
}

/// `GET /ui/duplicates`.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(query): Query<DuplicatesQuery>,
) -> Result<DuplicatesPage, ConsoleError> {
    let level = query.level.clone().unwrap_or_default();
    let uri = v1_query(&level, query.after)?;
    let found: Page =
        reply(duplicates::list(State(console.front.clone()), Query::try_from_uri(&uri)).await)
            .await?;
    let more = found.next_after.map(|a| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("level", &level)
            .append_pair("after", &a.to_string())
            .finish();
        format!("/ui/duplicates?{q}")
    });
    Ok(DuplicatesPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        level,
        levels: found.levels,
        unhashed: found.unhashed,
        groups: found.groups,
        more,
        note: query.note,
    })
}

/// `GET /v1/duplicates`'s query for the levels `level` (its default when blank) after group
/// `after`.
fn v1_query(level: &str, after: Option<u64>) -> Result<Uri, ConsoleError> {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if !level.trim().is_empty() {
        q.append_pair("level", level.trim());
    }
    if let Some(after) = after {
        q.append_pair("after", &after.to_string());
    }
    format!("/?{}", q.finish())
        .parse()
        .map_err(ConsoleError::internal)
}

/// The ids checked in a group's form, and its CSRF token.
fn parse(body: &[u8]) -> Result<(Option<String>, Vec<u64>), ConsoleError> {
    let (mut csrf, mut ids) = (None, Vec::new());
    for (name, value) in form_urlencoded::parse(body) {
        match name.as_ref() {
            "csrf" => csrf = Some(value.into_owned()),
            "id" => ids.push(value.parse().map_err(|_| {
                ConsoleError::bad_request(format!("photo id {value} is not a number"))
            })?),
            _ => {}
        }
    }
    Ok((csrf, ids))
}

/// `POST /ui/duplicates/delete`: deletes every checked photo, as `DELETE /v1/photos/{id}` does.
pub(crate) async fn delete(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    body: Bytes,
) -> Result<Redirect, ConsoleError> {
    let (csrf, ids) = parse(&body)?;
    viewer.check_csrf(csrf.as_deref())?;
    if ids.is_empty() {
        return Err(ConsoleError::bad_request(
            "check at least one photo to delete",
        ));
    }
    for id in &ids {
        photos::delete(State(console.front.clone()), Path(id.to_string())).await?;
        console.thumbs.forget(*id);
    }
    let note = format!("{} photos deleted", ids.len());
    let q = form_urlencoded::Serializer::new(String::new())
        .append_pair("note", &note)
        .finish();
    Ok(Redirect::to(&format!("/ui/duplicates?{q}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_gives_every_checked_id() {
        let (csrf, ids) = parse(b"csrf=abc&id=4&id=9").unwrap();
        assert_eq!((csrf.as_deref(), ids), (Some("abc"), vec![4, 9]));
        assert!(parse(b"id=-1").is_err());
    }
}
