//! Request bodies: read whole up to `max_upload_bytes` (refused from its declared length before
//! any byte is read), with the MD5 every upload needs for its ETag (hashed chunk by chunk as
//! the body arrives) and the checksums the client sent verified: `Content-MD5` and
//! `x-amz-checksum-*`, as headers or as trailers of an aws-chunked body.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use hyper::StatusCode;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Md5, Sha1, Sha256};
use s3s::dto::{Checksum, StreamingBlob};
use s3s::{S3Error, TrailingHeaders, s3_error};

use super::errors::custom;

/// A body read whole, with its MD5 and the checksums the client sent for it.
pub(crate) struct ReadBody {
    /// The bytes.
    pub(crate) bytes: Bytes,
    /// The MD5 digest (the ETag of a single-part object).
    pub(crate) md5: [u8; 16],
    /// The `x-amz-checksum-*` values sent as headers or trailers, each verified.
    pub(crate) checksum: Checksum,
}

/// What the client said the body's checksums are (any may be absent).
#[derive(Default)]
pub(crate) struct Expected {
    pub(crate) content_md5: Option<String>,
    pub(crate) checksum: Checksum,
}

/// Refuses an aws-chunked body that is not signed: `s3s` decodes (and checks) the chunks of
/// signed requests only, so an anonymous one would be stored with its chunk framing.
pub(crate) fn refuse_unsigned_chunks(
    headers: &hyper::HeaderMap,
    signed: bool,
) -> Result<(), S3Error> {
    let streaming = headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("STREAMING-"));
    if streaming && !signed {
        return Err(s3_error!(
            InvalidRequest,
            "an aws-chunked body must come with a signed request"
        ));
    }
    Ok(())
}

/// `EntityTooLarge` for a body over `max` bytes.
pub(crate) fn too_large(len: u64, max: usize) -> S3Error {
    let mut e = s3_error!(
        EntityTooLarge,
        "the body is {len} bytes or more, the limit is {max} (--max-upload-bytes)"
    );
    e.set_status_code(StatusCode::PAYLOAD_TOO_LARGE);
    e
}

/// Reads `body` whole: refused before reading when `declared` exceeds `max`, and as soon as
/// more than `max` bytes arrive. Verifies `expected` and the checksums in `trailers`.
pub(crate) async fn read(
    body: Option<StreamingBlob>,
    declared: Option<i64>,
    max: usize,
    expected: Expected,
    trailers: Option<TrailingHeaders>,
) -> Result<ReadBody, S3Error> {
    if let Some(len) = declared.and_then(|l| u64::try_from(l).ok())
        && len > max as u64
    {
        return Err(too_large(len, max));
    }
    let mut buf = BytesMut::with_capacity(
        declared
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(0)
            .min(max),
    );
    let mut hasher = Md5::new();
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "reading the body: {e}"))?;
            if buf.len() + chunk.len() > max {
                return Err(too_large((buf.len() + chunk.len()) as u64, max));
            }
            hasher.update(&chunk);
            buf.extend_from_slice(&chunk);
        }
    }
    let bytes = buf.freeze();
    let md5 = hasher.finalize();
    verify_md5(expected.content_md5.as_deref(), &md5)?;
    let mut wanted = expected.checksum;
    if let Some(trailers) = trailers.and_then(|t| t.take()) {
        let get = |name: &str| {
            trailers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        wanted.checksum_crc32 = wanted.checksum_crc32.or(get("x-amz-checksum-crc32"));
        wanted.checksum_crc32c = wanted.checksum_crc32c.or(get("x-amz-checksum-crc32c"));
        wanted.checksum_sha1 = wanted.checksum_sha1.or(get("x-amz-checksum-sha1"));
        wanted.checksum_sha256 = wanted.checksum_sha256.or(get("x-amz-checksum-sha256"));
        wanted.checksum_crc64nvme = wanted
            .checksum_crc64nvme
            .or(get("x-amz-checksum-crc64nvme"));
    }
    verify_checksums(&wanted, &bytes)?;
    Ok(ReadBody {
        bytes,
        md5,
        checksum: wanted,
    })
}

