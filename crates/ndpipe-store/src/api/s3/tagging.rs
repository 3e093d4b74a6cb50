//! The user's object tags, kept apart from the model's labels: `PutObjectTagging`,
//! `DeleteObjectTagging`, `x-amz-tagging` on PUT, CreateMultipartUpload and CopyObject
//! (`x-amz-tagging-directive`), and `GetObjectTagging`, which answers the user's tags under
//! their keys and the labels under the reserved `ndpipe-` keys (see `labels`). AWS's limits
//! hold: ten tags, keys of 1 to 128 characters, values of at most 256, keys unique; and a
//! user key cannot start with the labels' prefix. Any other set is 400 `InvalidTag`, and
//! changes nothing.

use std::collections::BTreeMap;

use s3s::dto::*;
use s3s::{S3Error, S3Response, S3Result, s3_error};

use super::errors::{catalog as catalog_error, no_such_key};
use super::labels::{LABEL_TAG_PREFIX, Labels};
use super::objects::lookup;
use super::{S3State, blocking, versions};

/// The most tags an object has.
const MAX_TAGS: usize = 10;
/// The longest tag key, in characters.
const MAX_KEY_CHARS: usize = 128;
/// The longest tag value, in characters.
const MAX_VALUE_CHARS: usize = 256;

fn invalid(why: impl std::fmt::Display) -> S3Error {
    s3_error!(InvalidTag, "{why}")
}

/// `pairs` as an object's tags, checked against S3's limits and the reserved prefix.
pub(crate) fn checked(
    pairs: impl IntoIterator<Item = (String, String)>,
) -> S3Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    for (key, value) in pairs {
        let chars = key.chars().count();
        if !(1..=MAX_KEY_CHARS).contains(&chars) {
            return Err(invalid(format!(
                "a tag key has 1 to {MAX_KEY_CHARS} characters, not {chars}"
            )));
        }
        if value.chars().count() > MAX_VALUE_CHARS {
            return Err(invalid(format!(
                "the value of tag {key:?} is longer than {MAX_VALUE_CHARS} characters"
            )));
        }
        if key.starts_with(LABEL_TAG_PREFIX) {
            return Err(invalid(format!(
                "tag keys starting with {LABEL_TAG_PREFIX:?} are the model's labels"
            )));
        }
        if tags.insert(key.clone(), value).is_some() {
            return Err(invalid(format!("tag key {key:?} is given twice")));
        }
        if tags.len() > MAX_TAGS {
            return Err(invalid(format!("an object has at most {MAX_TAGS} tags")));
        }
    }
    Ok(tags)
}

/// The tags of an `x-amz-tagging` header (`key=value&...`, URL-encoded); none without one.
pub(crate) fn from_header(header: Option<&str>) -> S3Result<BTreeMap<String, String>> {
    let Some(header) = header else {
        return Ok(BTreeMap::new());
    };
    checked(
        form_urlencoded::parse(header.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())),
    )
}

/// The tags of a copy: the source's (`COPY`, the default) or those of the request's
/// `x-amz-tagging` (`REPLACE`).
pub(crate) fn for_copy(
    directive: Option<&TaggingDirective>,
    header: Option<&str>,
    source: &BTreeMap<String, String>,
) -> S3Result<BTreeMap<String, String>> {
    match directive.map(TaggingDirective::as_str) {
        None | Some(TaggingDirective::COPY) => Ok(source.clone()),
        Some(TaggingDirective::REPLACE) => from_header(header),
        Some(other) => Err(s3_error!(
            InvalidArgument,
            "x-amz-tagging-directive is COPY or REPLACE, not {other:?}"
        )),
    }
}

/// Replaces the user tags of (`bucket`, `key`): `NoSuchKey` when it names no object.
async fn set(
    state: &S3State,
    bucket: &str,
    key: &str,
    tags: BTreeMap<String, String>,
) -> S3Result<()> {
    lookup(state, bucket, key).await?;
    let catalog = state.catalog.clone();
    let (b, k) = (bucket.to_string(), key.to_string());
    let found = blocking(move || {
        catalog
            .set_object_tags(&b, &k, &tags)
            .map_err(catalog_error)
    })
    .await?;
    if found { Ok(()) } else { Err(no_such_key(key)) }
}

/// `PutObjectTagging`: the object's user tags become the set given.
pub(crate) async fn put(
    state: &S3State,
    input: PutObjectTaggingInput,
) -> S3Result<S3Response<PutObjectTaggingOutput>> {
    let pairs = input
        .tagging
        .tag_set
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default()));
    let tags = checked(pairs)?;
    versions::only_null(input.version_id.as_deref())?;
    set(state, &input.bucket, &input.key, tags).await?;
    Ok(S3Response::new(PutObjectTaggingOutput::default()))
}

/// `DeleteObjectTagging`: the object's user tags go (its labels stay).
pub(crate) async fn delete(
    state: &S3State,
    input: DeleteObjectTaggingInput,
) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    set(state, &input.bucket, &input.key, BTreeMap::new()).await?;
    Ok(S3Response::new(DeleteObjectTaggingOutput::default()))
}

/// `GetObjectTagging`: the user's tags, then the labels' (see [`Labels::tags`]).
pub(crate) async fn get(
    state: &S3State,
    input: GetObjectTaggingInput,
) -> S3Result<S3Response<GetObjectTaggingOutput>> {
    versions::only_null(input.version_id.as_deref())?;
    let object = lookup(state, &input.bucket, &input.key).await?;
    let labels = Labels::of(state, &object).await?;
    let mut tag_set: Vec<Tag> = object
        .tags
        .into_iter()
        .map(|(key, value)| Tag {
            key: Some(key),
            value: Some(value),
        })
        .collect();
    tag_set.extend(labels.tags());
    Ok(S3Response::new(GetObjectTaggingOutput {
        tag_set,
        version_id: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: S3Result<BTreeMap<String, String>>) -> String {
        r.unwrap_err().code().as_str().to_string()
    }

    #[test]
    fn tag_sets_past_aws_limits_or_on_label_keys_are_invalid() {
        let header = from_header(Some("team=blue%20sky&empty=&a%2Bb=c")).unwrap();
        assert_eq!(header["team"], "blue sky");
        assert_eq!(header["empty"], "");
        assert_eq!(header["a+b"], "c");
        assert!(from_header(None).unwrap().is_empty());
        let ten = (0..10).map(|i| (format!("k{i}"), "v".repeat(256)));
        assert_eq!(checked(ten).unwrap().len(), 10);
        let eleven = (0..11).map(|i| (format!("k{i}"), String::new()));
        assert_eq!(code(checked(eleven)), "InvalidTag");
        assert_eq!(code(from_header(Some("a=1&a=2"))), "InvalidTag");
        assert_eq!(code(from_header(Some("=1"))), "InvalidTag");
        assert_eq!(code(from_header(Some("ndpipe-general=cat"))), "InvalidTag");
        let long_key = [("k".repeat(129), String::new())];
        assert_eq!(code(checked(long_key)), "InvalidTag");
        let long_value = [("k".to_string(), "v".repeat(257))];
        assert_eq!(code(checked(long_value)), "InvalidTag");
    }
}
