//! The console's static files, compiled in: htmx and uPlot (vendored with their licences in
//! `assets/console/vendor/`), our CSS, the small script that shows dates in the browser's
//! locale and the upload page's script. Served with a day's cache lifetime (the names carry
//! no version, so a new release reaches browsers within a day).

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One file: its name, type and bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "htmx.min.js",
        "text/javascript",
        include_bytes!("../../../assets/console/vendor/htmx.min.js"),
    ),
    (
        "uPlot.min.js",
        "text/javascript",
        include_bytes!("../../../assets/console/vendor/uPlot.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css",
        include_bytes!("../../../assets/console/vendor/uPlot.min.css"),
    ),
    (
        "console.css",
        "text/css",
        include_bytes!("../../../assets/console/console.css"),
    ),
    (
        "console.js",
        "text/javascript",
        include_bytes!("../../../assets/console/console.js"),
    ),
    (
        "upload.js",
        "text/javascript",
        include_bytes!("../../../assets/console/upload.js"),
    ),
    (
        "charts.js",
        "text/javascript",
        include_bytes!("../../../assets/console/charts.js"),
    ),
];

/// `GET /ui/static/{file}`.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    let Some((_, kind, bytes)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, *kind),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        *bytes,
    )
        .into_response()
}
