//! Photos: upload, read back (original, tensor, metadata), list, delete, set ground truth.

use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::{Catalog, CatalogError, GroundTruth, PhotoRecord, Split};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, Counted, MAX_PHOTO_ID, blocking, count, parse_id};
use super::{AppState, FrontState, page_limit, tasks};
use crate::duplicates::exact::Uploaded;
use crate::objects::{PhotoPage, StoredPhoto};

/// Query parameters of an upload; the same values may come as `x-ndpipe-label`/`x-ndpipe-split`.
#[derive(Debug, Deserialize)]
pub(crate) struct UploadParams {
    label: Option<String>,
    split: Option<String>,
    task: Option<String>,
}

/// Reply to a successful upload.
#[derive(Debug, Serialize)]
pub(crate) struct UploadReply {
    id: u64,
    sha256: String,
    bytes: u64,
    width: u32,
    height: u32,
    /// The oldest photo that already had these bytes (`exact_duplicates`); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate_of: Option<u64>,
}

/// `POST /v1/photos`: stores a photo durably (201 once it is on disk, every copy of it in a
/// cluster; labelling follows), or, when the catalog has its bytes already and
/// `exact_duplicates` is `existing`, answers 200 with that photo.
pub(crate) async fn upload(
    State(state): State<FrontState>,
    headers: HeaderMap,
    query: Result<Query<UploadParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<UploadReply>), ApiError> {
    let started = Instant::now();
    let result = async {
        let (body, truth) = upload_input(&headers, query, body)?;
        tasks::check_truth(&state.catalog, truth.as_ref()).await?;
        let mode = state.objects.exact_duplicates();
        Ok(state.objects.put_photo(mode, body, truth).await?)
    }
    .await;
    answer_upload(&state, started, result)
}

/// The body and ground truth of an upload, or why the request is refused.
fn upload_input(
    headers: &HeaderMap,
    query: Result<Query<UploadParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Bytes, Option<GroundTruth>), ApiError> {
    let Query(params) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                e.body_text(),
            )
        } else {
            ApiError::bad_request("bad_body", e.body_text())
        }
    })?;
    Ok((body, ground_truth(headers, params)?))
}

/// The answer to an upload that began at `started`: 201 with the new photo, 200 with the
/// existing one when nothing was stored, or the error; timed and counted either way.
fn answer_upload(
    state: &impl Counted,
    started: Instant,
    result: Result<Uploaded, ApiError>,
) -> Result<(StatusCode, Json<UploadReply>), ApiError> {
    let metrics = state.metrics();
    metrics
        .ingest_seconds
        .observe(started.elapsed().as_secs_f64());
    let Uploaded {
        record: PhotoRecord { id, meta, .. },
        duplicate_of,
        stored,
    } = result.map_err(|e| count(state, e))?;
    metrics.uploads.inc();
    if stored {
        metrics.upload_bytes.inc_by(meta.bytes);
    }
    Ok((
        if stored {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(UploadReply {
            id,
            sha256: meta.sha256,
            bytes: meta.bytes,
            width: meta.width,
            height: meta.height,
            duplicate_of,
        }),
    ))
}

/// The ground truth of an upload, from its query or headers (`label`, `split`, `task`, or
/// `x-ndpipe-label`, `x-ndpipe-split`, `x-ndpipe-task`); a split or a task needs a label.
fn ground_truth(
    headers: &HeaderMap,
    params: UploadParams,
) -> Result<Option<GroundTruth>, ApiError> {
    let header_text = |name: &str| -> Result<Option<String>, ApiError> {
        headers
            .get(name)
            .map(|v| {
                v.to_str().map(str::to_owned).map_err(|_| {
                    ApiError::bad_request("invalid_label", format!("{name} is not valid text"))
                })
            })
            .transpose()
    };
    let label = params.label.or(header_text("x-ndpipe-label")?);
    let split = params.split.or(header_text("x-ndpipe-split")?);
    let task = params.task.or(header_text("x-ndpipe-task")?);
    match (label, split, task) {
        (None, None, None) => Ok(None),
        (None, _, _) => Err(ApiError::bad_request(
            "invalid_label",
            "a split or a task was given without a label",
        )),
        (Some(label), split, task) => {
            let split = match split.as_deref() {
                None => Split::Train,
                Some(s) => s.parse().map_err(|e: CatalogError| {
                    ApiError::bad_request("invalid_split", e.to_string())
                })?,
            };
            Ok(Some(GroundTruth {
                task: tasks::task_name(task.as_deref())?,
                label,
                split,
            }))
        }
    }
}

/// `GET /v1/photos/{id}`: the original bytes (from any intact copy in a cluster), with an
/// ETag of their SHA-256 (304 when the client has it).
pub(crate) async fn get_photo(
    State(state): State<FrontState>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let found = (state.objects.read_photo(id).await).map_err(|e| count(&state, e.into()))?;
    let Some((meta, bytes)) = found else {
        return Err(count(&state, ApiError::photo_not_found(id)));
    };
    state.metrics.reads.inc();
    let etag = format!("\"{}\"", meta.sha256);
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag)
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    Ok((
        [
            (header::CONTENT_TYPE, meta.content_type.clone()),
            (header::ETAG, etag),
            (
                header::CACHE_CONTROL,
                "private, max-age=31536000, immutable".into(),
            ),
        ],
        Body::from(bytes),
    )
        .into_response())
}

