//! `UploadPartCopy`: a part of a multipart upload copied from an object, whole or the byte
//! range `x-amz-copy-source-range: bytes=first-last` (as `aws s3 cp` copies large objects),
//! staged like an uploaded part.

use std::ops::Range;

use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::{S3Response, S3Result, s3_error};

use super::body::too_large;
use super::buckets::timestamp;
use super::checksums::set_checksum;
use super::multipart::{check_part_number, part_checksum, upload, write_part};
use super::objects::{lookup, read_bytes};
use super::{S3State, versions};

/// The bytes `x-amz-copy-source-range` names in an object of `total` bytes (all of them
/// without one): `InvalidArgument` unless it is `bytes=first-last` with first ≤ last,
/// `InvalidRange` when it ends past the object.
fn copy_range(header: Option<&str>, total: u64) -> S3Result<Range<u64>> {
    let Some(header) = header else {
        return Ok(0..total);
    };
    let malformed = || {
        s3_error!(
            InvalidArgument,
            "x-amz-copy-source-range must be bytes=first-last, not {header:?}"
        )
    };
    let (first, last) = header
        .trim()
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(malformed)?;
    let digits = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (Some(first), Some(last)) = (digits(first), digits(last)) else {
        return Err(malformed());
    };
    if first > last {
        return Err(malformed());
    }
    if last >= total {
        return Err(s3_error!(
            InvalidRange,
            "bytes {first}-{last} are outside the {total} bytes of the source"
        ));
    }
    Ok(first..last + 1)
}

/// `UploadPartCopy`: the source object's bytes (or range of them) become part
/// `partNumber`; its ETag is their MD5, its checksum the upload's algorithm's.
pub(crate) async fn upload_part_copy(
    state: &S3State,
    input: UploadPartCopyInput,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    check_part_number(input.part_number)?;
    let (dir, info) = upload(state, &input.upload_id, &input.bucket, &input.key).await?;
    let CopySource::Bucket {
        bucket: src_bucket,
        key: src_key,
        version_id: src_version,
    } = &input.copy_source
    else {
        return Err(s3_error!(
            NotImplemented,
            "only bucket copy sources are supported"
        ));
    };
    versions::only_null(src_version.as_deref())?;
    let source = lookup(state, src_bucket, src_key).await?;
    let range = copy_range(input.copy_source_range.as_deref(), source.bytes)?;
    if range.end - range.start > state.max_upload_bytes as u64 {
        return Err(too_large(range.end - range.start, state.max_upload_bytes));
    }
    let bytes = read_bytes(state, &source).await?;
    let usize_range = usize::try_from(range.start).unwrap_or(usize::MAX)
        ..usize::try_from(range.end).unwrap_or(usize::MAX);
    let Some(part) = bytes
        .get(usize_range.clone())
        .map(|_| bytes.slice(usize_range))
    else {
        return Err(s3_error!(InvalidRange, "the range is outside the source"));
    };
    let etag = hex::encode(Md5::checksum(&part));
    let sum = part_checksum(&Checksum::default(), &info, &part);
    write_part(&dir, input.part_number, part).await?;
    let mut result = CopyPartResult {
        e_tag: Some(ETag::Strong(etag)),
        last_modified: Some(timestamp(ndpipe_util::time::now_ms())),
        ..CopyPartResult::default()
    };
    set_checksum!(result, sum);
    Ok(S3Response::new(UploadPartCopyOutput {
        copy_part_result: Some(result),
        ..UploadPartCopyOutput::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: S3Result<Range<u64>>) -> String {
        r.unwrap_err().code().as_str().to_string()
    }

    #[test]
    fn copy_ranges_are_first_last_within_the_source() {
        assert_eq!(copy_range(None, 10).unwrap(), 0..10);
        assert_eq!(copy_range(Some("bytes=2-5"), 10).unwrap(), 2..6);
        assert_eq!(copy_range(Some("bytes=9-9"), 10).unwrap(), 9..10);
        assert_eq!(code(copy_range(Some("bytes=0-21"), 5)), "InvalidRange");
        for bad in [
            "0-2",
            "bytes=0",
            "bytes=hello-world",
            "bytes=0-bar",
            "bytes=hello-",
            "bytes=0-2,3-5",
            "bytes=-3",
            "bytes=5-2",
        ] {
            assert_eq!(code(copy_range(Some(bad), 10)), "InvalidArgument", "{bad}");
        }
    }
}
