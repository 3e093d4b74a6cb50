//! `GetObjectAttributes`: the attributes asked for of an object, without its bytes: ETag,
//! checksum, the parts of a multipart object (numbers, sizes, checksums; paged by
//! `max-parts` and `part-number-marker`), storage class (always STANDARD) and size.

use ndpipe_catalog::ObjectRecord;
use s3s::dto::*;
use s3s::{S3Response, S3Result};

use super::buckets::timestamp;
use super::checksums::{self, set_checksum};
use super::objects::lookup;
use super::{S3State, versions};

/// The most parts one answer lists, as `ListParts`.
const MAX_PARTS: i32 = 1000;

/// The parts of a multipart `object` after part number `marker`, at most `max`; `None` for
/// an object of one PUT, as AWS answers.
fn object_parts(object: &ObjectRecord, marker: i32, max: i32) -> Option<GetObjectAttributesParts> {
    let parts = &object.attributes.parts;
    if parts.is_empty() {
        return None;
    }
    let algorithm = object
        .attributes
        .checksum
        .as_ref()
        .and_then(checksums::algorithm_of);
    let max = max.clamp(0, MAX_PARTS);
    let after: Vec<_> = parts
        .iter()
        .filter(|p| i64::from(p.number) > i64::from(marker))
        .collect();
    let page = usize::try_from(max).unwrap_or(0);
    let listed: Vec<ObjectPart> = after
        .iter()
        .take(page)
        .map(|p| {
            let mut out = ObjectPart {
                part_number: i32::try_from(p.number).ok(),
                size: i64::try_from(p.bytes).ok(),
                ..ObjectPart::default()
            };
            if let (Some(a), Some(value)) = (algorithm, p.checksum.clone()) {
                set_checksum!(out, a.dto(value));
            }
            out
        })
        .collect();
    let truncated = after.len() > listed.len();
    Some(GetObjectAttributesParts {
        is_truncated: Some(truncated),
        max_parts: Some(max),
        next_part_number_marker: listed.last().and_then(|p| p.part_number),
        part_number_marker: Some(marker),
        total_parts_count: i32::try_from(parts.len()).ok(),
        parts: Some(listed),
    })
}

/// `GetObjectAttributes`: each attribute asked for (unknown names are left out).
pub(crate) async fn get(
    state: &S3State,
    input: GetObjectAttributesInput,
) -> S3Result<S3Response<GetObjectAttributesOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    let object = lookup(state, &input.bucket, &input.key).await?;
    // One header value may list several, comma-separated (as boto3 sends them).
    let asked = |name: &str| {
        input
            .object_attributes
            .iter()
            .flat_map(|a| a.as_str().split(','))
            .any(|a| a.trim() == name)
    };
    let mut out = GetObjectAttributesOutput {
        last_modified: Some(timestamp(object.modified_ms)),
        ..GetObjectAttributesOutput::default()
    };
    if asked(ObjectAttributes::ETAG) {
        out.e_tag = Some(ETag::Strong(object.etag.clone()));
    }
    if asked(ObjectAttributes::CHECKSUM) && object.attributes.checksum.is_some() {
        out.checksum = Some(checksums::answer(object.attributes.checksum.as_ref()));
    }
    if asked(ObjectAttributes::OBJECT_PARTS) {
        let marker = input.part_number_marker.unwrap_or(0);
        out.object_parts = object_parts(&object, marker, input.max_parts.unwrap_or(MAX_PARTS));
    }
    if asked(ObjectAttributes::STORAGE_CLASS) {
        out.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
    }
    if asked(ObjectAttributes::OBJECT_SIZE) {
        out.object_size = i64::try_from(object.bytes).ok();
    }
    Ok(S3Response::new(out))
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::{ObjectChecksum, ObjectPart as Stored};

    use super::*;

    #[test]
    fn parts_are_paged_with_their_checksums_and_one_put_has_none() {
        let mut o = ndpipe_catalog::test_suite::object("b", "k", None);
        assert!(object_parts(&o, 0, 1000).is_none());
        o.attributes.checksum = Some(ObjectChecksum {
            algorithm: "CRC32".into(),
            value: "x-3".into(),
            composite: true,
        });
        o.attributes.parts = [1, 2, 5]
            .into_iter()
            .map(|n| Stored {
                number: n,
                bytes: u64::from(n) * 10,
                checksum: Some(format!("c{n}")),
            })
            .collect();
        let first = object_parts(&o, 0, 2).unwrap();
        assert_eq!(first.total_parts_count, Some(3));
        assert_eq!(first.is_truncated, Some(true));
        assert_eq!(first.next_part_number_marker, Some(2));
        let listed = first.parts.unwrap();
        assert_eq!(listed[1].size, Some(20));
        assert_eq!(listed[1].checksum_crc32.as_deref(), Some("c2"));
        let rest = object_parts(&o, 2, 2).unwrap();
        assert_eq!(rest.is_truncated, Some(false));
        assert_eq!(rest.parts.unwrap()[0].part_number, Some(5));
    }
}
