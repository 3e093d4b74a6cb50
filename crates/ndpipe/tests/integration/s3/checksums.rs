//! Checksums returned (bug 2.10): the one boto3 sends by default (CRC32) or the one asked for
//! is answered by PUT and, with `ChecksumMode=ENABLED`, by GET (checked by boto3 itself) and
//! HEAD; a multipart upload's is composite (`-N`) or of the whole object as asked, with each
//! part's in ListParts, on GET of a part and in GetObjectAttributes; a wrong one is refused.

use super::S3Store;

#[tokio::test]
async fn checksums_given_at_upload_are_returned_and_checked_by_boto3() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import base64, hashlib, zlib
b64 = lambda b: base64.b64encode(b).decode()
crc32 = lambda b: zlib.crc32(b).to_bytes(4, 'big')
def error(f, **kw):
    try:
        f(**kw)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
s3.create_bucket(Bucket='sums')
body = b'checksummed ' * 1000
put = s3.put_object(Bucket='sums', Key='default.txt', Body=body)
got = s3.get_object(Bucket='sums', Key='default.txt', ChecksumMode='ENABLED')
checked_by = type(got['Body']).__name__
data = got['Body'].read()
head = s3.head_object(Bucket='sums', Key='default.txt', ChecksumMode='ENABLED')
plain_head = s3.head_object(Bucket='sums', Key='default.txt')
ranged = s3.get_object(Bucket='sums', Key='default.txt', Range='bytes=0-9', ChecksumMode='ENABLED')
sha_put = s3.put_object(Bucket='sums', Key='sha.txt', Body=body, ChecksumAlgorithm='SHA256')
sha_head = s3.head_object(Bucket='sums', Key='sha.txt', ChecksumMode='ENABLED')
wrong = error(s3.put_object, Bucket='sums', Key='wrong.txt', Body=body,
              ChecksumSHA256=b64(hashlib.sha256(b'other').digest()))
print(json.dumps({
    'crc32': b64(crc32(body)),
    'put': [put.get('ChecksumCRC32'), put.get('ChecksumType')],
    'get': [got.get('ChecksumCRC32'), got.get('ChecksumType'), checked_by, data == body],
    'head': [head.get('ChecksumCRC32'), head.get('ChecksumType')],
    'plain_head': 'ChecksumCRC32' in plain_head,
    'ranged': 'ChecksumCRC32' in ranged,
    'sha256': b64(hashlib.sha256(body).digest()),
    'sha_put': sha_put.get('ChecksumSHA256'), 'sha_head': sha_head.get('ChecksumSHA256'),
    'wrong': wrong, 'wrong_left': error(s3.head_object, Bucket='sums', Key='wrong.txt'),
}))
"#,
    );
    let crc32 = &out["crc32"];
    assert_eq!(out["put"], serde_json::json!([crc32, "FULL_OBJECT"]));
    assert_eq!(
        out["get"],
        serde_json::json!([crc32, "FULL_OBJECT", "StreamingChecksumBody", true]),
        "boto3 checked the body against the checksum answered"
    );
    assert_eq!(out["head"], serde_json::json!([crc32, "FULL_OBJECT"]));
    assert_eq!(out["plain_head"], false, "only with ChecksumMode=ENABLED");
    assert_eq!(out["ranged"], false, "no stored checksum covers a range");
    assert_eq!(out["sha_put"], out["sha256"]);
    assert_eq!(out["sha_head"], out["sha256"]);
    assert_eq!(out["wrong"], serde_json::json!(["BadDigest", 400]));
    assert_eq!(out["wrong_left"], serde_json::json!(["404", 404]));
}

#[tokio::test]
async fn multipart_checksums_are_composite_or_full_with_each_parts_own() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import base64, zlib
b64 = lambda b: base64.b64encode(b).decode()
crc32 = lambda b: zlib.crc32(b).to_bytes(4, 'big')
MiB = 1 << 20
s3.create_bucket(Bucket='multi')
chunks = [b'A' * (5 * MiB), b'the last part']
whole = b''.join(chunks)
def upload(key, **kind):
    made = s3.create_multipart_upload(Bucket='multi', Key=key, ChecksumAlgorithm='CRC32', **kind)
    up = made['UploadId']
    parts = []
    for i, c in enumerate(chunks):
        r = s3.upload_part(Bucket='multi', Key=key, UploadId=up, PartNumber=i + 1, Body=c,
                           ChecksumAlgorithm='CRC32')
        parts.append({'ETag': r['ETag'], 'PartNumber': i + 1, 'ChecksumCRC32': r['ChecksumCRC32']})
    return made, up, parts
