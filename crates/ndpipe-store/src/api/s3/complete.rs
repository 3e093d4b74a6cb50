//! `CompleteMultipartUpload`: the parts the client lists are checked against the staged ones
//! (each ETag and checksum must match, numbers ascending, every part but the last at least
//! 5 MiB), joined under the upload limit and stored as a PUT would, with the ETag
//! `md5-of-md5s-N`, each part's size and checksum, and the object's checksum: composite (of
//! the parts' checksums, `-N`) or of the whole bytes, as the upload asked. The staging folder
//! then goes. A retried completion of an upload that made the key's current object answers
//! that object again, as AWS does.

use std::fmt::Write as _;
use std::io;

use bytes::{Bytes, BytesMut};
use ndpipe_catalog::{ObjectAttributes, ObjectChecksum, ObjectPart, ObjectRecord};
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Response, S3Result, s3_error};

use super::body::too_large;
use super::checksums::{self, Algorithm, set_checksum};
use super::conditions::write_condition;
use super::errors::{catalog as catalog_error, internal};
use super::multipart::{part_path, upload};
use super::objects::{NewObject, store};
use super::{S3State, blocking};

/// S3's smallest part, except for the last one.
const MIN_PART_BYTES: usize = 5 << 20;

/// The listed parts, joined.
pub(super) struct Joined {
    pub(super) bytes: Bytes,
    /// `md5-of-md5s-N`.
    pub(super) etag: String,
    /// Each part's number, size and checksum (by the upload's algorithm).
    pub(super) parts: Vec<ObjectPart>,
    /// The object's checksum by the upload's algorithm and type.
    pub(super) checksum: Option<ObjectChecksum>,
}

/// The checksums a listed part carries.
fn listed_checksum(part: &CompletedPart) -> Checksum {
    Checksum {
        checksum_crc32: part.checksum_crc32.clone(),
        checksum_crc32c: part.checksum_crc32c.clone(),
        checksum_crc64nvme: part.checksum_crc64nvme.clone(),
        checksum_sha1: part.checksum_sha1.clone(),
        checksum_sha256: part.checksum_sha256.clone(),
        checksum_type: None,
    }
}

/// `InvalidPart` unless `part`'s ETag is the hex `md5` (quotes and case aside), and its
/// checksum by `algorithm`, if listed, is `digest`.
fn check_listed(
    part: &CompletedPart,
    number: i32,
    md5: &[u8],
    checksum: Option<(Algorithm, &[u8])>,
) -> S3Result<()> {
    let given = part.e_tag.as_ref().map(|e| match e {
        ETag::Strong(v) | ETag::Weak(v) => v.trim_matches('"').to_ascii_lowercase(),
    });
    if given.as_deref() != Some(hex::encode(md5).as_str()) {
        return Err(s3_error!(
            InvalidPart,
            "part {number} does not have the ETag given"
        ));
    }
    if let Some((a, digest)) = checksum
        && let Some(listed) = a.value_in(&listed_checksum(part))
        && listed.trim() != base64_simd::STANDARD.encode_to_string(digest)
    {
        return Err(s3_error!(
            InvalidPart,
            "part {number} does not have the {} checksum given",
            a.name()
        ));
    }
    Ok(())
}

/// The parts the client listed, joined: `InvalidPart` for a part that is missing or whose
/// ETag or checksum differs, `InvalidPartOrder` unless ascending, `EntityTooSmall` for a small
/// part that is not the last, `EntityTooLarge` over `max` bytes. `checksum` is the upload's
/// algorithm and whether its object checksum is composite. `read_part` gives a part's staged
/// bytes by number (`NotFound` when it was not uploaded).
pub(super) fn join(
    listed: &[CompletedPart],
    max: usize,
    checksum: Option<(Algorithm, bool)>,
    read_part: impl Fn(i32) -> io::Result<Vec<u8>>,
) -> S3Result<Joined> {
    if listed.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "the upload lists no parts to complete"
        ));
    }
    let numbers: Vec<i32> = listed.iter().map(|p| p.part_number.unwrap_or(0)).collect();
    if numbers[0] < 1 || numbers.windows(2).any(|w| w[1] <= w[0]) {
        return Err(s3_error!(
            InvalidPartOrder,
            "the parts must be listed in ascending order"
        ));
    }
    let mut joined = BytesMut::new();
    let mut md5s = Vec::with_capacity(listed.len() * 16);
    let mut digests = Vec::with_capacity(listed.len());
    let mut parts = Vec::with_capacity(listed.len());
    for (i, (part, &number)) in listed.iter().zip(&numbers).enumerate() {
        let bytes = match read_part(number) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(s3_error!(InvalidPart, "part {number} was not uploaded"));
            }
            Err(e) => return Err(internal(e)),
        };
        let md5 = Md5::checksum(&bytes);
        let digest = checksum.map(|(a, _)| a.digest(&bytes));
        check_listed(
            part,
            number,
            &md5,
            checksum.map(|(a, _)| a).zip(digest.as_deref()),
        )?;
        if i + 1 < listed.len() && bytes.len() < MIN_PART_BYTES {
            return Err(s3_error!(
                EntityTooSmall,
                "part {number} is {} bytes; every part but the last needs {MIN_PART_BYTES}",
                bytes.len()
            ));
        }
        if joined.len() + bytes.len() > max {
            return Err(too_large((joined.len() + bytes.len()) as u64, max));
        }
        parts.push(ObjectPart {
            number: number.unsigned_abs(),
            bytes: bytes.len() as u64,
            checksum: digest
                .as_ref()
                .map(|d| base64_simd::STANDARD.encode_to_string(d)),
        });
        digests.extend(digest);
        joined.extend_from_slice(&bytes);
        md5s.extend_from_slice(&md5);
    }
    let etag = format!("{}-{}", hex::encode(Md5::checksum(&md5s)), listed.len());
    let checksum = checksum.map(|(a, composite)| ObjectChecksum {
        algorithm: a.name().to_string(),
        value: if composite {
            checksums::composite(a, &digests)
        } else {
            a.base64(&joined)
        },
        composite,
    });
    Ok(Joined {
        bytes: joined.freeze(),
        etag,
        parts,
        checksum,
    })
}

