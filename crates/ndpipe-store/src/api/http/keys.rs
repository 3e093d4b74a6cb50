//! Access keys over HTTP (admin only): `POST /v1/admin/keys` `{"name", "role"}` creates one
//! and answers its secret once, `GET /v1/admin/keys` lists them without secrets,
//! `DELETE /v1/admin/keys/{name}` removes one.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use ndpipe_catalog::{CatalogError, Role};
use serde::Deserialize;

use super::AppState;
use super::error::{ApiError, blocking, count};
use crate::keys::{KeyError, KeyInfo, NewKey};

/// The body of `POST /v1/admin/keys`.
#[derive(Debug, Deserialize)]
pub(super) struct CreateKey {
    name: String,
    role: Role,
}

impl From<KeyError> for ApiError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::Catalog(CatalogError::Conflict { .. }) => {
                ApiError::new(StatusCode::CONFLICT, "key_exists", e.to_string())
            }
            KeyError::Catalog(c) => c.into(),
            KeyError::InvalidName(m) => ApiError::bad_request("invalid_name", m),
            other => super::error::internal(other),
        }
    }
}

/// `POST /v1/admin/keys`: 201 with the new key and its secret.
pub(super) async fn create(
    State(state): State<AppState>,
    body: Result<Json<CreateKey>, JsonRejection>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let keys = state.keys.clone();
    let new = blocking(&state, move || keys.create(&body.name, body.role)).await?;
    Ok((StatusCode::CREATED, Json(new)))
}

/// `GET /v1/admin/keys`: every key, without its secret.
pub(super) async fn list(State(state): State<AppState>) -> Result<Json<Vec<KeyInfo>>, ApiError> {
    let keys = state.keys.clone();
    Ok(Json(blocking(&state, move || keys.list()).await?))
}

/// `DELETE /v1/admin/keys/{name}`: 204, or 404 for an unknown name.
pub(super) async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let keys = state.keys.clone();
    let lookup = name.clone();
    if blocking(&state, move || keys.delete(&lookup)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(count(
            &state,
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no key is named {name:?}"),
            ),
        ))
    }
}