/// `GET /v1/photos/{id}/tensor`: the stored preprocessed tensor (`TensorBlob`).
pub(super) async fn get_tensor(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let store = state.store.clone();
    let found = blocking(&state, move || store.tensor(id)).await?;
    let Some((_, blob)) = found else {
        return Err(count(&state, ApiError::photo_not_found(id)));
    };
    Ok((
        [(header::CONTENT_TYPE, "application/vnd.ndpipe.tensor")],
        Body::from(blob),
    )
        .into_response())
}

/// A photo's catalog row, with the S3 bucket and key it is stored under (when it came
/// through the S3 API).
#[derive(Debug, Serialize)]
pub(crate) struct MetaReply {
    #[serde(flatten)]
    record: PhotoRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    bucket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The nodes holding a copy (replicated clusters only).
    #[serde(skip_serializing_if = "Option::is_none")]
    copies: Option<Vec<String>>,
}

/// `GET /v1/photos/{id}/meta`: the photo's catalog row, with its bucket and key and, in a
/// cluster, its holders.
pub(crate) async fn get_meta(
    State(state): State<FrontState>,
    Path(raw): Path<String>,
) -> Result<Json<MetaReply>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let found = (state.objects.photo(id).await).map_err(|e| count(&state, e.into()))?;
    let photo = found.ok_or_else(|| count(&state, ApiError::photo_not_found(id)))?;
    let catalog = state.catalog.clone();
    let mut replies = blocking(&state, move || with_objects(&*catalog, vec![photo])).await?;
    Ok(Json(replies.remove(0)))
}

impl MetaReply {
    fn new(photo: StoredPhoto, object: Option<ndpipe_catalog::ObjectRecord>) -> Self {
        let (bucket, key) = object.map(|o| (o.bucket, o.key)).unzip();
        MetaReply {
            record: photo.record,
            bucket,
            key,
            copies: photo.copies,
        }
    }
}

/// Each photo with the bucket and key it has in the S3 API, if any.
fn with_objects(
    catalog: &dyn Catalog,
    photos: Vec<StoredPhoto>,
) -> Result<Vec<MetaReply>, CatalogError> {
    photos
        .into_iter()
        .map(|p| {
            let object = catalog.object_of_photo(p.record.id)?;
            Ok(MetaReply::new(p, object))
        })
        .collect()
}

#[derive(Debug, Deserialize)]
pub(crate) struct PageParams {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Page {
    photos: Vec<MetaReply>,
    /// Pass as `after` to get the next page; absent on the last page.
    next_after: Option<u64>,
}

/// `GET /v1/photos?after=&limit=`: photos in id order (with their bucket and key and, in a
/// cluster, every node's photos with their holders), a page at a time.
pub(crate) async fn list(
    State(state): State<FrontState>,
    query: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let (after, limit) = page_params(&state, query)?;
    let PhotoPage { photos, next_after } =
        (state.objects.page(after, limit).await).map_err(|e| count(&state, e.into()))?;
    let catalog = state.catalog.clone();
    let photos = blocking(&state, move || with_objects(&*catalog, photos)).await?;
    Ok(Json(Page { photos, next_after }))
}

/// `after` and `limit` of a listing, checked.
fn page_params(
    state: &impl Counted,
    query: Result<Query<PageParams>, QueryRejection>,
) -> Result<(Option<u64>, usize), ApiError> {
    let Query(params) =
        query.map_err(|e| count(state, ApiError::bad_request("bad_query", e.body_text())))?;
    let limit = page_limit(params.limit, 100).map_err(|e| count(state, e))?;
    if params.after.is_some_and(|a| a > MAX_PHOTO_ID) {
        return Err(count(
            state,
            ApiError::bad_request("bad_query", format!("after must be at most {MAX_PHOTO_ID}")),
        ));
    }
    Ok((params.after, limit))
}

/// `DELETE /v1/photos/{id}`: every copy (behind a tombstone in a cluster); 204, or 404 when
/// there was no such photo.
pub(crate) async fn delete(
    State(state): State<FrontState>,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let existed = (state.objects.delete_photo(id).await).map_err(|e| count(&state, e.into()))?;
    if !existed {
        return Err(count(&state, ApiError::photo_not_found(id)));
    }
    state.metrics.deletes.inc();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub(super) struct GroundTruthBody {
    label: Option<String>,
    split: Option<Split>,
    task: Option<String>,
}

/// `PUT /v1/photos/{id}/ground-truth`: sets (or, without a label, clears) the ground truth of
/// a task (the default task when none is named).
pub(super) async fn set_ground_truth(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    body: Result<Json<GroundTruthBody>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    if state.ingestor.is_deleted(id) {
        return Err(count(&state, ApiError::photo_not_found(id)));
    }
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let task = tasks::task_name(body.task.as_deref()).map_err(|e| count(&state, e))?;
    let truth = match body.label {
        Some(label) => {
            crate::ingest::validate_label(&label).map_err(|e| count(&state, e.into()))?;
            Some(GroundTruth {
                task: task.clone(),
                label,
                split: body.split.unwrap_or(Split::Train),
            })
        }
        None => None,
    };
    tasks::check_truth(&state.catalog, truth.as_ref())
        .await
        .map_err(|e| count(&state, e))?;
    let catalog = state.catalog.clone();
    blocking(&state, move || match &truth {
        Some(truth) => catalog.set_ground_truth(id, truth),
        None => catalog.clear_ground_truth(id, &task).map(drop),
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
