//! S3's conditional requests.
//!
//! Reads (GetObject, HeadObject, and CopyObject's source with `x-amz-copy-source-if-*`) are
//! judged as RFC 9110 §13.2.2 orders it, which is what S3 documents: If-Match first, then
//! If-Unmodified-Since only without If-Match; If-None-Match, then If-Modified-Since only
//! without If-None-Match. So a true If-Match with a false If-Unmodified-Since answers 200, and
//! a false If-None-Match answers 304 whatever If-Modified-Since says. A GET or HEAD that is
//! not modified answers 304 with the ETag and Last-Modified and no body; a copy answers 412
//! instead, as S3 does. If-Match compares strongly (a weak `W/` tag never matches),
//! If-None-Match weakly; `*` matches any object, and a list of tags matches if one does. Times
//! compare in whole seconds, the resolution of Last-Modified.
//!
//! Writes (PutObject, CompleteMultipartUpload, CopyObject's destination) turn `If-None-Match:
//! *` and `If-Match` into a [`PutCondition`] that the catalog checks in the transaction that
//! writes, so two writers cannot both pass it.

use hyper::HeaderMap;
use hyper::header::{ETAG, HeaderName, HeaderValue, IF_MATCH, IF_NONE_MATCH, LAST_MODIFIED};
use ndpipe_catalog::{ObjectRecord, PutCondition};
use s3s::dto::{ETag, ETagCondition, Timestamp, TimestampFormat};
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};

use super::buckets::timestamp;

/// What a read's conditions decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Answer as if there were no conditions.
    Proceed,
    /// 304 for GET and HEAD.
    NotModified,
    /// 412.
    PreconditionFailed,
}

/// The conditions of a read, as `s3s` parsed them.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadConditions {
    pub(crate) if_match: Option<ETagCondition>,
    pub(crate) if_none_match: Option<ETagCondition>,
    pub(crate) if_modified_since: Option<Timestamp>,
    pub(crate) if_unmodified_since: Option<Timestamp>,
}

impl ReadConditions {
    /// The verdict for an object with ETag `etag` (without quotes) last written at
    /// `modified_ms`.
    pub(crate) fn verdict(&self, etag: &str, modified_ms: i64) -> Verdict {
        let current = ETag::Strong(etag.to_string());
        let modified = timestamp(modified_ms - modified_ms.rem_euclid(1000));
        let failed = match (&self.if_match, &self.if_unmodified_since) {
            (Some(tags), _) => !matches_any(tags, |t| t.strong_cmp(&current)),
            (None, Some(since)) => modified > *since,
            (None, None) => false,
        };
        if failed {
            return Verdict::PreconditionFailed;
        }
        let unchanged = match (&self.if_none_match, &self.if_modified_since) {
            (Some(tags), _) => matches_any(tags, |t| t.weak_cmp(&current)),
            (None, Some(since)) => modified <= *since,
            (None, None) => false,
        };
        if unchanged {
            Verdict::NotModified
        } else {
            Verdict::Proceed
        }
    }

    /// GetObject's and HeadObject's answer for `object`: 412 `PreconditionFailed`, or 304
    /// Not Modified with its ETag and Last-Modified, or go ahead.
    pub(crate) fn check_read(&self, object: &ObjectRecord) -> S3Result<()> {
        match self.verdict(&object.etag, object.modified_ms) {
            Verdict::Proceed => Ok(()),
            Verdict::PreconditionFailed => Err(precondition_failed()),
            Verdict::NotModified => Err(not_modified(object)),
        }
    }

    /// CopyObject's answer for its source `object`: 412 `PreconditionFailed` where a read
    /// would answer 304 or 412.
    pub(crate) fn check_copy_source(&self, object: &ObjectRecord) -> S3Result<()> {
        match self.verdict(&object.etag, object.modified_ms) {
            Verdict::Proceed => Ok(()),
            Verdict::NotModified | Verdict::PreconditionFailed => Err(precondition_failed()),
        }
    }
}

/// The tags of an `If-Match` or `If-None-Match`; `None` for `*`. `s3s` reads a list such as
/// `"a", "b"` as one tag whose value holds the rest of the list: written back out, it splits
/// at the commas (S3's ETags hold no comma or quote).
fn tags(condition: &ETagCondition) -> Option<Vec<ETag>> {
    let ETagCondition::ETag(tag) = condition else {
        return None;
    };
    if !tag.value().contains('"') {
        return Some(vec![tag.clone()]);
    }
    let raw = tag.to_http_header().map(|h| h.as_bytes().to_vec());
    let mut out = Vec::new();
    for one in raw.unwrap_or_default().split(|&b| b == b',') {
        match one.trim_ascii() {
            b"*" => return None,
            one => out.extend(ETag::parse_http_header(one).ok()),
        }
    }
    Some(out)
}

