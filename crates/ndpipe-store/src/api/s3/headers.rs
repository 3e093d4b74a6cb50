//! The standard headers S3 keeps with an object (`Cache-Control`, `Content-Disposition`,
//! `Content-Encoding`, `Content-Language`, `Expires`): taken from PUT, CopyObject (REPLACE)
//! and CreateMultipartUpload, answered by GET and HEAD, where GET's `response-*` query
//! parameters override them.

use ndpipe_catalog::StandardHeaders;
use s3s::dto::{
    CacheControl, ContentDisposition, ContentEncoding, ContentLanguage, Expires, GetObjectInput,
    Timestamp, TimestampFormat,
};

/// The headers of an upload, as the client sent them. `aws-chunked` is left out of
/// `Content-Encoding`: it only framed the upload's body.
pub(crate) fn given(
    cache_control: Option<CacheControl>,
    content_disposition: Option<ContentDisposition>,
    content_encoding: Option<ContentEncoding>,
    content_language: Option<ContentLanguage>,
    expires: Option<&Expires>,
) -> StandardHeaders {
    StandardHeaders {
        cache_control,
        content_disposition,
        content_encoding: content_encoding.and_then(|e| without_aws_chunked(&e)),
        content_language,
        expires: expires.and_then(http_date),
    }
}

/// `encoding` without its `aws-chunked` coding; `None` when nothing else is left.
fn without_aws_chunked(encoding: &str) -> Option<String> {
    let kept: Vec<&str> = encoding
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!kept.is_empty()).then(|| kept.join(","))
}

/// `t` as an HTTP date (`Thu, 01 Dec 1994 16:00:00 GMT`).
fn http_date(t: &Timestamp) -> Option<String> {
    let mut out = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut out).ok()?;
    String::from_utf8(out).ok()
}

/// What GET and HEAD answer: the kept headers, or the `response-*` overrides of a GET.
pub(crate) struct Answered {
    pub(crate) cache_control: Option<CacheControl>,
    pub(crate) content_disposition: Option<ContentDisposition>,
    pub(crate) content_encoding: Option<ContentEncoding>,
    pub(crate) content_language: Option<ContentLanguage>,
    pub(crate) expires: Option<Expires>,
}

impl Answered {
    /// The kept headers, as HEAD answers them.
    pub(crate) fn kept(headers: StandardHeaders) -> Answered {
        Answered {
            cache_control: headers.cache_control,
            content_disposition: headers.content_disposition,
            content_encoding: headers.content_encoding,
            content_language: headers.content_language,
            expires: headers
                .expires
                .and_then(|e| Timestamp::parse(TimestampFormat::HttpDate, &e).ok()),
        }
    }

    /// The kept headers with the overrides of `input`'s `response-*` parameters.
    pub(crate) fn for_get(headers: StandardHeaders, input: &GetObjectInput) -> Answered {
        let kept = Answered::kept(headers);
        Answered {
            cache_control: input.response_cache_control.clone().or(kept.cache_control),
            content_disposition: input
                .response_content_disposition
                .clone()
                .or(kept.content_disposition),
            content_encoding: input
                .response_content_encoding
                .clone()
                .or(kept.content_encoding),
            content_language: input
                .response_content_language
                .clone()
                .or(kept.content_language),
            expires: input.response_expires.clone().or(kept.expires),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_chunked_is_not_kept_and_dates_round_trip() {
        assert_eq!(without_aws_chunked("aws-chunked"), None);
        assert_eq!(
            without_aws_chunked("aws-chunked, gzip").as_deref(),
            Some("gzip")
        );
        assert_eq!(without_aws_chunked("gzip,br").as_deref(), Some("gzip,br"));
        let date = "Thu, 01 Dec 2044 16:00:00 GMT";
        let t = Timestamp::parse(TimestampFormat::HttpDate, date).unwrap();
        let kept = given(None, None, None, None, Some(&t));
        assert_eq!(kept.expires.as_deref(), Some(date));
        assert_eq!(Answered::kept(kept).expires, Some(t));
    }
}
