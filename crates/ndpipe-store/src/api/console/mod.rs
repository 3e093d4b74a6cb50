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
mod jobs;
mod page;
mod photos;
mod search;
mod session;
mod thumbs;
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
        Console {
            front,
            node,
            similar,
            keys,
            sessions: Arc::new(Sessions::new(settings.session_ttl, session::MAX_SESSIONS)),
            thumbs: Arc::new(Thumbs::new(settings.thumb_cache_bytes)),
            max_upload_bytes: settings.max_upload_bytes,
        }
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
