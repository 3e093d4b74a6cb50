//! The web console at `/ui`: server-rendered pages over the same handlers as `/v1`.
//!
//! One concern per module: [`session`] (sessions and CSRF tokens in memory), [`access`] (sign
//! in and out, and who may see or change what: the roles of `/v1`), [`assets`] (the vendored
//! htmx and uPlot, our CSS and script), [`thumbs`] (thumbnails, made once and cached within a
//! byte bound), [`photos`] (the grid and a photo's page), [`search`], [`upload`], [`jobs`],
//! [`cluster`], and [`page`] (the layout, the error page and the calls into `/v1`'s handlers).
//! Every page reads through `/v1`'s handler functions or the
//! [`Objects`](crate::objects::Objects) seam; nothing here reads the store or the catalog on
//! its own.
//!
//! To add a page: a module here with its handler, one `.route` line in [`router`], a template
//! in `templates/console/` extending `base.html`, and one link in `base.html`'s navigation.

mod access;
mod assets;
mod cluster;
mod duplicates;
mod history;
mod jobs;
mod models;
mod page;
mod photos;
mod search;
mod session;
mod storage;
mod thumbs;
mod train;
mod train_job;
mod tuner;
mod upload;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use super::http::{AppState, FrontState};
use crate::keys::KeyStore;
use crate::similar::SimilarFront;
pub(crate) use session::Sessions;
use thumbs::Thumbs;

/// The console's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConsoleSettings {
    /// How long a session lasts after sign-in.
    pub(crate) session_ttl: Duration,
    /// The bytes of thumbnails kept in memory.
    pub(crate) thumb_cache_bytes: usize,
    /// The largest body a form may send (an upload, a search by photo): `max_upload_bytes`.
    pub(crate) max_upload_bytes: usize,
    /// Samples of the process's counters kept for the storage page.
    pub(crate) history_samples: usize,
    /// Whether the session cookie is `Secure` (a console behind a TLS proxy).
    pub(crate) secure_cookie: bool,
}

/// What the console's pages work with.
#[derive(Clone)]
pub(crate) struct Console {
    front: FrontState,
    /// A PipeStore's state (search, jobs); `None` on a gateway.
    node: Option<AppState>,
    similar: Option<Arc<SimilarFront>>,
    keys: Arc<KeyStore>,
    sessions: Arc<Sessions>,
    thumbs: Arc<Thumbs>,
    /// The largest body a form may send (an upload, a search by photo).
    max_upload_bytes: usize,
    /// Whether the session cookie is `Secure`.
    secure_cookie: bool,
    /// The Tuner's `/v1/tuner` routes when one runs in this process (`ndpipe serve`).
    tuner: Option<Router>,
    /// The process's counters over time.
    history: Arc<history::History>,
}

impl Console {
    /// The console of a PipeStore.
    pub(crate) fn node(state: &AppState, keys: Arc<KeyStore>, settings: ConsoleSettings) -> Self {
        let front = axum::extract::FromRef::from_ref(state);
        Self::build(front, Some(state.clone()), state.similar(), keys, settings)
    }

    /// The console of a gateway, which has no search by class nor jobs.
    pub(crate) fn gateway(
        front: FrontState,
        similar: Arc<SimilarFront>,
        keys: Arc<KeyStore>,
        settings: ConsoleSettings,
    ) -> Self {
        Self::build(front, None, Some(similar), keys, settings)
    }

    fn build(
        front: FrontState,
        node: Option<AppState>,
        similar: Option<Arc<SimilarFront>>,
        keys: Arc<KeyStore>,
        settings: ConsoleSettings,
    ) -> Self {
        let history = history::History::sampling(&front, settings.history_samples);
        Console {
            front,
            node,
            similar,
            keys,
            sessions: Arc::new(Sessions::new(settings.session_ttl, session::MAX_SESSIONS)),
            thumbs: Arc::new(Thumbs::new(settings.thumb_cache_bytes)),
            max_upload_bytes: settings.max_upload_bytes,
            secure_cookie: settings.secure_cookie,
            tuner: None,
            history,
        }
    }

    /// A PipeStore's state (tasks, search, jobs), or 404 on a gateway, which has none.
    pub(crate) fn node_state(&self, what: &str) -> Result<AppState, page::ConsoleError> {
        self.node.clone().ok_or_else(|| {
            page::ConsoleError::new(
                axum::http::StatusCode::NOT_FOUND,
                format!("a gateway has no {what}; see a PipeStore's console"),
            )
        })
    }

    /// The same console, reaching the Tuner of this process through its `/v1/tuner` routes.
    pub(crate) fn with_tuner(self, tuner: Option<Router>) -> Self {
        Console { tuner, ..self }
    }
}

/// The console's routes, every one but sign-in and the assets behind a session.
pub(crate) fn router(console: Console) -> Router {
    let pages = Router::new()
        .route("/ui", get(photos::grid))
        .route("/ui/", get(photos::grid))
        .route("/ui/photos", get(photos::grid))
        .route("/ui/photos/{id}", get(photos::photo))
        .route("/ui/photos/{id}/original", get(photos::original))
        .route("/ui/photos/{id}/delete", post(photos::delete))
        .route("/ui/thumbs/{id}", get(thumbs::thumbnail))
        .route("/ui/search", get(search::page))
        .route("/ui/search/similar", post(search::similar))
        .route("/ui/upload", get(upload::page).post(upload::upload))
        .route("/ui/jobs", get(jobs::page))
        .route("/ui/jobs/table", get(jobs::table))
        .route("/ui/jobs/relabel", post(jobs::relabel))
        .route("/ui/cluster", get(cluster::page))
        .route("/ui/train", get(train::page))
        .route("/ui/train/label", post(train::label))
        .route("/ui/train/finetune", post(train::finetune))
        .route("/ui/train/jobs/{id}", get(train_job::page))
        .route("/ui/train/jobs/{id}/status", get(train_job::status))
        .route("/ui/train/jobs/{id}/chart", get(train_job::chart))
        .route("/ui/models", get(models::page))
        .route("/ui/models/deploy", post(models::deploy))
        .route("/ui/duplicates", get(duplicates::page))
        .route("/ui/duplicates/delete", post(duplicates::delete))
        .route("/ui/storage", get(storage::page))
        .route("/ui/storage/rates", get(storage::rates))
        .route("/ui/signout", post(access::sign_out))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            access::require,
        ));
    Router::new()
        .route(
            "/ui/signin",
            get(access::sign_in_page).post(access::sign_in),
        )
        .route("/ui/static/{file}", get(assets::asset))
        .merge(pages)
        .layer(DefaultBodyLimit::max(console.max_upload_bytes))
        .with_state(console)
}
