//! `GetObject` and `HeadObject`: the whole object, a byte range or one part (`partNumber`),
//! with the headers kept at upload (GET's `response-*` overrides applied), the checksum when
//! the client asks for it (`x-amz-checksum-mode: ENABLED`), the parts count of a part and the
//! tag count; 304 or 412 as their conditions (`If-Match`, ...) say.

use std::ops::Range;

use ndpipe_catalog::ObjectRecord;
use s3s::dto::*;
use s3s::{S3Response, S3Result, s3_error};

use super::buckets::timestamp;
use super::checksums::{self, set_checksum};
use super::conditions::ReadConditions;
use super::headers::Answered;
use super::labels::Labels;
use super::objects::{lookup, read_bytes};
use super::{MAX_PART_NUMBER, S3State, versions};

/// What of an object a GET or HEAD answers.
#[derive(Debug, PartialEq, Eq)]
enum Selection {
    Whole,
    /// A byte range.
    Range(Range<u64>),
    /// Part `number` (from 1) of `count`, at `range`.
    Part {
        number: usize,
        count: usize,
        range: Range<u64>,
    },
}

impl Selection {
    /// The bytes answered, within an object of `total` bytes.
    fn range(&self, total: u64) -> Range<u64> {
        match self {
            Selection::Whole => 0..total,
            Selection::Range(r) | Selection::Part { range: r, .. } => r.clone(),
        }
    }

    /// The `Content-Range` of a range or a part (`None` for the whole or an empty part).
    fn content_range(&self, total: u64) -> Option<String> {
        let r = self.range(total);
        (!matches!(self, Selection::Whole) && !r.is_empty())
            .then(|| format!("bytes {}-{}/{total}", r.start, r.end - 1))
    }

    fn parts_count(&self) -> Option<i32> {
        match self {
            Selection::Part { count, .. } => i32::try_from(*count).ok(),
            _ => None,
        }
    }
}

/// The byte ranges of `object`'s parts, in order: one part for an object of one PUT.
fn part_ranges(object: &ObjectRecord) -> Vec<Range<u64>> {
    if object.attributes.parts.is_empty() {
        return std::iter::once(0..object.bytes).collect();
    }
    let mut start = 0;
    object
        .attributes
        .parts
        .iter()
        .map(|p| {
            let r = start..start + p.bytes;
            start = r.end;
            r
        })
        .collect()
}

/// What `range` and `part_number` ask of `object`: `InvalidRequest` for both, `InvalidArgument`
/// for a part number outside 1 to 10,000, `InvalidPart` for a part the object does not have
/// (a part number counts the object's parts in order), `InvalidRange` for a range outside it.
fn select(
    object: &ObjectRecord,
    range: Option<&s3s::dto::Range>,
    part_number: Option<i32>,
) -> S3Result<Selection> {
    match (range, part_number) {
        (None, None) => Ok(Selection::Whole),
        (Some(_), Some(_)) => Err(s3_error!(
            InvalidRequest,
            "cannot specify both Range header and partNumber query parameter"
        )),
        (Some(range), None) => range
            .check(object.bytes)
            .map(Selection::Range)
            .map_err(|_| s3_error!(InvalidRange, "the range is outside the object")),
        (None, Some(n)) => {
            if !(1..=MAX_PART_NUMBER).contains(&n) {
                return Err(s3_error!(
                    InvalidArgument,
                    "part numbers are 1 to {MAX_PART_NUMBER}"
                ));
            }
            let ranges = part_ranges(object);
            let number = usize::try_from(n).unwrap_or(usize::MAX);
            let range = ranges.get(number - 1).cloned().ok_or_else(|| {
                s3_error!(
                    InvalidPart,
                    "the object has {} part(s), not {number}",
                    ranges.len()
                )
            })?;
            Ok(Selection::Part {
                number,
                count: ranges.len(),
                range,
            })
        }
    }
}

