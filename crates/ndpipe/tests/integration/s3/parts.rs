//! Parts of a multipart object: GET and HEAD `?partNumber=N` (bug 2.2) answer one part with
//! 206, `Content-Range` and `x-amz-mp-parts-count` (a plain PUT is one part; a part it lacks
//! is `InvalidPart`; a Range with it is refused), a retried CompleteMultipartUpload answers the
//! same ETag (bug 2.4), UploadPartCopy copies whole objects and byte ranges, and
//! GetObjectAttributes gives size, ETag, storage class and parts.

use super::S3Store;

#[tokio::test]
async fn parts_are_read_one_by_one_and_a_retried_completion_answers_the_same() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
MiB = 1 << 20
def error(f, **kw):
    try:
        f(**kw)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
s3.create_bucket(Bucket='parts')
chunks = [bytes([1]) * (5 * MiB), bytes([2]) * (5 * MiB), b'tail' * 250]
up = s3.create_multipart_upload(Bucket='parts', Key='three.bin')['UploadId']
parts = [{'ETag': s3.upload_part(Bucket='parts', Key='three.bin', UploadId=up, PartNumber=i + 1,
                                 Body=c)['ETag'], 'PartNumber': i + 1}
         for i, c in enumerate(chunks)]
complete = lambda: s3.complete_multipart_upload(Bucket='parts', Key='three.bin', UploadId=up,
                                                MultipartUpload={'Parts': parts})
done = complete()
again = complete()
read, heads = [], []
for n in (1, 2, 3):
    got = s3.get_object(Bucket='parts', Key='three.bin', PartNumber=n)
    read.append(got['Body'].read())
    head = s3.head_object(Bucket='parts', Key='three.bin', PartNumber=n)
    heads.append([got['ResponseMetadata']['HTTPStatusCode'], got['ContentRange'],
                  got['PartsCount'], got['ETag'] == done['ETag'],
                  head['ContentRange'], head['ContentLength'], head['PartsCount']])
put = s3.put_object(Bucket='parts', Key='one.txt', Body=b'body')
one = s3.get_object(Bucket='parts', Key='one.txt', PartNumber=1)
s3.put_object(Bucket='parts', Key='three.bin', Body=b'replaced')
print(json.dumps({
    'same': [again['ETag'] == done['ETag'], again['Location'] == done['Location'],
             done['ETag'].endswith('-3"')],
    'reassembled': b''.join(read) == b''.join(chunks),
    'heads': heads,
    'beyond': error(s3.get_object, Bucket='parts', Key='one.txt', PartNumber=4),
    'one': [one['Body'].read().decode(), one['ETag'] == put['ETag'], one['PartsCount']],
    'one_part2': error(s3.get_object, Bucket='parts', Key='one.txt', PartNumber=2),
    'head_part2': error(s3.head_object, Bucket='parts', Key='one.txt', PartNumber=2),
    'with_range': error(s3.get_object, Bucket='parts', Key='one.txt', PartNumber=1, Range='bytes=0-1'),
    'after_overwrite': error(complete),
    'unknown': error(s3.complete_multipart_upload, Bucket='parts', Key='one.txt', UploadId='0123abcd',
                     MultipartUpload={'Parts': parts}),
}))
"#,
    );
    assert_eq!(out["same"], serde_json::json!([true, true, true]));
    assert_eq!(out["reassembled"], true, "the three parts are the object");
    let mib5 = 5 << 20;
    let total = 2 * mib5 + 1000;
    let first = format!("bytes 0-{}/{total}", mib5 - 1);
    let second = format!("bytes {mib5}-{}/{total}", 2 * mib5 - 1);
    let third = format!("bytes {}-{}/{total}", 2 * mib5, total - 1);
    assert_eq!(
        out["heads"],
        serde_json::json!([
            [206, &first, 3, true, &first, mib5, 3],
            [206, &second, 3, true, &second, mib5, 3],
            [206, &third, 3, true, &third, 1000, 3],
        ]),
        "GET: status, range, parts count, ETag; HEAD: range, length, parts count"
    );
    assert_eq!(out["beyond"], serde_json::json!(["InvalidPart", 400]));
    assert_eq!(out["one"], serde_json::json!(["body", true, 1]));
    assert_eq!(out["one_part2"], serde_json::json!(["InvalidPart", 400]));
    assert_eq!(out["head_part2"], serde_json::json!(["400", 400]));
    assert_eq!(
        out["with_range"],
        serde_json::json!(["InvalidRequest", 400])
    );
    assert_eq!(
        out["after_overwrite"],
        serde_json::json!(["NoSuchUpload", 404]),
        "the upload's object is no longer current"
    );
    assert_eq!(out["unknown"], serde_json::json!(["NoSuchUpload", 404]));
}