/// `BadDigest` unless `content_md5` (base64) is absent or the MD5 of the body.
fn verify_md5(content_md5: Option<&str>, md5: &[u8; 16]) -> Result<(), S3Error> {
    let Some(given) = content_md5 else {
        return Ok(());
    };
    let ours = base64_simd::STANDARD.encode_to_string(md5);
    if ndpipe_util::http::constant_time_eq(given.trim().as_bytes(), ours.as_bytes()) {
        Ok(())
    } else {
        Err(s3_error!(
            BadDigest,
            "the Content-MD5 you specified did not match what we received"
        ))
    }
}

/// `BadDigest` unless every checksum in `wanted` is the one of `bytes`.
fn verify_checksums(wanted: &Checksum, bytes: &[u8]) -> Result<(), S3Error> {
    let mut hasher = ChecksumHasher {
        crc32: wanted.checksum_crc32.as_ref().map(|_| Crc32::new()),
        crc32c: wanted.checksum_crc32c.as_ref().map(|_| Crc32c::new()),
        sha1: wanted.checksum_sha1.as_ref().map(|_| Sha1::new()),
        sha256: wanted.checksum_sha256.as_ref().map(|_| Sha256::new()),
        crc64nvme: wanted.checksum_crc64nvme.as_ref().map(|_| Crc64Nvme::new()),
    };
    hasher.update(bytes);
    let got = hasher.finalize();
    let pairs = [
        ("CRC32", &wanted.checksum_crc32, &got.checksum_crc32),
        ("CRC32C", &wanted.checksum_crc32c, &got.checksum_crc32c),
        ("SHA1", &wanted.checksum_sha1, &got.checksum_sha1),
        ("SHA256", &wanted.checksum_sha256, &got.checksum_sha256),
        (
            "CRC64NVME",
            &wanted.checksum_crc64nvme,
            &got.checksum_crc64nvme,
        ),
    ];
    for (name, want, got) in pairs {
        if let (Some(want), Some(got)) = (want, got)
            && want.trim() != got
        {
            return Err(custom(
                "BadDigest",
                StatusCode::BAD_REQUEST,
                format!("the {name} you specified did not match the calculated checksum"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(bytes: &'static [u8]) -> Option<StreamingBlob> {
        Some(StreamingBlob::from(s3s::Body::from(Bytes::from_static(
            bytes,
        ))))
    }

    #[tokio::test]
    async fn bodies_are_read_with_their_digests_and_checked() {
        let read_ok = read(blob(b"hello"), Some(5), 10, Expected::default(), None)
            .await
            .unwrap();
        assert_eq!(hex::encode(read_ok.md5), "5d41402abc4b2a76b9719d911017c592");
        assert_eq!(&read_ok.bytes[..], b"hello");
        let declared = read(blob(b"hello"), Some(11), 10, Expected::default(), None).await;
        assert_eq!(
            declared.err().unwrap().code(),
            &s3s::S3ErrorCode::EntityTooLarge
        );
        let streamed = read(blob(b"hello world"), None, 10, Expected::default(), None).await;
        assert_eq!(
            streamed.err().unwrap().code(),
            &s3s::S3ErrorCode::EntityTooLarge
        );
        let wrong_md5 = Expected {
            content_md5: Some(base64_simd::STANDARD.encode_to_string([0u8; 16])),
            ..Expected::default()
        };
        let refused = read(blob(b"hello"), Some(5), 10, wrong_md5, None).await;
        assert_eq!(refused.err().unwrap().code(), &s3s::S3ErrorCode::BadDigest);
        let crc = |value: &str| Expected {
            checksum: Checksum {
                checksum_crc32: Some(value.into()),
                ..Checksum::default()
            },
            ..Expected::default()
        };
        let right = base64_simd::STANDARD.encode_to_string(Crc32::checksum(b"hello"));
        assert!(
            read(blob(b"hello"), Some(5), 10, crc(&right), None)
                .await
                .is_ok()
        );
        let wrong = read(blob(b"hello"), Some(5), 10, crc("AAAAAA=="), None).await;
        assert_eq!(wrong.err().unwrap().code().as_str(), "BadDigest");
    }
}
