//! Tasks and the labels people give: create and list tasks, set a task's score floor, label
//! many photos of a task at once, and accept or correct a photo's predicted label (which then
//! counts as ground truth for the task's next fine-tune).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use ndpipe_catalog::{
    Catalog, CatalogError, GroundTruth, ModelVersion, OTHER_CLASS, PhotoId, Split, Task, TaskName,
};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, blocking, count, parse_id};

/// The most photos one labelling call takes.
const MAX_LABELLED: usize = 10_000;

/// A task name from a request (the default task when none is given); 400 when malformed.
pub(super) fn task_name(name: Option<&str>) -> Result<TaskName, ApiError> {
    match name {
        None | Some("") => Ok(TaskName::default_task()),
        Some(name) => name
            .parse()
            .map_err(|e: CatalogError| ApiError::bad_request("invalid_task", e.to_string())),
    }
}

/// 404 `unknown_task` for a task the catalog does not hold.
fn unknown_task(task: &TaskName) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_task",
        format!("task {task} does not exist (create it with POST /v1/tasks)"),
    )
}

/// Checks that the task of `truth` exists (404 `unknown_task` otherwise), before anything is
/// stored.
pub(super) async fn check_truth(
    catalog: &Arc<dyn Catalog>,
    truth: Option<&GroundTruth>,
) -> Result<(), ApiError> {
    let Some(task) = truth.map(|t| t.task.clone()) else {
        return Ok(());
    };
    let catalog = catalog.clone();
    let known = tokio::task::spawn_blocking(move || catalog.task(&task).map(|t| (task, t)))
        .await
        .map_err(|e| ApiError::from(crate::ingest::IngestError::from(e)))??;
    match known {
        (_, Some(_)) => Ok(()),
        (task, None) => Err(unknown_task(&task)),
    }
}

/// One task as `/v1/tasks` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct TaskView {
    name: TaskName,
    /// Whether this is the built-in `general` task (the backbone's own classifier).
    builtin: bool,
    /// The operator's own score floor (`null`: the active head's calibrated one).
    floor: Option<f32>,
    created_ms: i64,
    /// The version labelling photos on this node, if any.
    active_version: Option<ModelVersion>,
    /// Labelled photos per class and split (ground truth).
    ground_truth: Vec<ClassCount>,
    /// Photos labelled by the active version, and how many of them are `other`.
    labelled: u64,
    other: u64,
    /// `other / labelled`.
    other_share: f64,
}

#[derive(Debug, Default, Serialize)]
struct ClassCount {
    class: String,
    train: u64,
    val: u64,
    test: u64,
}

fn view(catalog: &dyn Catalog, task: Task) -> Result<TaskView, CatalogError> {
    let active = catalog.active_model(&task.name)?;
    let (labelled, other) = match &active {
        Some(v) => catalog.label_counts(&v.id)?,
        None => (0, 0),
    };
    let mut classes: BTreeMap<String, ClassCount> = BTreeMap::new();
    for split in [Split::Train, Split::Val, Split::Test] {
        for (_, label) in catalog.labelled(&task.name, split)? {
            let c = classes.entry(label.clone()).or_insert_with(|| ClassCount {
                class: label,
                ..ClassCount::default()
            });
            match split {
                Split::Train => c.train += 1,
                Split::Val => c.val += 1,
                Split::Test => c.test += 1,
            }
        }
    }
    Ok(TaskView {
        builtin: task.name.is_general(),
        name: task.name,
        floor: task.floor,
        created_ms: task.created_ms,
        active_version: active,
        ground_truth: classes.into_values().collect(),
        labelled,
        other,
        other_share: other as f64 / labelled.max(1) as f64,
    })
}