#[tokio::test]
async fn parts_copied_from_objects_and_object_attributes() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
MiB = 1 << 20
def error(f, **kw):
    try:
        f(**kw)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
s3.create_bucket(Bucket='copies')
source = bytes(range(256)) * (24 * 1024)
s3.put_object(Bucket='copies', Key='src.bin', Body=source)
up = s3.create_multipart_upload(Bucket='copies', Key='copied.bin')['UploadId']
copy = lambda n, **kw: s3.upload_part_copy(Bucket='copies', Key='copied.bin', UploadId=up, PartNumber=n,
                                           CopySource={'Bucket': 'copies', 'Key': 'src.bin'}, **kw)
whole = copy(1)['CopyPartResult']
ranged = copy(2, CopySourceRange='bytes=100-199')['CopyPartResult']
refused = {
    'past_end': error(copy, n=3, CopySourceRange='bytes=0-%d' % len(source)),
    'malformed': error(copy, n=3, CopySourceRange='bytes=5-'),
    'no_source': error(s3.upload_part_copy, Bucket='copies', Key='copied.bin', UploadId=up, PartNumber=3,
                       CopySource={'Bucket': 'copies', 'Key': 'missing'}),
}
listed = [p['PartNumber'] for p in s3.list_parts(Bucket='copies', Key='copied.bin', UploadId=up)['Parts']]
done = s3.complete_multipart_upload(Bucket='copies', Key='copied.bin', UploadId=up, MultipartUpload={
    'Parts': [{'ETag': whole['ETag'], 'PartNumber': 1}, {'ETag': ranged['ETag'], 'PartNumber': 2}]})
back = s3.get_object(Bucket='copies', Key='copied.bin')['Body'].read()
ALL = ['ETag', 'Checksum', 'ObjectParts', 'StorageClass', 'ObjectSize']
attrs = s3.get_object_attributes(Bucket='copies', Key='copied.bin', ObjectAttributes=ALL)
paged = s3.get_object_attributes(Bucket='copies', Key='copied.bin', ObjectAttributes=['ObjectParts'],
                                 MaxParts=1)['ObjectParts']
plain = s3.get_object_attributes(Bucket='copies', Key='src.bin', ObjectAttributes=ALL)
print(json.dumps({
    'copied': back == source + source[100:200],
    'refused': refused, 'listed': listed,
    'attrs': [attrs['ETag'].strip('"') == done['ETag'].strip('"'), attrs['ObjectSize'],
              attrs['StorageClass'], attrs['ObjectParts']['TotalPartsCount'],
              [[p['PartNumber'], p['Size']] for p in attrs['ObjectParts']['Parts']]],
    'paged': [paged['IsTruncated'], paged['NextPartNumberMarker'], len(paged['Parts'])],
    'plain': [plain['ObjectSize'], plain['StorageClass'], 'ObjectParts' in plain,
              plain['Checksum'].get('ChecksumType')],
    'size': len(source),
}))
"#,
    );
    assert_eq!(out["copied"], true, "a whole object and a range, joined");
    assert_eq!(
        out["refused"],
        serde_json::json!({
            "past_end": ["InvalidRange", 416],
            "malformed": ["InvalidArgument", 400],
            "no_source": ["NoSuchKey", 404],
        })
    );
    assert_eq!(
        out["listed"],
        serde_json::json!([1, 2]),
        "refusals staged nothing"
    );
    let size = out["size"].as_u64().unwrap();
    assert_eq!(
        out["attrs"],
        serde_json::json!([true, size + 100, "STANDARD", 2, [[1, size], [2, 100]]])
    );
    assert_eq!(out["paged"], serde_json::json!([true, 1, 1]));
    assert_eq!(
        out["plain"],
        serde_json::json!([size, "STANDARD", false, "FULL_OBJECT"]),
        "one PUT has no parts; boto3's CRC32 is its checksum"
    );
}
