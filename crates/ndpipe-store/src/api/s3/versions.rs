//! Versions, as AWS answers them for a bucket that never had versioning: every object is its
//! one current version, with the version id `null`. `ListObjectVersions` lists them as
//! `ListObjects` does (prefix, delimiter, `key-marker` paging, no delete markers), so tools that
//! empty a bucket version by version (boto3's `object_versions.delete()`, `aws s3api
//! list-object-versions`) work; a version id other than `null` names no version.

use s3s::dto::*;
use s3s::{S3Response, S3Result, s3_error};

use super::S3State;
use super::buckets::{require, timestamp};
use super::listing::{self, Query, owner, url_encode, wants_url};

/// The id of every object's one version.
pub(crate) const NULL_VERSION: &str = "null";

/// `InvalidArgument` for a version id other than `null` (absent is the current version).
pub(crate) fn only_null(version_id: Option<&str>) -> S3Result<()> {
    match version_id {
        None | Some(NULL_VERSION) => Ok(()),
        Some(_) => Err(s3_error!(InvalidArgument, "Invalid version id specified")),
    }
}

/// Where a page of versions starts: after `key-marker` (its one version, `null`, was listed).
fn after(key_marker: Option<&str>, version_id_marker: Option<&str>) -> S3Result<Option<String>> {
    let key_marker = key_marker.filter(|k| !k.is_empty());
    let version_id_marker = version_id_marker.filter(|v| !v.is_empty());
    if key_marker.is_none() && version_id_marker.is_some() {
        return Err(s3_error!(
            InvalidArgument,
            "A version-id marker cannot be specified without a key marker."
        ));
    }
    only_null(version_id_marker)?;
    Ok(key_marker.map(str::to_string))
}

/// `ListObjectVersions`: the current objects as `null` versions.
pub(crate) async fn list(
    state: &S3State,
    input: ListObjectVersionsInput,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    require(state, &input.bucket).await?;
    let after = after(
        input.key_marker.as_deref(),
        input.version_id_marker.as_deref(),
    )?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let max = listing::max_keys(input.max_keys)?;
    let page = listing::page(
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
    let versions = page
        .objects
        .iter()
        .map(|o| ObjectVersion {
            key: Some(if encode {
                url_encode(&o.key)
            } else {
                o.key.clone()
            }),
            version_id: Some(NULL_VERSION.into()),
            is_latest: Some(true),
            size: i64::try_from(o.bytes).ok(),
            e_tag: Some(ETag::Strong(o.etag.clone())),
            last_modified: Some(timestamp(o.modified_ms)),
            storage_class: Some(ObjectVersionStorageClass::from_static(
                ObjectVersionStorageClass::STANDARD,
            )),
            owner: Some(owner()),
            ..ObjectVersion::default()
        })
        .collect();
    let next_key_marker = page.next_marker();
    Ok(S3Response::new(ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(prefix),
        key_marker: Some(input.key_marker.unwrap_or_default()),
        version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
        max_keys: i32::try_from(max).ok(),
        is_truncated: Some(next_key_marker.is_some()),
        next_version_id_marker: next_key_marker.as_ref().map(|_| NULL_VERSION.into()),
        next_key_marker,
        versions: Some(versions),
        common_prefixes: Some(listing::common_prefixes(&page, encode)),
        delimiter: listing::echoed(input.delimiter),
        encoding_type: input.encoding_type,
        ..ListObjectVersionsOutput::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_null_version_exists() {
        assert_eq!(after(Some("k"), Some("null")).unwrap(), Some("k".into()));
        assert_eq!(after(Some("k"), None).unwrap(), Some("k".into()));
        assert_eq!(after(None, None).unwrap(), None);
        assert_eq!(after(Some(""), Some("")).unwrap(), None);
        assert!(
            after(None, Some("null")).is_err(),
            "a version marker needs a key marker"
        );
        assert!(after(Some("k"), Some("3HL4kqtJlcpXroDTDmJ")).is_err());
        assert!(only_null(Some("null")).is_ok() && only_null(None).is_ok());
        assert!(only_null(Some("v1")).is_err());
    }
}
