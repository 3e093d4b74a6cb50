//! Standard headers kept with an object (bug 2.3): Cache-Control, Expires, Content-Encoding,
//! Content-Disposition and Content-Language given on PUT, CopyObject (COPY keeps the source's,
//! REPLACE takes the request's) and CreateMultipartUpload come back on GET and HEAD, GET's
//! `response-*` parameters override them, and a gzip object round-trips through `aws s3 cp
//! --content-encoding gzip` and boto3.

use super::S3Store;

#[tokio::test]
async fn standard_headers_given_at_upload_come_back_on_get_and_head() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import datetime
s3.create_bucket(Bucket='hdr')
when = datetime.datetime(2044, 12, 1, 16, 0, 0, tzinfo=datetime.timezone.utc)
given = dict(CacheControl='max-age=60', ContentDisposition='attachment; filename="a.txt"',
             ContentEncoding='identity', ContentLanguage='fr', Expires=when)
s3.put_object(Bucket='hdr', Key='put.txt', Body=b'hello', **given)
s3.copy_object(Bucket='hdr', Key='copy.txt', CopySource={'Bucket': 'hdr', 'Key': 'put.txt'})
s3.copy_object(Bucket='hdr', Key='replaced.txt', CopySource={'Bucket': 'hdr', 'Key': 'put.txt'},
               MetadataDirective='REPLACE', CacheControl='no-cache', ContentLanguage='de')
up = s3.create_multipart_upload(Bucket='hdr', Key='mp.txt', **given)['UploadId']
etag = s3.upload_part(Bucket='hdr', Key='mp.txt', UploadId=up, PartNumber=1, Body=b'parts')['ETag']
s3.complete_multipart_upload(Bucket='hdr', Key='mp.txt', UploadId=up,
                             MultipartUpload={'Parts': [{'ETag': etag, 'PartNumber': 1}]})
NAMES = ['cache-control', 'content-disposition', 'content-encoding', 'content-language', 'expires']
def kept(response):
    headers = response['ResponseMetadata']['HTTPHeaders']
    return {n: headers.get(n) for n in NAMES}
out = {}
for key in ['put.txt', 'copy.txt', 'replaced.txt', 'mp.txt']:
    out[key] = [kept(s3.get_object(Bucket='hdr', Key=key)), kept(s3.head_object(Bucket='hdr', Key=key))]
overridden = s3.get_object(Bucket='hdr', Key='put.txt', ResponseCacheControl='no-store',
                           ResponseContentDisposition='inline', ResponseContentEncoding='identity',
                           ResponseContentLanguage='en', ResponseContentType='text/csv',
                           ResponseExpires=datetime.datetime(2030, 1, 2, tzinfo=datetime.timezone.utc))
out['overridden'] = kept(overridden)
out['overridden_type'] = overridden['ContentType']
print(json.dumps(out))
"#,
    );
    let given = serde_json::json!({
        "cache-control": "max-age=60",
        "content-disposition": "attachment; filename=\"a.txt\"",
        "content-encoding": "identity",
        "content-language": "fr",
        "expires": "Thu, 01 Dec 2044 16:00:00 GMT",
    });
    for key in ["put.txt", "copy.txt", "mp.txt"] {
        assert_eq!(out[key][0], given, "GET of {key}");
        assert_eq!(out[key][1], given, "HEAD of {key}");
    }
    let replaced = serde_json::json!({
        "cache-control": "no-cache",
        "content-disposition": null,
        "content-encoding": null,
        "content-language": "de",
        "expires": null,
    });
    assert_eq!(
        out["replaced.txt"][0], replaced,
        "REPLACE takes the request's"
    );
    assert_eq!(out["replaced.txt"][1], replaced);
    assert_eq!(
        out["overridden"],
        serde_json::json!({
            "cache-control": "no-store",
            "content-disposition": "inline",
            "content-encoding": "identity",
            "content-language": "en",
            "expires": "Wed, 02 Jan 2030 00:00:00 GMT",
        })
    );
    assert_eq!(out["overridden_type"], "text/csv");
}

#[tokio::test]
async fn a_gzip_object_round_trips_with_awscli_and_boto3() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let gz = work.path().join("data.json.gz");
    let back = work.path().join("back.json.gz");
    let made = s3.boto3(&format!(
        r#"
import gzip
s3.create_bucket(Bucket='gzip')
open({gz:?}, 'wb').write(gzip.compress(b'{{"photos": [1, 2, 3]}}' * 100))
print(json.dumps({{}}))
"#,
        gz = gz.to_str().unwrap()
    ));
    assert_eq!(made, serde_json::json!({}));
    let gz_path = gz.to_str().unwrap();
    let (ok, _, err) = s3.aws(&[
        "s3",
        "cp",
        gz_path,
        "s3://gzip/aws.json.gz",
        "--content-encoding",
        "gzip",
        "--content-type",
        "application/json",
    ]);
    assert!(ok, "{err}");
    let (ok, head, err) = s3.aws(&[
        "s3api",
        "head-object",
        "--bucket",
        "gzip",
        "--key",
        "aws.json.gz",
    ]);
    assert!(ok, "{err}");
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["ContentEncoding"], "gzip", "{head}");
    assert_eq!(head["ContentType"], "application/json", "{head}");
    let (ok, _, err) = s3.aws(&["s3", "cp", "s3://gzip/aws.json.gz", back.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&gz).unwrap());
    let out = s3.boto3(&format!(
        r#"
import gzip
body = open({gz_path:?}, 'rb').read()
s3.put_object(Bucket='gzip', Key='boto.json.gz', Body=body, ContentEncoding='gzip')
out = {{}}
for key in ['aws.json.gz', 'boto.json.gz']:
    got = s3.get_object(Bucket='gzip', Key=key)
    raw = got['Body'].read()
    out[key] = [got.get('ContentEncoding'), raw == body, gzip.decompress(raw)[:12].decode()]
print(json.dumps(out))
"#
    ));
    for key in ["aws.json.gz", "boto.json.gz"] {
        assert_eq!(
            out[key],
            serde_json::json!(["gzip", true, "{\"photos\": ["]),
            "{key}"
        );
    }
}
