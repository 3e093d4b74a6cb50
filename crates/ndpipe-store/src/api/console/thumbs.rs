//! Thumbnails: made once per photo by the [`Objects`](crate::objects::Objects) seam (from the
//! stored tensor where it can, else the original), then kept in memory within a byte bound,
//! so a page of photos decodes nothing it has shown before.

use std::collections::{HashMap, VecDeque};

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use parking_lot::Mutex;

use super::Console;
use super::page::ConsoleError;
use crate::api::http::{ApiError, parse_id};

/// Thumbnails by photo id, the oldest dropped first once their bytes pass the bound.
pub(crate) struct Thumbs {
    max_bytes: usize,
    inner: Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    by_id: HashMap<u64, Bytes>,
    order: VecDeque<u64>,
    bytes: usize,
}

impl Thumbs {
    /// An empty cache of at most `max_bytes` (0: nothing is kept).
    pub(crate) fn new(max_bytes: usize) -> Self {
        Thumbs {
            max_bytes,
            inner: Mutex::new(Cached::default()),
        }
    }

    /// Photo `id`'s cached thumbnail.
    pub(crate) fn get(&self, id: u64) -> Option<Bytes> {
        self.inner.lock().by_id.get(&id).cloned()
    }

    /// Keeps `jpeg` as photo `id`'s thumbnail, dropping the oldest over the bound.
    pub(crate) fn put(&self, id: u64, jpeg: Bytes) {
        if jpeg.len() > self.max_bytes {
            return;
        }
        let mut c = self.inner.lock();
        if let Some(old) = c.by_id.insert(id, jpeg.clone()) {
            c.bytes -= old.len();
        } else {
            c.order.push_back(id);
        }
        c.bytes += jpeg.len();
        while c.bytes > self.max_bytes {
            let Some(oldest) = c.order.pop_front() else {
                break;
            };
            if let Some(gone) = c.by_id.remove(&oldest) {
                c.bytes -= gone.len();
            }
        }
    }

    /// Forgets photo `id`'s thumbnail (the photo was deleted).
    pub(crate) fn forget(&self, id: u64) {
        let mut c = self.inner.lock();
        if let Some(gone) = c.by_id.remove(&id) {
            c.bytes -= gone.len();
            c.order.retain(|i| *i != id);
        }
    }
}

/// `GET /ui/thumbs/{id}`: the photo's thumbnail (a JPEG), made on first view.
pub(crate) async fn thumbnail(
    State(console): State<Console>,
    Path(raw): Path<String>,
) -> Result<Response, ConsoleError> {
    let id = parse_id(&raw)?;
    let jpeg = match console.thumbs.get(id) {
        Some(jpeg) => jpeg,
        None => {
            let made = (console.front.objects().thumbnail(id).await)
                .map_err(|e| ConsoleError::from(ApiError::from(e)))?;
            let jpeg = Bytes::from(made.ok_or_else(|| ApiError::photo_not_found(id))?);
            console.thumbs.put(id, jpeg.clone());
            jpeg
        }
    };
    Ok((
        [
            (header::CONTENT_TYPE, "image/jpeg"),
            (header::CACHE_CONTROL, "private, max-age=86400"),
        ],
        jpeg,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_within_its_bound_dropping_the_oldest() {
        let thumbs = Thumbs::new(100);
        for id in 0..10 {
            thumbs.put(id, Bytes::from(vec![0u8; 30]));
            assert!(thumbs.inner.lock().bytes <= 100);
        }
        assert!(thumbs.get(9).is_some() && thumbs.get(7).is_some());
        assert!(thumbs.get(6).is_none(), "only three of 30 bytes fit");
        thumbs.put(9, Bytes::from(vec![0u8; 10]));
        assert_eq!(thumbs.inner.lock().bytes, 70);
        thumbs.forget(9);
        assert_eq!(thumbs.inner.lock().bytes, 60);
        thumbs.put(1, Bytes::from(vec![0u8; 101]));
        assert!(thumbs.get(1).is_none(), "larger than the bound: not kept");
    }
}
