//! Upload: many photos at once through `POST /v1/photos`'s handler, one result per file (a
//! broken file gets its error, the others go on). Without JavaScript the form posts every
//! file and the page lists the results; with it, `upload.js` posts one file per request with
//! a progress bar each and asks for JSON. Also [`read_form`], the multipart reader of every
//! console form that sends files (checked against the session's CSRF token).

use askama::Template;
use askama_web::WebTemplate;
use axum::Extension;
use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, Query, State};
use axum::http::{HeaderMap, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Console;
use super::access::Viewer;
use super::page::{Chrome, ConsoleError, reply};
use crate::api::http::photos;

/// One file of a multipart form.
pub(crate) struct FormFile {
    /// The form field it came in.
    pub(crate) field: String,
    /// The browser's name for it.
    pub(crate) name: String,
    pub(crate) bytes: Bytes,
}

/// The files of a multipart form whose `csrf` field is the session's token (403 otherwise).
pub(crate) async fn read_form(
    viewer: &Viewer,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Vec<FormFile>, ConsoleError> {
    let bad = |e: &dyn std::fmt::Display| ConsoleError::bad_request(e.to_string());
    let mut multipart = multipart.map_err(|e| bad(&e.body_text()))?;
    let (mut csrf, mut files) = (None, Vec::new());
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| bad(&e.body_text()))?
    {
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let bytes = field.bytes().await.map_err(|e| bad(&e.body_text()))?;
        match file_name {
            _ if name == "csrf" => csrf = Some(String::from_utf8_lossy(&bytes).into_owned()),
            Some(file) => files.push(FormFile {
                field: name,
                name: file,
                bytes,
            }),
            None => {}
        }
    }
    viewer.check_csrf(csrf.as_deref())?;
    Ok(files)
}

/// What became of one uploaded file.
#[derive(Debug, Serialize)]
pub(crate) struct Outcome {
    name: String,
    /// The photo, when it was taken (or the one that already had these bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    /// Nothing was stored: the catalog had these bytes as this photo already.
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate_of: Option<u64>,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The part of `POST /v1/photos`'s answer the page shows.
#[derive(Debug, Deserialize)]
struct Uploaded {
    id: u64,
    duplicate_of: Option<u64>,
}

#[derive(Template, WebTemplate)]
#[template(path = "console/upload.html")]
pub(crate) struct UploadPage {
    chrome: Chrome,
    outcomes: Vec<Outcome>,
}

/// `GET /ui/upload`: the form.
pub(crate) async fn page(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> UploadPage {
    UploadPage {
        chrome: Chrome::of(&viewer, console.node.is_some()),
        outcomes: Vec::new(),
    }
}

/// `POST /ui/upload` (multipart: `csrf`, `photos`...): each file through `/v1`'s upload; JSON
/// when the request accepts it (the script), else the page with the results.
pub(crate) async fn upload(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ConsoleError> {
    let files = read_form(&viewer, multipart).await?;
    if files.iter().all(|f| f.bytes.is_empty()) {
        return Err(ConsoleError::bad_request("choose one or more photos"));
    }
    let mut outcomes = Vec::with_capacity(files.len());
    for file in files {
        outcomes.push(one(&console, file).await);
    }
    let wants_json = (headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()))
        .is_some_and(|a| a.contains("application/json"));
    if wants_json {
        return Ok(Json(serde_json::json!({ "files": outcomes })).into_response());
    }
    let chrome = Chrome::of(&viewer, console.node.is_some());
    Ok(UploadPage { chrome, outcomes }.into_response())
}

/// One file through `POST /v1/photos`'s handler.
async fn one(console: &Console, file: FormFile) -> Outcome {
    let query = Query::try_from_uri(&Uri::from_static("/"));
    let answer = photos::upload(
        State(console.front.clone()),
        HeaderMap::new(),
        query,
        Ok(file.bytes),
    )
    .await;
    match reply::<Uploaded>(answer).await {
        Ok(done) => Outcome {
            name: file.name,
            id: Some(done.duplicate_of.unwrap_or(done.id)),
            duplicate_of: done.duplicate_of,
            error: None,
        },
        Err(e) => Outcome {
            name: file.name,
            id: None,
            duplicate_of: None,
            error: Some(e.message().to_string()),
        },
    }
}
