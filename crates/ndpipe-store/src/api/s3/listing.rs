//! `ListObjectsV2` (and V1): keys in byte order under a prefix, rolled up into common prefixes
//! at a delimiter, a page of at most `max-keys` (1000) entries at a time. The continuation token
//! is the hex of the last key or prefix the page ended at; a rolled-up prefix is skipped whole,
//! and so is one at or before the cursor (V1's `NextMarker` is the prefix itself). Every object
//! is owned by the store: [`owner`] (V1 always lists it, V2 with `fetch-owner=true`).

use ndpipe_catalog::ObjectRecord;
use s3s::dto::*;
use s3s::{S3Response, S3Result, s3_error};

use super::buckets::{require, timestamp};
use super::errors::catalog as catalog_error;
use super::{S3State, blocking};

/// The most entries of one page (S3's own limit).
const MAX_KEYS: usize = 1000;
/// Appended to a common prefix to make a cursor after every key that starts with it.
const PAST_PREFIX: char = char::MAX;

/// The owner of every bucket and object: the store itself (`ID` and `DisplayName` both
/// `ndpipe`, whoever the caller is).
pub(crate) fn owner() -> Owner {
    Owner {
        display_name: Some("ndpipe".into()),
        id: Some("ndpipe".into()),
    }
}

/// One page of a listing.
#[derive(Default)]
pub(super) struct Page {
    pub(super) objects: Vec<ObjectRecord>,
    pub(super) prefixes: Vec<String>,
    /// Where the next page starts (after it), when there is one.
    pub(super) next: Option<String>,
}

impl Page {
    /// The marker of the next page for V1 and `ListObjectVersions`: the last key or common
    /// prefix listed.
    pub(super) fn next_marker(&self) -> Option<String> {
        self.next
            .as_ref()
            .map(|c| c.trim_end_matches(PAST_PREFIX).to_string())
    }
}

/// What to list.
pub(super) struct Query<'a> {
    pub(super) bucket: &'a str,
    pub(super) prefix: &'a str,
    pub(super) delimiter: Option<&'a str>,
    pub(super) after: Option<String>,
    pub(super) max: usize,
}

/// Lists one page of `q`: objects and common prefixes in key order, at most `q.max` of them;
/// a common prefix at or before the cursor was listed already and is skipped.
pub(super) async fn page(state: &S3State, q: Query<'_>) -> S3Result<Page> {
    let mut out = Page::default();
    let mut cursor = q.after;
    loop {
        let batch = fetch(state, q.bucket, q.prefix, cursor.clone(), MAX_KEYS).await?;
        let exhausted = batch.len() < MAX_KEYS;
        for object in batch {
            if cursor.as_deref().is_some_and(|c| object.key.as_str() <= c) {
                continue;
            }
            let common = rolled_up(&object.key, q.prefix, q.delimiter);
            if let Some(common) = &common
                && cursor.as_deref().is_some_and(|c| common.as_str() <= c)
            {
                cursor = Some(format!("{common}{PAST_PREFIX}"));
                continue;
            }
            if out.objects.len() + out.prefixes.len() == q.max {
                out.next = cursor;
                return Ok(out);
            }
            match common {
                Some(common) => {
                    cursor = Some(format!("{common}{PAST_PREFIX}"));
                    out.prefixes.push(common);
                }
                None => {
                    cursor = Some(object.key.clone());
                    out.objects.push(object);
                }
            }
        }
        if exhausted {
            return Ok(out);
        }
    }
}

/// Up to `limit` objects of `bucket` under `prefix`, after `after`.
async fn fetch(
    state: &S3State,
    bucket: &str,
    prefix: &str,
    after: Option<String>,
    limit: usize,
) -> S3Result<Vec<ObjectRecord>> {
    let catalog = state.catalog.clone();
    let (bucket, prefix) = (bucket.to_string(), prefix.to_string());
    blocking(move || {
        catalog
            .list_objects(&bucket, &prefix, after.as_deref(), limit)
            .map_err(catalog_error)
    })
    .await
}

/// The common prefix `key` rolls up into: `prefix` and the rest of the key up to and
/// including the first `delimiter` after it; `None` for a key outside `prefix` (the catalog
/// lists only keys within it, but the function no longer relies on that: fuzz regression
/// `rolled-up-key-outside-prefix`).
pub(super) fn rolled_up(key: &str, prefix: &str, delimiter: Option<&str>) -> Option<String> {
    let delimiter = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.strip_prefix(prefix)?;
    let at = rest.find(delimiter)?;
    Some(key[..prefix.len() + at + delimiter.len()].to_string())
}

/// The page size asked for: 0..=1000 (S3 caps larger values at 1000).
pub(super) fn max_keys(asked: Option<i32>) -> S3Result<usize> {
    match asked {
        None => Ok(MAX_KEYS),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(MAX_KEYS).min(MAX_KEYS)),
    }
}

/// A continuation token back to the cursor it was made from.
pub(super) fn decode_token(token: &str) -> S3Result<String> {
    hex::decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not valid"))
}