/// `GET /v1/tasks`: every task, with its active version, ground truth and label counts.
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<Vec<TaskView>>, ApiError> {
    let catalog = state.catalog.clone();
    let views = blocking(&state, move || {
        catalog
            .tasks()?
            .into_iter()
            .map(|t| view(&*catalog, t))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    Ok(Json(views))
}

/// `GET /v1/tasks/{task}`: one task; 404 when unknown.
pub(super) async fn get_task(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let name = task_name(Some(&raw)).map_err(|e| count(&state, e))?;
    let catalog = state.catalog.clone();
    let view = blocking(&state, move || match catalog.task(&name)? {
        Some(task) => Ok(view(&*catalog, task)?),
        None => Err(unknown_task(&name)),
    })
    .await?;
    Ok(Json(view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewTask {
    name: String,
    floor: Option<f32>,
}

/// A score floor from a request: a probability, or 400.
fn checked_floor(floor: Option<f32>) -> Result<Option<f32>, ApiError> {
    match floor {
        Some(f) if !(0.0..=1.0).contains(&f) => Err(ApiError::bad_request(
            "invalid_floor",
            format!("floor {f} is not a probability in [0, 1]"),
        )),
        other => Ok(other),
    }
}

/// `POST /v1/tasks` `{"name", "floor"?}`: 201 with the task; 409 when it exists.
pub(super) async fn create(
    State(state): State<AppState>,
    body: Result<Json<NewTask>, JsonRejection>,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let name = task_name(Some(&body.name)).map_err(|e| count(&state, e))?;
    let floor = checked_floor(body.floor).map_err(|e| count(&state, e))?;
    let task = Task {
        name,
        floor,
        created_ms: ndpipe_util::time::now_ms(),
    };
    let catalog = state.catalog.clone();
    let view = blocking(&state, move || {
        catalog.create_task(&task)?;
        view(&*catalog, task)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(view)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskUpdate {
    floor: Option<f32>,
}

/// `PUT /v1/tasks/{task}` `{"floor": p | null}`: sets or clears the task's own floor, which
/// labels from then on keep (re-label the task to apply it to labels given before).
pub(super) async fn update(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    body: Result<Json<TaskUpdate>, JsonRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let name = task_name(Some(&raw)).map_err(|e| count(&state, e))?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let floor = checked_floor(body.floor).map_err(|e| count(&state, e))?;
    let catalog = state.catalog.clone();
    let models = state.models.clone();
    let view = blocking(&state, move || {
        if catalog.task(&name)?.is_none() {
            return Err(unknown_task(&name));
        }
        catalog.set_task_floor(&name, floor)?;
        if let Some(models) = &models {
            models.refresh_floors().map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "model_error",
                    e.to_string(),
                )
            })?;
        }
        let task = catalog.task(&name)?.ok_or_else(|| unknown_task(&name))?;
        Ok(view(&*catalog, task)?)
    })
    .await?;
    Ok(Json(view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Labelling {
    /// The class every photo gets (`other` for "none of this task's classes").
    class: String,
    split: Option<Split>,
    ids: Vec<PhotoId>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Labelled {
    task: TaskName,
    class: String,
    labelled: Vec<PhotoId>,
    /// Ids of photos that do not exist (or, on a cluster, that another node holds).
    missing: Vec<PhotoId>,
}

/// `POST /v1/tasks/{task}/labels` `{"class", "split"?, "ids"}`: gives every photo of `ids`
/// the class as ground truth of the task (split `train` unless given).
pub(crate) async fn label(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    body: Result<Json<Labelling>, JsonRejection>,
) -> Result<Json<Labelled>, ApiError> {
    let task = labelled_task(&state, &raw).await?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    crate::ingest::validate_label(&body.class).map_err(|e| count(&state, e.into()))?;
    if body.ids.is_empty() || body.ids.len() > MAX_LABELLED {
        return Err(count(
            &state,
            ApiError::bad_request(
                "bad_body",
                format!("ids must hold 1 to {MAX_LABELLED} photo ids"),
            ),
        ));
    }
    let truth = GroundTruth {
        task: task.clone(),
        label: body.class.clone(),
        split: body.split.unwrap_or(Split::Train),
    };
    let rows: Vec<(PhotoId, GroundTruth)> =
        body.ids.iter().map(|id| (*id, truth.clone())).collect();
    let catalog = state.catalog.clone();
    let labelled = blocking(&state, move || catalog.set_ground_truths(&rows)).await?;
    let missing = body
        .ids
        .iter()
        .filter(|id| !labelled.contains(id))
        .copied()
        .collect();
    Ok(Json(Labelled {
        task,
        class: body.class,
        labelled,
        missing,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Unlabelling {
    ids: Vec<PhotoId>,
}

/// `DELETE /v1/tasks/{task}/labels` `{"ids"}`: clears the task's ground truth of those photos;
/// answers how many had one.
pub(super) async fn unlabel(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    body: Result<Json<Unlabelling>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let task = labelled_task(&state, &raw).await?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    let catalog = state.catalog.clone();
    let cleared = blocking(&state, move || {
        let mut cleared = 0u64;
        for id in body.ids {
            cleared += u64::from(catalog.clear_ground_truth(id, &task)?);
        }
        Ok::<_, CatalogError>(cleared)
    })
    .await?;
    Ok(Json(serde_json::json!({ "cleared": cleared })))
}

/// The task of a labelling call: it must exist, and not be `general` (the backbone's own
/// classifier, which nothing trains).
async fn labelled_task(state: &AppState, raw: &str) -> Result<TaskName, ApiError> {
    let task = task_name(Some(raw)).map_err(|e| count(state, e))?;
    if task.is_general() {
        return Err(count(
            state,
            ApiError::bad_request(
                "builtin_task",
                "the general task is the backbone's own classifier: label a task of your own",
            ),
        ));
    }
    let probe = GroundTruth {
        task: task.clone(),
        label: String::new(),
        split: Split::Train,
    };
    check_truth(&state.catalog, Some(&probe))
        .await
        .map_err(|e| count(state, e))?;
    Ok(task)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Confirmation {
    /// The right class; absent to accept the predicted one.
    class: Option<String>,
    split: Option<Split>,
}

/// `POST /v1/photos/{id}/labels/{task}` `{"class"?, "split"?}`: accepts the task's predicted
/// top-1 label of the photo as its ground truth, or corrects it to `class`; 409 when accepting
/// a photo the task has not labelled (or labelled `other`).
pub(super) async fn confirm(
    State(state): State<AppState>,
    Path((raw_id, raw_task)): Path<(String, String)>,
    body: Result<Json<Confirmation>, JsonRejection>,
) -> Result<Json<GroundTruth>, ApiError> {
    let id = parse_id(&raw_id).map_err(|e| count(&state, e))?;
    let task = labelled_task(&state, &raw_task).await?;
    let Json(body) =
        body.map_err(|e| count(&state, ApiError::bad_request("bad_body", e.body_text())))?;
    if let Some(class) = &body.class {
        crate::ingest::validate_label(class).map_err(|e| count(&state, e.into()))?;
    }
    let catalog = state.catalog.clone();
    let truth = blocking(&state, move || {
        if catalog.photo(id)?.is_none() {
            return Err(ApiError::photo_not_found(id));
        }
        let class = match body.class {
            Some(class) => class,
            None => predicted(&*catalog, id, &task)?,
        };
        let truth = GroundTruth {
            task,
            label: class,
            split: body.split.unwrap_or(Split::Train),
        };
        catalog.set_ground_truth(id, &truth)?;
        Ok::<_, ApiError>(truth)
    })
    .await?;
    Ok(Json(truth))
}

/// The top-1 label the active version of `task` gave photo `id`.
fn predicted(catalog: &dyn Catalog, id: PhotoId, task: &TaskName) -> Result<String, ApiError> {
    let no_label = |why: String| ApiError::new(StatusCode::CONFLICT, "no_prediction", why);
    let version = catalog
        .active_model(task)?
        .ok_or_else(|| no_label(format!("task {task} has no deployed version to accept")))?;
    let top = catalog
        .predictions(id)?
        .into_iter()
        .find(|(v, _)| *v == version.id)
        .and_then(|(_, labels)| labels.into_iter().next())
        .ok_or_else(|| no_label(format!("photo {id} has no label of {}", version.id)))?;
    if top.label == OTHER_CLASS {
        return Err(no_label(format!(
            "photo {id} is labelled {OTHER_CLASS} by {}: give its class instead",
            version.id
        )));
    }
    Ok(top.label)
}
