//! boto3 against the store: ranges, a paginated listing over 1000 keys, copies, batch deletes,
//! multipart uploads (and parts that do not match), labels as tags and metadata, bad images.

use super::S3Store;

#[tokio::test]
async fn boto3_reads_ranges_pages_through_1001_keys_copies_and_deletes() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import hashlib
s3.create_bucket(Bucket='bkt')
body = bytes(range(256)) * 4
put = s3.put_object(Bucket='bkt', Key='blob.bin', Body=body)
part = s3.get_object(Bucket='bkt', Key='blob.bin', Range='bytes=10-19')
assert part['Body'].read() == body[10:20]
assert part['ContentRange'] == 'bytes 10-19/1024', part['ContentRange']
tail = s3.get_object(Bucket='bkt', Key='blob.bin', Range='bytes=-4')['Body'].read()
assert tail == body[-4:]
try:
    s3.get_object(Bucket='bkt', Key='blob.bin', Range='bytes=5000-6000')
    raise SystemExit('a range past the end was served')
except botocore.exceptions.ClientError as e:
    assert e.response['Error']['Code'] == 'InvalidRange', e.response
for i in range(1001):
    s3.put_object(Bucket='bkt', Key=f'many/{i:04}.json', Body=b'{}')
keys, pages = [], 0
for page in s3.get_paginator('list_objects_v2').paginate(Bucket='bkt', Prefix='many/'):
    pages += 1
    keys += [o['Key'] for o in page.get('Contents', [])]
small = s3.list_objects_v2(Bucket='bkt', Prefix='many/', MaxKeys=7)
top = s3.list_objects_v2(Bucket='bkt', Delimiter='/')
heic = b'\0\0\0\x18ftypheic' + bytes(100)
s3.put_object(Bucket='bkt', Key='IMG_0001.HEIC', Body=heic, ContentType='image/heic')
heic_back = s3.get_object(Bucket='bkt', Key='IMG_0001.HEIC')
s3.copy_object(Bucket='bkt', Key='copy.bin', CopySource={'Bucket': 'bkt', 'Key': 'blob.bin'})
copied = s3.get_object(Bucket='bkt', Key='copy.bin')['Body'].read()
gone = s3.delete_objects(Bucket='bkt', Delete={'Objects': [{'Key': k} for k in keys[:500]]})
left = s3.list_objects_v2(Bucket='bkt', Prefix='many/')['KeyCount']
try:
    s3.head_object(Bucket='bkt', Key='many')
    missing = None
except botocore.exceptions.ClientError as e:
    missing = e.response['ResponseMetadata']['HTTPStatusCode']
print(json.dumps({
    'etag_is_md5': put['ETag'] == '"%s"' % hashlib.md5(body).hexdigest(), 'keys': len(keys), 'sorted': keys == sorted(keys), 'pages': pages,
    'small': [small['KeyCount'], small['IsTruncated']],
    'top': [p['Prefix'] for p in top.get('CommonPrefixes', [])],
    'top_keys': [o['Key'] for o in top.get('Contents', [])],
    'copied': copied == body,
    'heic': [heic_back['Body'].read() == heic, heic_back['ContentType']], 'deleted': len(gone['Deleted']), 'left': left, 'missing': missing,
}))
"#,
    );
    assert_eq!(out["etag_is_md5"], true);
    assert_eq!(
        (out["keys"].as_u64(), out["sorted"].as_bool()),
        (Some(1001), Some(true))
    );
    assert_eq!(out["pages"], 2, "1001 keys are two pages of at most 1000");
    assert_eq!(out["small"], serde_json::json!([7, true]));
    assert_eq!(out["top"], serde_json::json!(["many/"]));
    assert_eq!(out["top_keys"], serde_json::json!(["blob.bin"]));
    assert_eq!(out["copied"], true);
    assert_eq!(
        out["heic"],
        serde_json::json!([true, "image/heic"]),
        "an image format ingest does not decode is kept as a plain object"
    );
    let photos = s3.inst.json("/v1/photos").await;
    assert_eq!(photos["photos"], serde_json::json!([]), "no photo was made");
    assert_eq!(
        (out["deleted"].as_u64(), out["left"].as_u64()),
        (Some(500), Some(501))
    );
    assert_eq!(out["missing"], 404, "a HEAD on a prefix is a 404");
}
