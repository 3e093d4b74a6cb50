//! Who may use the console: sign in with an access key (its id and secret, checked by the
//! [`KeyStore`](crate::keys::KeyStore) that `/v1` asks), a session cookie, and the roles of
//! `/v1`: reading needs `read`, a change `write`. With no key configured the console is open,
//! as `/v1` is. The cookie is `HttpOnly` and `SameSite=Strict`, and `Secure` with
//! `console_secure_cookie` (the HTTP listener serves plain HTTP: a TLS proxy goes in front).

use axum::extract::{Form, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use ndpipe_catalog::Role;
use serde::Deserialize;

use super::Console;
use super::page::{ConsoleError, SignInPage};
use super::session::Session;
use crate::api::http::open_to_all;

/// The session cookie's name.
const COOKIE: &str = "ndpipe_console";

/// Who is looking at a page: the session, and the role it has (`None`: an open console).
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub(crate) session: Session,
    pub(crate) role: Option<Role>,
}

impl Viewer {
    /// Refuses a change whose form does not carry this session's CSRF token (403).
    pub(crate) fn check_csrf(&self, token: Option<&str>) -> Result<(), ConsoleError> {
        match token {
            Some(t) if self.session.csrf_ok(t) => Ok(()),
            _ => Err(ConsoleError::forbidden(
                "this form is not from this session (CSRF token missing or wrong)",
            )),
        }
    }
}

/// The role a console route needs: reading, a search by photo and signing out need `read`,
/// any other change `write`.
fn needed(method: &Method, path: &str) -> Role {
    match path {
        "/ui/search/similar" | "/ui/signout" => Role::Read,
        _ if method == Method::GET || method == Method::HEAD => Role::Read,
        _ => Role::Write,
    }
}

/// The session id in the request's cookie.
fn session_id(headers: &HeaderMap) -> Option<String> {
    let cookies = headers.get_all(header::COOKIE);
    cookies
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, id)| id.to_string())
}

