//! Bad input on the S3 API: malformed XML bodies, parts out of order or unknown, bodies whose
//! digests do not match. Every refusal is 4xx S3 XML with AWS's code, and nothing is stored:
//! no object, no staged part, no half-written photo.

use super::S3Store;

#[tokio::test(flavor = "multi_thread")]
async fn malformed_bodies_and_wrong_parts_are_4xx_and_store_nothing() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import base64, hashlib, http.client, re, urllib.parse
u = urllib.parse.urlparse(ENDPOINT)
def raw(method, path, body=b'', headers=None):
    c = http.client.HTTPConnection(u.hostname, u.port)
    headers = dict(headers or {})
    headers.setdefault('Content-MD5', base64.b64encode(hashlib.md5(body).digest()).decode())
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    code = re.search(rb'<Code>([^<]*)</Code>', data)
    return [r.status, code.group(1).decode() if code else None]
def code(f):
    try:
        f()
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return e.response['Error']['Code']
s3.create_bucket(Bucket='bad')
s3.put_object(Bucket='bad', Key='kept', Body=b'kept')
up = s3.create_multipart_upload(Bucket='bad', Key='mp')['UploadId']
big = b'A' * (5 << 20)
e1 = s3.upload_part(Bucket='bad', Key='mp', UploadId=up, PartNumber=1, Body=big)['ETag']
e2 = s3.upload_part(Bucket='bad', Key='mp', UploadId=up, PartNumber=2, Body=b'tail')['ETag']
complete = lambda parts: lambda: s3.complete_multipart_upload(
    Bucket='bad', Key='mp', UploadId=up, MultipartUpload={'Parts': parts})
answers = {
    'delete_xml': raw('POST', '/bad?delete', b'<Delete><Object><Key>kept'),
    'delete_not_xml': raw('POST', '/bad?delete', b'\x00\xff not xml'),
    'complete_xml': raw('POST', '/bad/mp?uploadId=' + up, b'<CompleteMultipartUpload><Part>'),
    'tagging_xml': raw('PUT', '/bad/kept?tagging', b'<Tagging><TagSet><Tag><Key>a'),
    'bucket_xml': raw('PUT', '/bad2', b'<CreateBucketConfiguration><Location'),
    'put_md5': raw('PUT', '/bad/md5', b'body', {'Content-MD5': base64.b64encode(b'0' * 16).decode()}),
    'put_crc32': raw('PUT', '/bad/crc', b'body', {'x-amz-checksum-crc32': 'AAAAAA=='}),
    'part_md5': raw('PUT', '/bad/mp?partNumber=3&uploadId=' + up, b'part',
                    {'Content-MD5': base64.b64encode(b'1' * 16).decode()}),
    'order': code(complete([{'PartNumber': 2, 'ETag': e2}, {'PartNumber': 1, 'ETag': e1}])),
    'unknown_part': code(complete([{'PartNumber': 1, 'ETag': e1}, {'PartNumber': 7, 'ETag': e2}])),
    'wrong_etag': code(complete([{'PartNumber': 1, 'ETag': e2}, {'PartNumber': 2, 'ETag': e2}])),
}
parts = [p['PartNumber'] for p in s3.list_parts(Bucket='bad', Key='mp', UploadId=up).get('Parts', [])]
keys = [o['Key'] for o in s3.list_objects_v2(Bucket='bad').get('Contents', [])]
tags = s3.get_object_tagging(Bucket='bad', Key='kept')['TagSet']
buckets = [b['Name'] for b in s3.list_buckets()['Buckets']]
done = s3.complete_multipart_upload(Bucket='bad', Key='mp', UploadId=up,
    MultipartUpload={'Parts': [{'PartNumber': 1, 'ETag': e1}, {'PartNumber': 2, 'ETag': e2}]})
whole = s3.get_object(Bucket='bad', Key='mp')['Body'].read()
print(json.dumps({'answers': answers, 'parts': parts, 'keys': keys, 'tags': tags,
                  'buckets': buckets, 'whole': len(whole) == len(big) + 4 and whole.endswith(b'tail')}))
"#,
    );
    let answers = &out["answers"];
    let expected = serde_json::json!({
        "delete_xml": [400, "MalformedXML"],
        "delete_not_xml": [400, "MalformedXML"],
        "complete_xml": [400, "MalformedXML"],
        "tagging_xml": [400, "MalformedXML"],
        "bucket_xml": [400, "MalformedXML"],
        "put_md5": [400, "BadDigest"],
        "put_crc32": [400, "BadDigest"],
        "part_md5": [400, "BadDigest"],
        "order": "InvalidPartOrder",
        "unknown_part": "InvalidPart",
        "wrong_etag": "InvalidPart",
    });
    assert_eq!(answers, &expected, "server log:\n{}", s3.inst.log());
    assert_eq!(
        out["keys"],
        serde_json::json!(["kept"]),
        "no object from a refusal"
    );
    assert_eq!(
        out["parts"],
        serde_json::json!([1, 2]),
        "no part from a refusal"
    );
    assert_eq!(out["whole"], true, "the upload completes whole afterwards");
    assert_eq!(
        out["tags"],
        serde_json::json!([]),
        "a refused tagging changes nothing"
    );
    assert_eq!(
        out["buckets"],
        serde_json::json!(["bad"]),
        "no bucket from bad XML"
    );
    assert!(!s3.inst.log().contains("panicked"), "{}", s3.inst.log());
}
