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
import datetime, subprocess, time
admin = client('ndpipe-admin', 's3cret')
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
    'refused': refused, 'presigned_get': got.decode(), 'presigned_put': status,
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
    assert_eq!(out["presigned_get"], "kept");
    assert_eq!(out["presigned_put"], "200");
    assert_eq!(out["late"], true, "an expired presigned URL is refused");
    assert_eq!(out["kept"], "kept", "no refused write changed the object");
    assert_eq!(out["keys"], serde_json::json!(["a.txt", "b.json"]));
    assert_eq!(out["buckets"], serde_json::json!(["safe"]));
}