/// The `Set-Cookie` value of session `id`, lasting `max_age` seconds (0: removed), `Secure`
/// where the console is reached over HTTPS.
fn cookie(id: &str, max_age: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let value =
        format!("{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static(""))
}

/// Whether any key exists, and the role of the session's key (`None` when it has none or
/// the key is gone).
async fn decide(
    console: &Console,
    session: Option<&Session>,
) -> Result<(bool, Option<Role>), ConsoleError> {
    let keys = console.keys.clone();
    let key = session.and_then(|s| s.access_key.clone());
    tokio::task::spawn_blocking(move || {
        let any = keys.any()?;
        let role = match key {
            Some(k) => keys.secret_of(&k)?.map(|(role, _)| role),
            None => None,
        };
        Ok::<_, crate::keys::KeyError>((any, role))
    })
    .await
    .map_err(ConsoleError::internal)?
    .map_err(ConsoleError::internal)
}

/// The guard of every console route but sign-in and the assets: the session's role must
/// allow the call (403 page), a browser without one is sent to sign in. An open console
/// gives a browser a session of its own, for the CSRF tokens of its forms.
pub(crate) async fn require(
    State(console): State<Console>,
    mut req: Request,
    next: Next,
) -> Response {
    let needed = needed(req.method(), req.uri().path());
    let htmx = req.headers().contains_key("hx-request");
    let session = session_id(req.headers()).and_then(|id| console.sessions.get(&id));
    let (any, role) = match decide(&console, session.as_ref()).await {
        Ok(decided) => decided,
        Err(e) => return e.into_response(),
    };
    let open = open_to_all(any, console.keys.has_token(), needed);
    let allowed = open || role.is_some_and(|r| r >= needed);
    match (session, role) {
        (Some(session), _) if allowed => {
            req.extensions_mut().insert(Viewer { session, role });
            next.run(req).await
        }
        (None, _) if open => {
            let Ok((id, session)) = console.sessions.create(None) else {
                return ConsoleError::internal("no randomness for a session id").into_response();
            };
            req.extensions_mut().insert(Viewer { session, role });
            let mut response = next.run(req).await;
            let max_age = console.sessions.ttl().as_secs();
            (response.headers_mut()).append(
                header::SET_COOKIE,
                cookie(&id, max_age, console.secure_cookie),
            );
            response
        }
        (Some(_), Some(role)) => {
            ConsoleError::forbidden(format!("a {role} key cannot do this; it needs {needed}"))
                .into_response()
        }
        _ => to_sign_in(htmx),
    }
}

/// Sends the browser to sign in; a part htmx asked for (`htmx`) sends the whole page there.
fn to_sign_in(htmx: bool) -> Response {
    if htmx {
        return [("hx-redirect", "/ui/signin")].into_response();
    }
    Redirect::to("/ui/signin").into_response()
}

/// `GET /ui/signin`.
pub(crate) async fn sign_in_page() -> SignInPage {
    SignInPage { failed: None }
}

/// The sign-in form.
#[derive(Debug, Deserialize)]
pub(crate) struct Credentials {
    access_key: String,
    secret_key: String,
}

/// `POST /ui/signin`: a session for a key whose secret matches; the photos next.
pub(crate) async fn sign_in(
    State(console): State<Console>,
    form: Result<Form<Credentials>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    let Ok(Form(creds)) = form else {
        return Ok(failed("give an access key id and its secret"));
    };
    let keys = console.keys.clone();
    let key = creds.access_key.trim().to_string();
    let lookup = key.clone();
    let found = tokio::task::spawn_blocking(move || keys.secret_of(&lookup))
        .await
        .map_err(ConsoleError::internal)?
        .map_err(ConsoleError::internal)?;
    let matches = found.is_some_and(|(_, secret)| {
        ndpipe_util::http::constant_time_eq(secret.as_bytes(), creds.secret_key.as_bytes())
    });
    if !matches {
        return Ok(failed("unknown access key or wrong secret"));
    }
    let (id, _) = console
        .sessions
        .create(Some(key))
        .map_err(ConsoleError::internal)?;
    let max_age = console.sessions.ttl().as_secs();
    Ok((
        [(
            header::SET_COOKIE,
            cookie(&id, max_age, console.secure_cookie),
        )],
        Redirect::to("/ui/photos"),
    )
        .into_response())
}

/// The sign-in page again, 401, saying why.
fn failed(why: &str) -> Response {
    let page = SignInPage {
        failed: Some(why.to_string()),
    };
    (axum::http::StatusCode::UNAUTHORIZED, page).into_response()
}

/// The form of a change that carries nothing but its CSRF token.
#[derive(Debug, Deserialize)]
struct CsrfOnly {
    csrf: Option<String>,
}

/// A change's form whose CSRF token is the session's: taking it as an argument is the check
/// (403 without it; 400 for a body that is not a form).
#[derive(Debug)]
pub(crate) struct Checked;

impl<S: Send + Sync> FromRequest<S> for Checked {
    type Rejection = ConsoleError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let viewer = (req.extensions().get::<Viewer>().cloned())
            .ok_or_else(|| ConsoleError::internal("a change without a session"))?;
        let Form(form) = Form::<CsrfOnly>::from_request(req, state)
            .await
            .map_err(|e| ConsoleError::bad_request(e.body_text()))?;
        viewer.check_csrf(form.csrf.as_deref())?;
        Ok(Checked)
    }
}

/// `POST /ui/signout`: ends the session.
pub(crate) async fn sign_out(
    State(console): State<Console>,
    headers: HeaderMap,
    _: Checked,
) -> Result<Response, ConsoleError> {
    if let Some(id) = session_id(&headers) {
        console.sessions.remove(&id);
    }
    Ok((
        [(header::SET_COOKIE, cookie("", 0, console.secure_cookie))],
        Redirect::to("/ui/signin"),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_need_write_and_reading_read() {
        assert_eq!(needed(&Method::GET, "/ui/photos"), Role::Read);
        assert_eq!(needed(&Method::POST, "/ui/search/similar"), Role::Read);
        assert_eq!(needed(&Method::POST, "/ui/signout"), Role::Read);
        assert_eq!(needed(&Method::POST, "/ui/photos/3/delete"), Role::Write);
        assert_eq!(needed(&Method::POST, "/ui/jobs/relabel"), Role::Write);
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; ndpipe_console=abc; b=2"),
        );
        assert_eq!(session_id(&headers).as_deref(), Some("abc"));
        let set = cookie("abc", 60, false);
        let set = set.to_str().unwrap();
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert!(set.contains("Max-Age=60") && !set.contains("Secure"));
        let secure = cookie("abc", 60, true);
        assert!(secure.to_str().unwrap().ends_with("; Secure"));
    }
}
