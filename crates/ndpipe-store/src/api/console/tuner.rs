//! Calls into the Tuner's `/v1/tuner` routes from the console: the very router an embedded
//! Tuner merges into `ndpipe serve`'s HTTP API, behind the same guard, called in-process with
//! the viewer's own credentials (its key's secret as the bearer), so that the access keys
//! decide exactly as they do on `/v1/tuner`. A PipeStore of a cluster runs no Tuner: its console
//! says where fine-tunes start instead.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde::de::DeserializeOwned;
use tower::ServiceExt;

use super::Console;
use super::access::Viewer;
use super::page::{ConsoleError, reply};
use crate::api::http::ApiError;

/// What a console without a Tuner in its process says.
pub(crate) const NO_TUNER: &str = "no Tuner runs in this process (a PipeStore of a cluster, or a gateway): \
     start fine-tunes, deploys and rollbacks on the Tuner's /v1/tuner API, e.g. `ndpipe finetune --tuner URL`";

/// The Tuner's answer to `method path` (with a JSON `body`), read as `V`; its errors as pages
/// with their status.
pub(crate) async fn call<V: DeserializeOwned>(
    console: &Console,
    viewer: &Viewer,
    (method, path): (Method, &str),
    body: Option<serde_json::Value>,
) -> Result<V, ConsoleError> {
    let router = router(console)?;
    let mut req = Request::builder().method(method).uri(path);
    if let Some(secret) = secret(console, viewer).await? {
        req = req.header(header::AUTHORIZATION, format!("Bearer {secret}"));
    }
    let req = match body {
        Some(json) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json.to_string())),
        None => req.body(Body::empty()),
    }
    .map_err(ConsoleError::internal)?;
    let response = router.oneshot(req).await.map_err(ConsoleError::internal)?;
    reply(Ok::<_, ApiError>(response)).await
}

/// The Tuner's router in this process, or 404 saying where it is.
fn router(console: &Console) -> Result<Router, ConsoleError> {
    console
        .tuner
        .clone()
        .ok_or_else(|| ConsoleError::new(StatusCode::NOT_FOUND, NO_TUNER))
}

/// The secret of the viewer's access key (the admin token for `ndpipe-admin`); none for an
/// open console.
async fn secret(console: &Console, viewer: &Viewer) -> Result<Option<String>, ConsoleError> {
    let Some(key) = viewer.session.access_key.clone() else {
        return Ok(None);
    };
    let keys = console.keys.clone();
    let found = tokio::task::spawn_blocking(move || keys.secret_of(&key))
        .await
        .map_err(ConsoleError::internal)?
        .map_err(ConsoleError::internal)?;
    Ok(found.map(|(_, secret)| secret))
}
