//! Who may call `/v1` (and the routes merged beside it, an embedded Tuner's `/v1/tuner`), and
//! a standalone Tuner's API ([`guard_router`]): one access model for every HTTP server.
//!
//! Every call needs a role: `GET`/`HEAD` need `read`, `/v1/admin/...` and the Tuner's writes
//! (`/v1/tuner/...` by any other method) need `admin`, any other method `write`; the probes
//! `/healthz` and `/readyz` are open, and `/metrics` is open with `metrics_open`. The role
//! comes from `Authorization: Bearer SECRET`: the admin token, or an access key's secret.
//! While no access key exists, only writes need a role, and only when a token is set (as
//! before keys existed); once one exists, every call needs one. No credentials, or unknown
//! ones: 401; a role too low: 403.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ndpipe_catalog::{AccessKeys, Role};

use super::error::{ApiError, internal};
use crate::keys::{KeyError, KeyStore};
use crate::metrics::StoreMetrics;

/// What the guard needs.
#[derive(Clone)]
pub(crate) struct Guard {
    pub(crate) keys: Arc<KeyStore>,
    /// Where refusals are counted (a standalone Tuner has no store metrics).
    pub(crate) metrics: Option<Arc<StoreMetrics>>,
    pub(crate) metrics_open: bool,
}

impl Guard {
    fn count(&self, kind: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.error(kind);
        }
    }
}

/// `router` (a standalone Tuner's API) behind the PipeStores' guard: the access keys in `keys`
/// (the catalog the router's server shares with the PipeStores; their secrets are checked by
/// hash, so no master key is needed) and `token`, an admin key.
pub fn guard_router(router: Router, keys: Arc<dyn AccessKeys>, token: Option<String>) -> Router {
    let guard = Guard {
        keys: Arc::new(KeyStore::bearer_only(keys, token)),
        metrics: None,
        metrics_open: false,
    };
    router.layer(axum::middleware::from_fn_with_state(guard, authorize))
}

/// The role a call needs; `None`: open to anyone.
fn required(method: &Method, path: &str, metrics_open: bool) -> Option<Role> {
    match path {
        "/healthz" | "/readyz" => None,
        // The console signs in with a key and decides its own routes by session, with
        // these same roles (`api/console/access.rs`).
        p if p == "/ui" || p.starts_with("/ui/") => None,
        "/metrics" if metrics_open => None,
        p if p.starts_with("/v1/admin/") || p == "/v1/admin" => Some(Role::Admin),
        p if p.starts_with("/v1/tuner/") && method != Method::GET && method != Method::HEAD => {
            Some(Role::Admin)
        }
        // A query photo is read with, never stored; a batch of neighbours only reads.
        "/v1/similar" | "/v1/similar/neighbours" => Some(Role::Read),
        _ if method == Method::GET || method == Method::HEAD => Some(Role::Read),
        _ => Some(Role::Write),
    }
}

/// Whether a call needing `needed` is open to anyone: while no access key exists, reads are,
/// and writes too unless the admin token is set.
pub(crate) fn open_to_all(any_key: bool, has_token: bool, needed: Role) -> bool {
    !any_key && (needed == Role::Read || !has_token)
}

fn bearer(req: &Request) -> Option<String> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
}

/// Answers 401 or 403 (counted as `unauthorized`, `forbidden`) unless the caller's role
/// allows the call.
pub(crate) async fn authorize(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let Some(needed) = required(req.method(), req.uri().path(), guard.metrics_open) else {
        return next.run(req).await;
    };
    let token = bearer(&req);
    let keys = guard.keys.clone();
    // Keys are answered from memory (`key_cache.rs`); only before their first load does
    // this ask the catalog, within the catalog deadline.
    let decided = crate::catalog_deadline::within(move || {
        let any = keys.any()?;
        let role = match &token {
            Some(t) => keys.role_of_bearer(t)?,
            None => None,
        };
        Ok::<_, KeyError>((any, role))
    })
    .await;
    let (any, role) = match decided {
        Ok(Ok(Ok(decided))) => decided,
        Ok(Ok(Err(e))) => return ApiError::from(e).into_response(),
        Ok(Err(e)) => return internal(e).into_response(),
        Err(late) => {
            return ApiError::from(crate::catalog_deadline::unavailable(late)).into_response();
        }
    };
    let open = open_to_all(any, guard.keys.has_token(), needed);
    match role {
        _ if open => next.run(req).await,
        Some(role) if role >= needed => next.run(req).await,
        Some(role) => {
            guard.count("forbidden");
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("a {role} key cannot do this; it needs {needed}"),
            )
            .into_response()
        }
        None => {
            guard.count("unauthorized");
            ndpipe_util::http::unauthorized()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_needs_a_role_but_health() {
        let get = |p| required(&Method::GET, p, false);
        assert_eq!(get("/healthz"), None);
        assert_eq!(get("/readyz"), None);
        assert_eq!(get("/ui/photos"), None, "the console decides by session");
        assert_eq!(get("/metrics"), Some(Role::Read));
        assert_eq!(required(&Method::GET, "/metrics", true), None);
        assert_eq!(get("/v1/photos/1/tensor"), Some(Role::Read));
        assert_eq!(get("/v1/tuner/jobs"), Some(Role::Read));
        assert_eq!(get("/v1/admin/keys"), Some(Role::Admin));
        assert_eq!(
            required(&Method::POST, "/v1/similar", false),
            Some(Role::Read)
        );
        assert_eq!(
            required(&Method::POST, "/v1/similar/neighbours", false),
            Some(Role::Read)
        );
        assert_eq!(
            required(&Method::POST, "/v1/photos", false),
            Some(Role::Write)
        );
        assert_eq!(
            required(&Method::DELETE, "/v1/photos/3", false),
            Some(Role::Write)
        );
        assert_eq!(
            required(&Method::POST, "/v1/admin/compact", false),
            Some(Role::Admin)
        );
        assert_eq!(
            required(&Method::POST, "/v1/tuner/finetune", false),
            Some(Role::Admin)
        );
        assert_eq!(
            required(&Method::DELETE, "/v1/tuner/nodes/a", false),
            Some(Role::Admin)
        );
        assert_eq!(get("/v1/tuner/nodes"), Some(Role::Read));
    }
}