made, up, parts = upload('composite.bin')
listed = s3.list_parts(Bucket='multi', Key='composite.bin', UploadId=up)
done = s3.complete_multipart_upload(Bucket='multi', Key='composite.bin', UploadId=up,
                                    MultipartUpload={'Parts': parts})
got = s3.get_object(Bucket='multi', Key='composite.bin', ChecksumMode='ENABLED')
data = got['Body'].read()
part1 = s3.get_object(Bucket='multi', Key='composite.bin', PartNumber=1, ChecksumMode='ENABLED')
part1_checked_by = type(part1['Body']).__name__
part1_ok = part1['Body'].read() == chunks[0]
attrs = s3.get_object_attributes(Bucket='multi', Key='composite.bin',
                                 ObjectAttributes=['Checksum', 'ObjectParts'])
_, full_up, full_parts = upload('full.bin', ChecksumType='FULL_OBJECT')
full = s3.complete_multipart_upload(Bucket='multi', Key='full.bin', UploadId=full_up,
                                    MultipartUpload={'Parts': full_parts})
full_got = s3.get_object(Bucket='multi', Key='full.bin', ChecksumMode='ENABLED')
full_checked_by = type(full_got['Body']).__name__
full_ok = full_got['Body'].read() == whole
_, bad_up, bad_parts = upload('bad.bin')
bad_parts[1]['ChecksumCRC32'] = b64(crc32(b'other'))
try:
    s3.complete_multipart_upload(Bucket='multi', Key='bad.bin', UploadId=bad_up,
                                 MultipartUpload={'Parts': bad_parts})
    bad = 'ok'
except botocore.exceptions.ClientError as e:
    bad = e.response['Error']['Code']
composite = b64(crc32(b''.join(crc32(c) for c in chunks))) + '-2'
print(json.dumps({
    'made': [made.get('ChecksumAlgorithm'), made.get('ChecksumType')],
    'part_crcs': [b64(crc32(c)) for c in chunks],
    'listed': [p.get('ChecksumCRC32') for p in listed['Parts']],
    'composite': composite,
    'done': [done.get('ChecksumCRC32'), done.get('ChecksumType')],
    'get': [got.get('ChecksumCRC32'), got.get('ChecksumType'), data == whole],
    'part1': [part1.get('ChecksumCRC32'), part1_checked_by, part1_ok],
    'attrs': [attrs['Checksum'].get('ChecksumCRC32'), attrs['Checksum'].get('ChecksumType'),
              [p.get('ChecksumCRC32') for p in attrs['ObjectParts']['Parts']]],
    'whole': b64(crc32(whole)),
    'full': [full.get('ChecksumCRC32'), full.get('ChecksumType')],
    'full_get': [full_got.get('ChecksumCRC32'), full_checked_by, full_ok],
    'bad': bad,
    'bad_left': s3.list_objects_v2(Bucket='multi', Prefix='bad')['KeyCount'],
}))
"#,
    );
    let parts = &out["part_crcs"];
    assert_eq!(out["made"], serde_json::json!(["CRC32", "COMPOSITE"]));
    assert_eq!(
        &out["listed"], parts,
        "ListParts gives each part's checksum"
    );
    let composite = &out["composite"];
    assert_eq!(out["done"], serde_json::json!([composite, "COMPOSITE"]));
    assert_eq!(
        out["get"],
        serde_json::json!([composite, "COMPOSITE", true])
    );
    assert_eq!(
        out["part1"],
        serde_json::json!([parts[0], "StreamingChecksumBody", true]),
        "a part's GET answers (and boto3 checks) the part's checksum"
    );
    assert_eq!(
        out["attrs"],
        serde_json::json!([composite, "COMPOSITE", parts])
    );
    let whole = &out["whole"];
    assert_eq!(out["full"], serde_json::json!([whole, "FULL_OBJECT"]));
    assert_eq!(
        out["full_get"],
        serde_json::json!([whole, "StreamingChecksumBody", true])
    );
    assert_eq!(out["bad"], "InvalidPart", "a part whose checksum differs");
    assert_eq!(out["bad_left"], 0, "nothing was stored");
}
