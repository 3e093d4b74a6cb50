//! Listings as AWS answers them: V1 paged with a delimiter walks every key and prefix once,
//! the XML echoes what AWS echoes (no empty `Delimiter`, always a V1 `Marker`, `Owner` on
//! request), `ListObjectVersions` answers current objects as "null" versions (the call tools
//! empty buckets with), and a bucket with only an upload in progress is deleted with it.

use serde_json::json as j;

use super::S3Store;

/// Keys whose top level is two prefixes around a key, with a nested prefix under `a/`.
const KEYS: &str = "['a/1', 'a/2', 'a/x/1', 'b', 'c/1']";

#[tokio::test]
async fn v1_paged_with_a_delimiter_walks_every_key_and_prefix_once() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(&format!(
        r#"
s3.create_bucket(Bucket='vone')
for k in {KEYS}:
    s3.put_object(Bucket='vone', Key=k, Body=b'x')
def walk(**kw):
    seen, pages = [], 0
    try:
        for page in s3.get_paginator('list_objects').paginate(
                Bucket='vone', PaginationConfig={{'PageSize': 1, 'MaxItems': 20}}, **kw):
            pages += 1
            seen += [o['Key'] for o in page.get('Contents', [])]
            seen += [p['Prefix'] for p in page.get('CommonPrefixes', [])]
    except botocore.exceptions.PaginationError as e:
        return ['never ends', str(e)]
    return [seen, pages]
print(json.dumps({{
    'top': walk(Delimiter='/'),
    'under_a': walk(Delimiter='/', Prefix='a/'),
    'flat': walk(),
    'after_prefix': [p['Prefix'] for p in s3.list_objects(
        Bucket='vone', Delimiter='/', Marker='a/').get('CommonPrefixes', [])],
}}))
"#
    ));
    assert_eq!(out["top"], j!([["a/", "b", "c/"], 3]));
    assert_eq!(out["under_a"], j!([["a/1", "a/2", "a/x/"], 3]));
    assert_eq!(out["flat"], j!([["a/1", "a/2", "a/x/1", "b", "c/1"], 5]));
    assert_eq!(
        out["after_prefix"],
        j!(["c/"]),
        "a marker that is a common prefix skips it"
    );
}

#[tokio::test]
async fn listing_xml_echoes_what_aws_echoes() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import urllib.request
s3.create_bucket(Bucket='xml')
s3.put_object(Bucket='xml', Key='k', Body=b'x')
def raw(query):
    return urllib.request.urlopen(ENDPOINT + '/xml?' + query).read().decode()
v1, v1_empty, v2_empty = raw(''), raw('delimiter='), raw('list-type=2&delimiter=')
owned = s3.list_objects_v2(Bucket='xml', FetchOwner=True)['Contents'][0]
plain = s3.list_objects_v2(Bucket='xml')['Contents'][0]
print(json.dumps({
    'v1_marker': '<Marker></Marker>' in v1 or '<Marker/>' in v1,
    'empty_delimiter': ['<Delimiter' in v1_empty, '<Delimiter' in v2_empty],
    'fetch_owner': owned.get('Owner'), 'no_owner': 'Owner' in plain,
    'v1_owner': s3.list_objects(Bucket='xml')['Contents'][0].get('Owner'),
}))
"#,
    );
    let owner = j!({"ID": "ndpipe", "DisplayName": "ndpipe"});
    assert_eq!(out["v1_marker"], true, "V1 always has <Marker>");
    assert_eq!(
        out["empty_delimiter"],
        j!([false, false]),
        "an empty delimiter is not echoed"
    );
    assert_eq!(out["fetch_owner"], owner, "FetchOwner=true gives the owner");
    assert_eq!(out["no_owner"], false, "V2 gives no owner unless asked");
    assert_eq!(out["v1_owner"], owner, "V1 always gives the owner");
}