/// The checksum answered for `selection` of `object` when `mode` enables it: the object's
/// for the whole (or the only part), a part's for a part; none for a byte range, whose
/// bytes no stored checksum covers.
fn checksum(object: &ObjectRecord, selection: &Selection, mode: Option<&ChecksumMode>) -> Checksum {
    let enabled = mode.is_some_and(|m| m.as_str() == ChecksumMode::ENABLED);
    let Some(stored) = object.attributes.checksum.as_ref().filter(|_| enabled) else {
        return Checksum::default();
    };
    match selection {
        Selection::Whole => checksums::answer(Some(stored)),
        Selection::Range(_) => Checksum::default(),
        Selection::Part { number, .. } if object.attributes.parts.is_empty() => {
            debug_assert_eq!(*number, 1);
            checksums::answer(Some(stored))
        }
        Selection::Part { number, .. } => {
            let part = object.attributes.parts[number - 1].checksum.clone();
            match (checksums::algorithm_of(stored), part) {
                (Some(a), Some(value)) => Checksum {
                    checksum_type: Some(checksums::kind(stored)),
                    ..a.dto(value)
                },
                _ => Checksum::default(),
            }
        }
    }
}

/// The user metadata answered: what was stored, with every task's labels of a photo.
fn metadata(object: &ObjectRecord, labels: &Labels) -> Metadata {
    let mut out: Metadata = object.metadata.clone().into_iter().collect();
    out.extend(labels.metadata());
    out
}

/// How many tags `GetObjectTagging` answers: the user's and the labels'; `None` for none.
fn tag_count(object: &ObjectRecord, labels: &Labels) -> Option<i32> {
    let n = object.tags.len() + labels.tags().len();
    (n > 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
}

/// `GetObject`: the whole object, a byte range or a part.
pub(crate) async fn get(
    state: &S3State,
    input: GetObjectInput,
) -> S3Result<S3Response<GetObjectOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    let object = lookup(state, &input.bucket, &input.key).await?;
    ReadConditions {
        if_match: input.if_match.clone(),
        if_none_match: input.if_none_match.clone(),
        if_modified_since: input.if_modified_since.clone(),
        if_unmodified_since: input.if_unmodified_since.clone(),
    }
    .check_read(&object)?;
    let selection = select(&object, input.range.as_ref(), input.part_number)?;
    let bytes = read_bytes(state, &object).await?;
    let total = bytes.len() as u64;
    // Within what was read, should the bytes ever differ in length from the row.
    let r = selection.range(total);
    let (start, end) = (r.start.min(total), r.end.min(total));
    let body = bytes.slice(
        usize::try_from(start).unwrap_or(usize::MAX)..usize::try_from(end).unwrap_or(usize::MAX),
    );
    let labels = Labels::of(state, &object).await?;
    let headers = Answered::for_get(object.attributes.headers.clone(), &input);
    let mut out = GetObjectOutput {
        content_length: Some(body.len() as i64),
        body: Some(StreamingBlob::from(s3s::Body::from(body))),
        content_range: selection.content_range(total),
        parts_count: selection.parts_count(),
        checksum_type: None,
        content_type: Some(
            input
                .response_content_type
                .clone()
                .unwrap_or_else(|| object.content_type.clone()),
        ),
        cache_control: headers.cache_control,
        content_disposition: headers.content_disposition,
        content_encoding: headers.content_encoding,
        content_language: headers.content_language,
        expires: headers.expires,
        e_tag: Some(ETag::Strong(object.etag.clone())),
        last_modified: Some(timestamp(object.modified_ms)),
        accept_ranges: Some("bytes".into()),
        metadata: Some(metadata(&object, &labels)),
        tag_count: tag_count(&object, &labels),
        ..GetObjectOutput::default()
    };
    let sum = checksum(&object, &selection, input.checksum_mode.as_ref());
    out.checksum_type = sum.checksum_type.clone();
    set_checksum!(out, sum);
    Ok(S3Response::new(out))
}