/// `text` percent-encoded for `encoding-type=url` (unreserved characters and `/` kept).
pub(super) fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The delimiter a listing echoes: none for an empty one.
pub(super) fn echoed(delimiter: Option<String>) -> Option<String> {
    delimiter.filter(|d| !d.is_empty())
}

/// The listing's entries, keys encoded as the client asked, with the owner when `owned`.
fn entries(page: &Page, encode: bool, owned: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
    let enc = |s: &str| if encode { url_encode(s) } else { s.to_string() };
    let objects = page
        .objects
        .iter()
        .map(|o| Object {
            key: Some(enc(&o.key)),
            size: i64::try_from(o.bytes).ok(),
            e_tag: Some(ETag::Strong(o.etag.clone())),
            last_modified: Some(timestamp(o.modified_ms)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            owner: owned.then(owner),
            ..Object::default()
        })
        .collect();
    (objects, common_prefixes(page, encode))
}

/// The page's common prefixes, encoded as the client asked.
pub(super) fn common_prefixes(page: &Page, encode: bool) -> Vec<CommonPrefix> {
    page.prefixes
        .iter()
        .map(|p| CommonPrefix {
            prefix: Some(if encode { url_encode(p) } else { p.clone() }),
        })
        .collect()
}

pub(super) fn wants_url(encoding: Option<&EncodingType>) -> bool {
    encoding.is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// `ListObjectsV2`.
pub(crate) async fn list_v2(
    state: &S3State,
    input: ListObjectsV2Input,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    require(state, &input.bucket).await?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let after = match &input.continuation_token {
        Some(token) => Some(decode_token(token)?),
        None => input.start_after.clone(),
    };
    let max = max_keys(input.max_keys)?;
    let page = page(
        state,
        Query {
            bucket: &input.bucket,
            prefix: &prefix,
            delimiter: input.delimiter.as_deref(),
            after,
            max,
        },
    )
    .await?;
    let encode = wants_url(input.encoding_type.as_ref());
    let (objects, prefixes) = entries(&page, encode, input.fetch_owner == Some(true));
    let count = objects.len() + prefixes.len();
    Ok(S3Response::new(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(prefix),
        max_keys: i32::try_from(max).ok(),
        key_count: i32::try_from(count).ok(),
        continuation_token: input.continuation_token,
        is_truncated: Some(page.next.is_some()),
        next_continuation_token: page.next.map(|c| hex::encode(c.as_bytes())),
        contents: Some(objects),
        common_prefixes: Some(prefixes),
        delimiter: echoed(input.delimiter),
        encoding_type: input.encoding_type,
        start_after: input.start_after,
        ..ListObjectsV2Output::default()
    }))
}

/// `ListObjects` (V1): the same listing, paged by `marker`, always with `<Marker>` and the
/// owner.
pub(crate) async fn list_v1(
    state: &S3State,
    input: ListObjectsInput,
) -> S3Result<S3Response<ListObjectsOutput>> {
    require(state, &input.bucket).await?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let max = max_keys(input.max_keys)?;
    let page = page(
        state,
        Query {
            bucket: &input.bucket,
            prefix: &prefix,
            delimiter: input.delimiter.as_deref(),
            after: input.marker.clone(),
            max,
        },
    )
    .await?;
    let encode = wants_url(input.encoding_type.as_ref());
    let (objects, prefixes) = entries(&page, encode, true);
    let next_marker = page.next_marker();
    Ok(S3Response::new(ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(prefix),
        marker: Some(input.marker.unwrap_or_default()),
        max_keys: i32::try_from(max).ok(),
        is_truncated: Some(page.next.is_some()),
        contents: Some(objects),
        common_prefixes: Some(prefixes),
        delimiter: echoed(input.delimiter),
        next_marker,
        encoding_type: input.encoding_type,
        ..ListObjectsOutput::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_roll_up_at_the_first_delimiter_after_the_prefix() {
        assert_eq!(
            rolled_up("a/b/c.jpg", "", Some("/")),
            Some("a/".to_string())
        );
        assert_eq!(
            rolled_up("a/b/c.jpg", "a/", Some("/")),
            Some("a/b/".to_string())
        );
        assert_eq!(rolled_up("a/c.jpg", "a/", Some("/")), None);
        assert_eq!(rolled_up("a/c.jpg", "a/", None), None);
        assert_eq!(rolled_up("a/c.jpg", "a/", Some("")), None);
    }

    #[test]
    fn tokens_and_url_encoding_round_trip() {
        let cursor = format!("photos/2024/{PAST_PREFIX}");
        assert_eq!(
            decode_token(&hex::encode(cursor.as_bytes())).unwrap(),
            cursor
        );
        assert!(decode_token("zz").is_err());
        assert_eq!(url_encode("a b/ü+.jpg"), "a%20b/%C3%BC%2B.jpg");
        assert_eq!(max_keys(Some(5000)).unwrap(), 1000);
        assert!(max_keys(Some(-1)).is_err());
    }
}
