//! What every page shares: the navigation's view of the viewer, the error page, dates, and
//! [`reply`], which turns the answer of a `/v1` handler into a page's values.

use askama::Template;
use askama_web::WebTemplate;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::access::Viewer;
use crate::api::http::ApiError;

/// The largest `/v1` answer a page reads.
const MAX_REPLY_BYTES: usize = 64 << 20;

/// What the layout shows of the viewer: who, whether the console is open, the CSRF token of
/// its forms, and which pages this front door has.
pub(crate) struct Chrome {
    pub(crate) signed_in_as: Option<String>,
    pub(crate) role: String,
    pub(crate) csrf: String,
    /// A PipeStore has search by class and jobs; a gateway has not.
    pub(crate) node: bool,
}

impl Chrome {
    /// The layout of `viewer`'s pages.
    pub(crate) fn of(viewer: &Viewer, node: bool) -> Self {
        Chrome {
            signed_in_as: viewer.session.access_key.clone(),
            role: viewer
                .role
                .map_or_else(|| "open".to_string(), |r| r.to_string()),
            csrf: viewer.session.csrf.clone(),
            node,
        }
    }

    /// Whether the console is open (no access key configured).
    pub(crate) fn open(&self) -> bool {
        self.signed_in_as.is_none()
    }
}

/// An error shown as a page with its status.
#[derive(Debug, Template)]
#[template(path = "console/error.html")]
pub(crate) struct ConsoleError {
    status: StatusCode,
    message: String,
}

impl ConsoleError {
    /// An error with `status`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ConsoleError {
            status,
            message: message.into(),
        }
    }

    /// 403.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// 500 for a failure the viewer cannot act on.
    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }

    /// 400.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// Its status.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// What went wrong.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The status's number and reason.
    fn title(&self) -> String {
        self.status.to_string()
    }
}

impl From<ApiError> for ConsoleError {
    fn from(e: ApiError) -> Self {
        ConsoleError::new(e.status, e.message)
    }
}

/// Renders the page with its status (askama's own response is always 200).
impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status;
        match self.render() {
            Ok(html) => {
                (status, [("content-type", "text/html; charset=utf-8")], html).into_response()
            }
            Err(_) => status.into_response(),
        }
    }
}

/// The sign-in page (`failed`: why the last try was refused).
#[derive(Template, WebTemplate)]
#[template(path = "console/signin.html")]
pub(crate) struct SignInPage {
    pub(crate) failed: Option<String>,
}

/// The values of a `/v1` handler's answer (its JSON body read as `V`), or its error as a page.
pub(crate) async fn reply<V: DeserializeOwned>(
    answer: Result<impl IntoResponse, ApiError>,
) -> Result<V, ConsoleError> {
    let response = answer?.into_response();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), MAX_REPLY_BYTES)
        .await
        .map_err(ConsoleError::internal)?;
    if !status.is_success() {
        return Err(ConsoleError::new(status, String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(ConsoleError::internal)
}

/// Milliseconds since the Unix epoch as ISO 8601 UTC (`2026-12-05T14:12:38Z`), the
/// `datetime` of a `<time>` the browser shows in its locale.
pub(crate) fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let (h, min, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}Z")
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_iso_utc() {
        assert_eq!(iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso(1_796_481_158_000), "2026-12-05T14:32:38Z");
        assert_eq!(iso(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[tokio::test]
    async fn an_api_error_becomes_a_page_with_its_status() {
        let answer: Result<axum::Json<u32>, _> = Err(ApiError::bad_request("bad", "no"));
        let e = reply::<u32>(answer).await.unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
    }
}