/// Whether `test` holds for one of the tags of `condition` (always, for `*`).
fn matches_any(condition: &ETagCondition, test: impl Fn(&ETag) -> bool) -> bool {
    tags(condition).is_none_or(|tags| tags.iter().any(test))
}

/// The [`PutCondition`] of a write's `If-Match` and `If-None-Match`. `If-None-Match` takes
/// only `*` on a write, as on S3 (501 `NotImplemented` for a tag). With
/// both, the write can never go ahead: it fails as `If-Match` would on a missing key (404)
/// and as `If-None-Match` would on an existing one (412).
pub(crate) fn write_condition(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<PutCondition> {
    if if_none_match.is_some_and(|c| !c.is_any()) {
        return Err(s3_error!(
            NotImplemented,
            "If-None-Match on a write takes only *"
        ));
    }
    Ok(match (if_match, if_none_match) {
        (None, None) => PutCondition::Always,
        (None, Some(_)) => PutCondition::Absent,
        (Some(_), Some(_)) => PutCondition::Matches(Vec::new()),
        (Some(tags), None) => PutCondition::Matches(strong_tags(tags)),
    })
}

/// CopyObject's [`write_condition`], from its `If-Match` and `If-None-Match` headers (`s3s`
/// does not parse them for this operation); 400 `InvalidArgument` when one does not parse.
pub(crate) fn copy_destination_condition(headers: &HeaderMap) -> S3Result<PutCondition> {
    let header = |name: HeaderName| {
        headers
            .get(&name)
            .map(|v| {
                ETagCondition::parse_http_header(v.as_bytes())
                    .map_err(|e| s3_error!(InvalidArgument, "{name}: {e}"))
            })
            .transpose()
    };
    write_condition(header(IF_MATCH)?.as_ref(), header(IF_NONE_MATCH)?.as_ref())
}

/// The tags of an `If-Match` as the catalog compares them: `*` for any, each strong tag's
/// value; a weak tag never matches, so it is left out.
fn strong_tags(condition: &ETagCondition) -> Vec<String> {
    match tags(condition) {
        None => vec!["*".into()],
        Some(tags) => tags.into_iter().filter_map(ETag::into_strong).collect(),
    }
}

/// S3's 412.
pub(crate) fn precondition_failed() -> S3Error {
    s3_error!(
        PreconditionFailed,
        "At least one of the pre-conditions you specified did not hold"
    )
}

/// A 304 for `object`: its ETag and Last-Modified, no body (`s3s` sends an error's headers
/// instead of its own, and HTTP sends no body with a 304).
fn not_modified(object: &ObjectRecord) -> S3Error {
    let mut e = S3Error::new(S3ErrorCode::NotModified);
    let mut headers = HeaderMap::new();
    if let Ok(etag) = ETag::Strong(object.etag.clone()).to_http_header() {
        headers.insert(ETAG, etag);
    }
    let mut date = Vec::new();
    if timestamp(object.modified_ms)
        .format(TimestampFormat::HttpDate, &mut date)
        .is_ok()
        && let Ok(date) = HeaderValue::from_bytes(&date)
    {
        headers.insert(LAST_MODIFIED, date);
    }
    e.set_headers(headers);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "0123456789abcdef0123456789abcdef";
    /// 2023-11-14T22:13:20.500Z: Last-Modified says 22:13:20.
    const MODIFIED_MS: i64 = 1_700_000_000_500;

    fn tag(header: &str) -> Option<ETagCondition> {
        Some(ETagCondition::parse_http_header(header.as_bytes()).unwrap())
    }

    fn at(secs: i64) -> Option<Timestamp> {
        Some(timestamp(secs * 1000))
    }

    fn verdict(c: ReadConditions) -> Verdict {
        c.verdict(TAG, MODIFIED_MS)
    }

    const SECS: i64 = MODIFIED_MS / 1000;

    #[test]
    fn if_match_compares_strongly_with_or_without_quotes() {
        let ok = Verdict::Proceed;
        let failed = Verdict::PreconditionFailed;
        for (header, want) in [
            (format!("\"{TAG}\""), ok),
            (TAG.to_string(), ok),
            ("*".into(), ok),
            (format!("\"x\", \"{TAG}\""), ok),
            ("\"x\"".into(), failed),
            (format!("W/\"{TAG}\""), failed),
        ] {
            let c = ReadConditions {
                if_match: tag(&header),
                ..ReadConditions::default()
            };
            assert_eq!(verdict(c), want, "If-Match: {header}");
        }
    }

    #[test]
    fn if_none_match_compares_weakly() {
        for (header, want) in [
            (format!("\"{TAG}\""), Verdict::NotModified),
            (format!("W/\"{TAG}\""), Verdict::NotModified),
            ("*".into(), Verdict::NotModified),
            (format!("W/\"x\", \"{TAG}\""), Verdict::NotModified),
            ("\"x\"".into(), Verdict::Proceed),
        ] {
            let c = ReadConditions {
                if_none_match: tag(&header),
                ..ReadConditions::default()
            };
            assert_eq!(verdict(c), want, "If-None-Match: {header}");
        }
    }

    #[test]
    fn dates_compare_in_whole_seconds() {
        let since = |s| ReadConditions {
            if_modified_since: at(s),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(since(SECS)), Verdict::NotModified);
        assert_eq!(verdict(since(SECS - 1)), Verdict::Proceed);
        let unmodified = |s| ReadConditions {
            if_unmodified_since: at(s),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(unmodified(SECS)), Verdict::Proceed);
        assert_eq!(verdict(unmodified(SECS - 1)), Verdict::PreconditionFailed);
    }

    #[test]
    fn s3_precedence_between_tags_and_dates() {
        // If-Match true and If-Unmodified-Since false: 200.
        let c = ReadConditions {
            if_match: tag(TAG),
            if_unmodified_since: at(SECS - 10),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(c), Verdict::Proceed);
        // If-None-Match false and If-Modified-Since true: 304.
        let c = ReadConditions {
            if_none_match: tag(TAG),
            if_modified_since: at(SECS - 10),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(c), Verdict::NotModified);
        // If-None-Match true and If-Modified-Since false: the tag decides, 200.
        let c = ReadConditions {
            if_none_match: tag("\"x\""),
            if_modified_since: at(SECS + 10),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(c), Verdict::Proceed);
        // A failed If-Match wins over a 304.
        let c = ReadConditions {
            if_match: tag("\"x\""),
            if_none_match: tag(TAG),
            ..ReadConditions::default()
        };
        assert_eq!(verdict(c), Verdict::PreconditionFailed);
    }

    #[test]
    fn writes_take_create_only_and_replace_only() {
        let cond = |m: Option<&str>, n: Option<&str>| {
            write_condition(tag_ref(m).as_ref(), tag_ref(n).as_ref())
        };
        fn tag_ref(h: Option<&str>) -> Option<ETagCondition> {
            h.and_then(tag)
        }
        assert_eq!(cond(None, None).unwrap(), PutCondition::Always);
        assert_eq!(cond(None, Some("*")).unwrap(), PutCondition::Absent);
        assert_eq!(
            cond(Some(&format!("\"{TAG}\"")), None).unwrap(),
            PutCondition::Matches(vec![TAG.into()])
        );
        assert_eq!(
            cond(Some("*"), None).unwrap(),
            PutCondition::Matches(vec!["*".into()])
        );
        assert_eq!(
            cond(Some("W/\"x\", \"y\""), None).unwrap(),
            PutCondition::Matches(vec!["y".into()])
        );
        assert_eq!(
            cond(Some("\"y\""), Some("*")).unwrap(),
            PutCondition::Matches(vec![])
        );
        let refused = cond(None, Some("\"y\"")).unwrap_err();
        assert_eq!(refused.code(), &S3ErrorCode::NotImplemented);
    }

    #[test]
    fn a_copy_reads_its_destination_conditions_from_the_headers() {
        let mut headers = HeaderMap::new();
        let read = |h: &HeaderMap| copy_destination_condition(h);
        assert_eq!(read(&headers).unwrap(), PutCondition::Always);
        headers.insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert_eq!(read(&headers).unwrap(), PutCondition::Absent);
        headers.insert(IF_MATCH, HeaderValue::from_static("not a tag"));
        assert_eq!(
            read(&headers).unwrap_err().code(),
            &S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn a_304_carries_the_etag_and_last_modified() {
        let mut object = ndpipe_catalog::test_suite::object("b", "k", None);
        object.etag = TAG.into();
        object.modified_ms = MODIFIED_MS;
        let e = not_modified(&object);
        assert_eq!(e.status_code(), Some(hyper::StatusCode::NOT_MODIFIED));
        let headers = e.headers().unwrap();
        assert_eq!(headers[ETAG], format!("\"{TAG}\"").as_str());
        assert_eq!(headers[LAST_MODIFIED], "Tue, 14 Nov 2023 22:13:20 GMT");
    }
}