/// The object's checksum given with the completion, checked against the joined bytes:
/// `BadDigest` when it differs. A composite value may come with or without its `-N`. An
/// upload without an algorithm keeps a full-object checksum given here, once verified.
fn check_whole(given: &Checksum, joined: &mut Joined) -> S3Result<()> {
    let Some((a, value)) = checksums::sent(given) else {
        return Ok(());
    };
    let bad = || {
        s3_error!(
            BadDigest,
            "the {} you specified did not match the calculated checksum",
            a.name()
        )
    };
    match &joined.checksum {
        Some(ours) if ours.algorithm == a.name() => {
            let bare = ours.value.split('-').next().unwrap_or_default();
            if value == ours.value || (ours.composite && value == bare) {
                Ok(())
            } else {
                Err(bad())
            }
        }
        Some(_) => Err(s3_error!(
            InvalidRequest,
            "the upload's checksum algorithm is not {}",
            a.name()
        )),
        None if a.base64(&joined.bytes) == value => {
            joined.checksum = Some(ObjectChecksum {
                algorithm: a.name().to_string(),
                value,
                composite: false,
            });
            Ok(())
        }
        None => Err(bad()),
    }
}

/// An object's `Location`: its path, the key percent-encoded.
fn location(bucket: &str, key: &str) -> String {
    let mut out = format!("/{bucket}/");
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The answer for `object`, made by a completed upload.
fn answer(object: &ObjectRecord) -> CompleteMultipartUploadOutput {
    let sum = checksums::answer(object.attributes.checksum.as_ref());
    let mut out = CompleteMultipartUploadOutput {
        bucket: Some(object.bucket.clone()),
        key: Some(object.key.clone()),
        e_tag: Some(ETag::Strong(object.etag.clone())),
        location: Some(location(&object.bucket, &object.key)),
        checksum_type: sum.checksum_type.clone(),
        ..CompleteMultipartUploadOutput::default()
    };
    set_checksum!(out, sum);
    out
}

/// A completion of an upload that is gone: the key's current object again when upload `id`
/// made it, else `missing` (`NoSuchUpload`).
async fn completed_already(
    state: &S3State,
    bucket: &str,
    key: &str,
    id: &str,
    missing: S3Error,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let catalog = state.catalog.clone();
    let (b, k) = (bucket.to_string(), key.to_string());
    let current = blocking(move || catalog.object(&b, &k).map_err(catalog_error)).await?;
    match current {
        Some(o) if o.attributes.upload_id.as_deref() == Some(id) => Ok(S3Response::new(answer(&o))),
        _ => Err(missing),
    }
}

/// `CompleteMultipartUpload`: the listed parts become the object (see [`join`]) if its
/// `If-None-Match: *` or `If-Match` holds; nothing is stored, and the upload stays, when they
/// do not match or it does not hold.
pub(crate) async fn complete(
    state: &S3State,
    input: CompleteMultipartUploadInput,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let condition = write_condition(input.if_match.as_ref(), input.if_none_match.as_ref())?;
    let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
    let (dir, info) = match upload(state, id, bucket, key).await {
        Ok(found) => found,
        Err(e) if e.code() == &S3ErrorCode::NoSuchUpload => {
            return completed_already(state, bucket, key, id, e).await;
        }
        Err(e) => return Err(e),
    };
    let listed = input
        .multipart_upload
        .as_ref()
        .and_then(|m| m.parts.clone())
        .unwrap_or_default();
    let (max, kind, staged) = (state.max_upload_bytes, info.checksum(), dir.clone());
    let mut joined =
        blocking(move || join(&listed, max, kind, |n| std::fs::read(part_path(&staged, n))))
            .await?;
    let given = Checksum {
        checksum_crc32: input.checksum_crc32.clone(),
        checksum_crc32c: input.checksum_crc32c.clone(),
        checksum_crc64nvme: input.checksum_crc64nvme.clone(),
        checksum_sha1: input.checksum_sha1.clone(),
        checksum_sha256: input.checksum_sha256.clone(),
        checksum_type: None,
    };
    check_whole(&given, &mut joined)?;
    if let Some(size) = input.mpu_object_size
        && u64::try_from(size).ok() != Some(joined.bytes.len() as u64)
    {
        return Err(s3_error!(
            InvalidRequest,
            "x-amz-mp-object-size is {size}, the parts make {} bytes",
            joined.bytes.len()
        ));
    }
    let object = NewObject {
        bytes: joined.bytes,
        etag: joined.etag,
        content_type: info.content_type,
        metadata: info.metadata,
        attributes: ObjectAttributes {
            headers: info.headers,
            checksum: joined.checksum,
            parts: joined.parts,
            upload_id: Some(id.clone()),
        },
        tags: info.tags,
    };
    let stored = store(state, bucket, key, object, &condition).await?;
    blocking(move || std::fs::remove_dir_all(&dir).map_err(internal)).await?;
    Ok(S3Response::new(answer(&stored)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_encode_the_key() {
        assert_eq!(location("b", "a dir/ü+1.jpg"), "/b/a%20dir/%C3%BC%2B1.jpg");
    }

    fn part(number: i32, bytes: &[u8], crc32: Option<String>) -> CompletedPart {
        CompletedPart {
            part_number: Some(number),
            e_tag: Some(ETag::Strong(hex::encode(Md5::checksum(bytes)))),
            checksum_crc32: crc32,
            ..CompletedPart::default()
        }
    }

    #[test]
    fn parts_are_recorded_with_their_checksums_and_wrong_ones_refused() {
        let staged = |n: i32| -> io::Result<Vec<u8>> {
            match n {
                1 => Ok(vec![b'A'; MIN_PART_BYTES]),
                2 => Ok(b"tail".to_vec()),
                _ => Err(io::ErrorKind::NotFound.into()),
            }
        };
        let (one, two) = (staged(1).unwrap(), staged(2).unwrap());
        let crc = |b: &[u8]| Some(Algorithm::Crc32.base64(b));
        let listed = [part(1, &one, crc(&one)), part(2, &two, None)];
        let composite = join(&listed, 10 << 20, Some((Algorithm::Crc32, true)), staged).unwrap();
        assert_eq!(
            composite
                .parts
                .iter()
                .map(|p| (p.number, p.bytes))
                .collect::<Vec<_>>(),
            [(1, MIN_PART_BYTES as u64), (2, 4)]
        );
        assert_eq!(composite.parts[1].checksum, crc(&two));
        let digests = [Algorithm::Crc32.digest(&one), Algorithm::Crc32.digest(&two)];
        let value = checksums::composite(Algorithm::Crc32, &digests);
        assert!(value.ends_with("-2"));
        assert_eq!(composite.checksum.as_ref().unwrap().value, value);
        let full = join(&listed, 10 << 20, Some((Algorithm::Crc32, false)), staged).unwrap();
        let whole = [one.as_slice(), two.as_slice()].concat();
        assert_eq!(full.checksum.unwrap().value, crc(&whole).unwrap());
        let none = join(&listed, 10 << 20, None, staged).unwrap();
        assert!(none.checksum.is_none() && none.parts[0].checksum.is_none());
        let wrong = [part(1, &one, crc(b"other")), part(2, &two, None)];
        let refused = join(&wrong, 10 << 20, Some((Algorithm::Crc32, true)), staged);
        assert_eq!(refused.err().unwrap().code(), &S3ErrorCode::InvalidPart);
    }

    #[test]
    fn a_whole_checksum_given_at_completion_must_be_the_objects() {
        let mut joined = Joined {
            bytes: Bytes::from_static(b"abc"),
            etag: "e-1".into(),
            parts: Vec::new(),
            checksum: Some(ObjectChecksum {
                algorithm: "CRC32".into(),
                value: "AAAAAA==-1".into(),
                composite: true,
            }),
        };
        let crc32 = |v: &str| Checksum {
            checksum_crc32: Some(v.into()),
            ..Checksum::default()
        };
        assert!(check_whole(&crc32("AAAAAA==-1"), &mut joined).is_ok());
        assert!(check_whole(&crc32("AAAAAA=="), &mut joined).is_ok());
        let bad = check_whole(&crc32("BBBBBB==-1"), &mut joined).unwrap_err();
        assert_eq!(bad.code(), &S3ErrorCode::BadDigest);
        joined.checksum = None;
        let right = Algorithm::Crc32.base64(b"abc");
        assert!(check_whole(&crc32(&right), &mut joined).is_ok());
        assert_eq!(joined.checksum.unwrap().value, right, "kept once verified");
    }
}
