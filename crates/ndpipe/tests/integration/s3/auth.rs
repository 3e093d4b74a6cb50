//! With a token, the S3 API takes only requests signed with the admin key: anonymous calls,
//! unknown keys, wrong secrets, skewed clocks and expired presigned URLs are refused with S3's
//! errors and change nothing; presigned GET and PUT URLs work with curl.

use super::S3Store;

#[tokio::test]
async fn only_requests_signed_with_the_admin_key_are_served() {
    let s3 = S3Store::start(&["--token", "s3cret"]);
    let work = tempfile::tempdir().unwrap();
    let upload = work.path().join("up.json");
    std::fs::write(&upload, br#"{"sidecar": true}"#).unwrap();
    let out = s3.boto3(&format!(
        r#"
import base64, datetime, subprocess, time, urllib.request, zlib
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
admin = client('ndpipe-admin', 's3cret')
def chunked_put(key, data, crc, sign=True):
    body = b'%x\r\n' % len(data) + data + b'\r\n0\r\nx-amz-checksum-crc32:' + crc + b'\r\n\r\n'
    url = ENDPOINT + '/safe/' + key
    headers = {{'x-amz-content-sha256': 'STREAMING-UNSIGNED-PAYLOAD-TRAILER',
               'content-encoding': 'aws-chunked', 'x-amz-trailer': 'x-amz-checksum-crc32',
               'x-amz-decoded-content-length': str(len(data)), 'content-length': str(len(body))}}
    req = AWSRequest(method='PUT', url=url, data=body, headers=headers)
    if sign:
        SigV4Auth(Credentials('ndpipe-admin', 's3cret'), 's3', 'us-east-1').add_auth(req)
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body, method='PUT',
                                                      headers=dict(req.headers.items())))
        return 'ok'
    except urllib.error.HTTPError as e:
        return e.read().decode().split('<Code>')[1].split('</Code>')[0]
def crc32(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, 'big'))
def code(f):
    try:
        f()
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
admin.create_bucket(Bucket='safe')
admin.put_object(Bucket='safe', Key='a.txt', Body=b'kept')
put = lambda c: lambda: c.put_object(Bucket='safe', Key='a.txt', Body=b'changed')
refused = {{
    'anonymous_put': code(put(s3)),
    'anonymous_get': code(lambda: s3.get_object(Bucket='safe', Key='a.txt')),
    'unknown_key': code(put(client('nobody', 's3cret'))),
    'wrong_secret': code(put(client('ndpipe-admin', 'guess'))),
    'anonymous_mb': code(lambda: s3.create_bucket(Bucket='other')),
}}
trailer = {{
    'good': chunked_put('chunked.bin', b'hello trailer', crc32(b'hello trailer')),
    'bad': chunked_put('bad.bin', b'hello trailer', crc32(b'something else')),
}}
trailer['stored'] = admin.get_object(Bucket='safe', Key='chunked.bin')['Body'].read().decode()
real_now = botocore.auth.get_current_datetime
botocore.auth.get_current_datetime = lambda: real_now() - datetime.timedelta(minutes=20)
refused['skewed'] = code(put(admin))
botocore.auth.get_current_datetime = real_now
url = admin.generate_presigned_url('get_object', Params={{'Bucket': 'safe', 'Key': 'a.txt'}})
got = subprocess.run(['curl', '-s', url], capture_output=True).stdout
put_url = admin.generate_presigned_url('put_object', Params={{'Bucket': 'safe', 'Key': 'b.json'}})
status = subprocess.run(['curl', '-s', '-o', '/dev/null', '-w', '%{{http_code}}', '-T', {upload:?},
                         put_url], capture_output=True).stdout.decode()
short = admin.generate_presigned_url('put_object', Params={{'Bucket': 'safe', 'Key': 'late'}},
                                     ExpiresIn=1)
time.sleep(2)
late = subprocess.run(['curl', '-s', '-T', {upload:?}, short], capture_output=True).stdout.decode()
print(json.dumps({{
    'refused': refused, 'trailer': trailer, 'presigned_get': got.decode(), 'presigned_put': status,
    'late': 'AccessDenied' in late and 'expired' in late,
    'kept': admin.get_object(Bucket='safe', Key='a.txt')['Body'].read().decode(),
    'keys': [o['Key'] for o in admin.list_objects_v2(Bucket='safe')['Contents']],
    'buckets': [b['Name'] for b in admin.list_buckets()['Buckets']],
}}))
"#
    ));
    let denied = serde_json::json!(["AccessDenied", 403]);
    assert_eq!(out["refused"]["anonymous_put"], denied);
    assert_eq!(out["refused"]["anonymous_get"], denied);
    assert_eq!(out["refused"]["anonymous_mb"], denied);
    assert_eq!(
        out["refused"]["unknown_key"],
        serde_json::json!(["InvalidAccessKeyId", 403])
    );
    assert_eq!(
        out["refused"]["wrong_secret"],
        serde_json::json!(["SignatureDoesNotMatch", 403])
    );
    assert_eq!(
        out["refused"]["skewed"],
        serde_json::json!(["RequestTimeTooSkewed", 403])
    );
    assert_eq!(
        out["trailer"],
        serde_json::json!({"good": "ok", "bad": "BadDigest", "stored": "hello trailer"}),
        "an aws-chunked body is decoded and its trailing checksum verified"
    );
    assert_eq!(out["presigned_get"], "kept");
    assert_eq!(out["presigned_put"], "200");
    assert_eq!(out["late"], true, "an expired presigned URL is refused");
    assert_eq!(out["kept"], "kept", "no refused write changed the object");
    assert_eq!(
        out["keys"],
        serde_json::json!(["a.txt", "b.json", "chunked.bin"])
    );
    assert_eq!(out["buckets"], serde_json::json!(["safe"]));
}
