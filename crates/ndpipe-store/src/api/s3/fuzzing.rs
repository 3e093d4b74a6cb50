//! The harness of the `s3` fuzz target over the pieces of the S3 request path that read
//! untrusted input without a server: the `Host` header (virtual-host buckets), listing
//! parameters (prefix roll-up, `max-keys`, continuation tokens, `encoding-type=url`), the ground
//! truth of `x-amz-meta-ndpipe-label`/`-split` and the label check, the photo-or-blob decision,
//! the labels header, the `x-amz-tagging` header, request bodies with their `Content-MD5` and
//! `x-amz-checksum-*`, upload ids and the part list of `CompleteMultipartUpload`, and the role an
//! operation needs.

use std::collections::BTreeMap;

use bytes::Bytes;
use s3s::S3ErrorCode;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::{Checksum, CompletedPart, ETag, StreamingBlob};
use s3s::host::S3Host;

use super::body::{self, Expected};
use super::checksums::Algorithm;
use super::host::BucketDomain;
use super::{auth, complete, labels, listing, multipart, objects, tagging};

/// The staged parts the multipart check sees: part `n` (1 to 4) holds `n` bytes of `n`.
fn staged(number: i32) -> std::io::Result<Vec<u8>> {
    match u8::try_from(number) {
        Ok(n @ 1..=4) => Ok(vec![n; usize::from(n)]),
        _ => Err(std::io::ErrorKind::NotFound.into()),
    }
}

/// The `s3` target: the input is split at NUL bytes into the fields each piece takes.
pub(crate) fn s3(data: &[u8]) {
    let mut fields = data.split(|&b| b == 0);
    let mut next = || String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let (domain, host) = (next(), next());
    let (key, prefix, delimiter) = (next(), next(), next());
    let (token, text, label, split) = (next(), next(), next(), next());
    let (content_type, md5_header, checksum, parts) = (next(), next(), next(), next());

    let domain_rule = BucketDomain::new(&domain);
    if let Ok(vh) = domain_rule.parse_host_header(&host)
        && let Some(bucket) = vh.bucket()
    {
        assert!(
            !bucket.is_empty()
                && host
                    .to_ascii_lowercase()
                    .contains(&bucket.to_ascii_lowercase())
        );
    }

    if let Some(rolled) = listing::rolled_up(&key, &prefix, Some(&delimiter)) {
        assert!(rolled.starts_with(&prefix) && rolled.ends_with(&delimiter));
        assert!(key.starts_with(&rolled));
    }
    if let Ok(cursor) = listing::decode_token(&token) {
        assert_eq!(hex::encode(cursor.as_bytes()), token.to_ascii_lowercase());
    }
    let encoded = listing::url_encode(&text);
    assert!(encoded.is_ascii());
    let asked = i32::from_le_bytes(std::array::from_fn(|i| data.get(i).copied().unwrap_or(0)));
    if let Ok(n) = listing::max_keys(Some(asked)) {
        assert!(n <= 1000);
    }

    let mut metadata = BTreeMap::new();
    if !label.is_empty() {
        metadata.insert(objects::LABEL_META.to_string(), label.clone());
    }
    if !split.is_empty() {
        metadata.insert(objects::SPLIT_META.to_string(), split);
    }
    if let Ok(Some(truth)) = objects::ground_truth(&mut metadata) {
        let _ = crate::ingest::validate_label(&truth.label);
    }
    let _ = objects::is_photo(Some(&content_type), text.as_bytes());
    assert!(
        labels::header_safe(&text)
            .bytes()
            .all(|b| b == b' ' || b.is_ascii_graphic())
    );
    if let Ok(tags) = tagging::from_header(Some(&text)) {
        assert!(
            tags.len() <= 10
                && tags
                    .keys()
                    .all(|k| !k.starts_with(labels::LABEL_TAG_PREFIX))
        );
    }
    let _ = auth::required(&text);
    let _ = multipart::valid_upload_id(&token);

    let body_bytes = Bytes::from(text.clone().into_bytes());
    let expected = Expected {
        content_md5: (!md5_header.is_empty()).then_some(md5_header),
        checksum: Checksum {
            checksum_crc32: (!checksum.is_empty()).then(|| checksum.clone()),
            checksum_sha256: (checksum.len() > 8).then(|| checksum.clone()),
            ..Checksum::default()
        },
    };
    let declared = (asked % 2 == 0).then_some(i64::from(asked));
    let blob = StreamingBlob::from(s3s::Body::from(body_bytes.clone()));
    let read = futures::executor::block_on(body::read(Some(blob), declared, 64, expected, None));
    if let Ok(read) = read {
        assert_eq!(read.bytes, body_bytes);
        assert_eq!(read.md5, Md5::checksum(&body_bytes));
    }

    let listed: Vec<CompletedPart> = parts
        .as_bytes()
        .chunks(2)
        .map(|c| {
            let number = i32::from(c[0] as i8);
            let right = staged(number)
                .map(|b| hex::encode(Md5::checksum(&b)))
                .unwrap_or_default();
            let tag = if c.get(1).is_some_and(|b| b % 3 == 0) {
                "wrong".to_string()
            } else {
                right
            };
            CompletedPart {
                part_number: Some(number),
                e_tag: Some(if c.get(1).is_some_and(|b| b % 2 == 0) {
                    ETag::Weak(tag)
                } else {
                    ETag::Strong(tag)
                }),
                ..CompletedPart::default()
            }
        })
        .collect();
    let kind = (asked % 3 == 0).then_some((Algorithm::Crc32, asked % 2 == 0));
    match complete::join(&listed, 8, kind, staged) {
        Ok(joined) => {
            assert!(joined.bytes.len() <= 8);
            assert!(joined.etag.ends_with(&format!("-{}", listed.len())));
            assert_eq!(joined.parts.len(), listed.len());
        }
        Err(e) => assert_ne!(e.code(), &S3ErrorCode::InternalError),
    }
}