#[tokio::test]
async fn object_versions_of_an_unversioned_bucket_are_null_versions_tools_can_delete() {
    let s3 = S3Store::start(&[]);
    s3.boto3(&format!(
        r#"
s3.create_bucket(Bucket='ver')
for k in {KEYS}:
    s3.put_object(Bucket='ver', Key=k, Body=b'x')
print('{{}}')
"#
    ));
    let (ok, stdout, stderr) = s3.aws(&["s3api", "list-object-versions", "--bucket", "ver"]);
    assert!(ok, "aws s3api list-object-versions: {stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let versions = listed["Versions"].as_array().unwrap();
    let keys: Vec<_> = versions
        .iter()
        .map(|v| v["Key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a/1", "a/2", "a/x/1", "b", "c/1"]);
    assert!(
        versions
            .iter()
            .all(|v| v["VersionId"] == "null" && v["IsLatest"] == true && v["Size"] == 1),
        "{stdout}"
    );
    let out = s3.boto3(
        r#"
def walk(**kw):
    seen = []
    for page in s3.get_paginator('list_object_versions').paginate(
            Bucket='ver', PaginationConfig={'PageSize': 1, 'MaxItems': 20}, **kw):
        seen += [v['Key'] for v in page.get('Versions', [])]
        seen += [p['Prefix'] for p in page.get('CommonPrefixes', [])]
    return seen
top, under_a, flat = walk(Delimiter='/'), walk(Delimiter='/', Prefix='a/'), walk()
try:
    s3.list_object_versions(Bucket='ver', VersionIdMarker='null')
    lone_marker = 'ok'
except botocore.exceptions.ClientError as e:
    lone_marker = e.response['Error']['Code']
def version_read(f, version):
    try:
        f(Bucket='ver', Key='b', VersionId=version)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return e.response['Error']['Code']
reads = [version_read(f, v) for f in (s3.get_object, s3.head_object) for v in ('null', 'v2')]
bucket = boto3.resource('s3', endpoint_url=ENDPOINT, region_name='us-east-1',
    config=Config(signature_version=botocore.UNSIGNED, s3={'addressing_style': 'path'})).Bucket('ver')
deleted = bucket.object_versions.delete()
left = s3.list_objects_v2(Bucket='ver')['KeyCount']
s3.delete_bucket(Bucket='ver')
print(json.dumps({
    'top': top, 'under_a': under_a, 'flat': flat, 'lone_marker': lone_marker, 'reads': reads,
    'deleted': sorted((d['Key'], d.get('VersionId')) for r in deleted for d in r['Deleted']),
    'left': left, 'buckets': [b['Name'] for b in s3.list_buckets()['Buckets']],
}))
"#,
    );
    assert_eq!(out["top"], j!(["a/", "b", "c/"]));
    assert_eq!(out["under_a"], j!(["a/1", "a/2", "a/x/"]));
    assert_eq!(out["flat"], j!(["a/1", "a/2", "a/x/1", "b", "c/1"]));
    assert_eq!(
        out["lone_marker"], "InvalidArgument",
        "a version-id marker needs a key marker"
    );
    assert_eq!(
        out["reads"],
        j!(["ok", "InvalidArgument", "ok", "400"]),
        "GET and HEAD read the null version and refuse any other (HEAD has no body to name a code)"
    );
    assert_eq!(
        out["deleted"],
        j!([
            ["a/1", "null"],
            ["a/2", "null"],
            ["a/x/1", "null"],
            ["b", "null"],
            ["c/1", "null"]
        ])
    );
    assert_eq!((out["left"].as_u64(), &out["buckets"]), (Some(0), &j!([])));
}

#[tokio::test]
async fn deleting_a_bucket_with_only_an_upload_in_progress_aborts_the_upload() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
def code(f):
    try:
        f()
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return e.response['Error']['Code']
s3.create_bucket(Bucket='mpu')
up = s3.create_multipart_upload(Bucket='mpu', Key='big.bin')['UploadId']
s3.upload_part(Bucket='mpu', Key='big.bin', UploadId=up, PartNumber=1, Body=b'x' * 1024)
deleted = code(lambda: s3.delete_bucket(Bucket='mpu'))
gone = code(lambda: s3.head_bucket(Bucket='mpu'))
s3.create_bucket(Bucket='mpu')
again = s3.list_multipart_uploads(Bucket='mpu').get('Uploads', [])
s3.create_bucket(Bucket='full')
s3.put_object(Bucket='full', Key='k', Body=b'x')
kept = s3.create_multipart_upload(Bucket='full', Key='big.bin')['UploadId']
full = code(lambda: s3.delete_bucket(Bucket='full'))
print(json.dumps({
    'upload': up, 'deleted': deleted, 'gone': gone, 'again': again, 'full': full, 'kept': kept,
    'still': [u['UploadId'] for u in s3.list_multipart_uploads(Bucket='full').get('Uploads', [])],
}))
"#,
    );
    assert_eq!(out["deleted"], "ok", "{out}");
    assert_eq!(out["gone"], "404");
    assert_eq!(out["again"], j!([]), "the upload went with it");
    let staged = s3
        .inst
        .data
        .join("s3-uploads")
        .join(out["upload"].as_str().unwrap());
    assert!(!staged.exists(), "its parts were removed from disk");
    assert_eq!(out["full"], "BucketNotEmpty");
    assert_eq!(
        out["still"],
        j!([out["kept"]]),
        "a bucket with objects keeps its uploads"
    );
}