/// `HeadObject`: what GET would answer, without the body (with status 200 even for a part or
/// a range: `s3s` writes HEAD's status itself); 404 for a key that names no object (a
/// "directory" prefix included).
pub(crate) async fn head(
    state: &S3State,
    input: HeadObjectInput,
) -> S3Result<S3Response<HeadObjectOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    let object = lookup(state, &input.bucket, &input.key).await?;
    ReadConditions {
        if_match: input.if_match,
        if_none_match: input.if_none_match,
        if_modified_since: input.if_modified_since,
        if_unmodified_since: input.if_unmodified_since,
    }
    .check_read(&object)?;
    let selection = select(&object, input.range.as_ref(), input.part_number)?;
    let labels = Labels::of(state, &object).await?;
    let headers = Answered::kept(object.attributes.headers.clone());
    let r = selection.range(object.bytes);
    let mut out = HeadObjectOutput {
        content_length: i64::try_from(r.end - r.start).ok(),
        content_range: selection.content_range(object.bytes),
        parts_count: selection.parts_count(),
        content_type: Some(object.content_type.clone()),
        cache_control: headers.cache_control,
        content_disposition: headers.content_disposition,
        content_encoding: headers.content_encoding,
        content_language: headers.content_language,
        expires: headers.expires,
        e_tag: Some(ETag::Strong(object.etag.clone())),
        last_modified: Some(timestamp(object.modified_ms)),
        accept_ranges: Some("bytes".into()),
        metadata: Some(metadata(&object, &labels)),
        ..HeadObjectOutput::default()
    };
    let sum = checksum(&object, &selection, input.checksum_mode.as_ref());
    out.checksum_type = sum.checksum_type.clone();
    set_checksum!(out, sum);
    let mut response = S3Response::new(out);
    if let Some(n) = tag_count(&object, &labels) {
        response
            .headers
            .insert(s3s::header::X_AMZ_TAGGING_COUNT, n.into());
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::ObjectPart;

    use super::*;

    fn object(parts: &[u64]) -> ObjectRecord {
        let mut o = ndpipe_catalog::test_suite::object("b", "k", None);
        o.bytes = parts.iter().sum::<u64>().max(10);
        o.attributes.parts = parts
            .iter()
            .enumerate()
            .map(|(i, &bytes)| ObjectPart {
                number: u32::try_from(i).unwrap() * 2 + 1,
                bytes,
                checksum: None,
            })
            .collect();
        o
    }

    fn code(r: S3Result<Selection>) -> String {
        r.unwrap_err().code().as_str().to_string()
    }

    #[test]
    fn part_numbers_count_the_parts_in_order_and_one_put_is_one_part() {
        let three = object(&[5, 5, 2]);
        assert_eq!(
            select(&three, None, Some(2)).unwrap(),
            Selection::Part {
                number: 2,
                count: 3,
                range: 5..10
            }
        );
        assert_eq!(
            select(&three, None, Some(3))
                .unwrap()
                .content_range(12)
                .as_deref(),
            Some("bytes 10-11/12")
        );
        assert_eq!(code(select(&three, None, Some(4))), "InvalidPart");
        let single = object(&[]);
        assert_eq!(
            select(&single, None, Some(1)).unwrap(),
            Selection::Part {
                number: 1,
                count: 1,
                range: 0..10
            }
        );
        assert_eq!(code(select(&single, None, Some(2))), "InvalidPart");
        assert_eq!(code(select(&single, None, Some(0))), "InvalidArgument");
        assert_eq!(code(select(&single, None, Some(10_001))), "InvalidArgument");
        let range = s3s::dto::Range::parse("bytes=0-1").unwrap();
        assert_eq!(
            code(select(&single, Some(&range), Some(1))),
            "InvalidRequest"
        );
        assert_eq!(
            select(&single, Some(&range), None).unwrap(),
            Selection::Range(0..2)
        );
        assert_eq!(select(&single, None, None).unwrap().content_range(10), None);
    }
}
