//! What the S3 API does not do, it refuses as AWS would, and stores nothing: every header of
//! the store's refusal table (`ndpipe_store::S3_REFUSALS`: encryption, object lock, ACLs,
//! storage classes, website redirects) on every operation it names; SigV2 and browser-form
//! POSTs, signed or on an open store; presigned URLs over 7 days; `DeleteObjects` over 1,000
//! keys; a copy onto itself without `REPLACE`. Every error carries its request id.

use serde_json::json as j;

use super::S3Store;

/// The table walk's operations (each on bucket `t`: `plain` exists, `mp` is an upload with
/// part 1) and the state a refused call must leave as it was.
const OPERATIONS: &str = r#"
s3.create_bucket(Bucket='tbl')
s3.put_object(Bucket='tbl', Key='plain', Body=b'plain')
up = s3.create_multipart_upload(Bucket='tbl', Key='mp')['UploadId']
part = s3.upload_part(Bucket='tbl', Key='mp', UploadId=up, PartNumber=1, Body=b'p')['ETag']
OPS = {
    'PutObject': lambda **kw: s3.put_object(Bucket='tbl', Key='new', Body=b'x', **kw),
    'CopyObject': lambda **kw: s3.copy_object(Bucket='tbl', Key='new', CopySource='tbl/plain', **kw),
    'CreateMultipartUpload': lambda **kw: s3.create_multipart_upload(Bucket='tbl', Key='new', **kw),
    'UploadPart': lambda **kw: s3.upload_part(Bucket='tbl', Key='mp', UploadId=up, PartNumber=2,
                                              Body=b'q', **kw),
    'UploadPartCopy': lambda **kw: s3.upload_part_copy(Bucket='tbl', Key='mp', UploadId=up,
                                                       PartNumber=3, CopySource='tbl/plain', **kw),
    'CompleteMultipartUpload': lambda **kw: s3.complete_multipart_upload(
        Bucket='tbl', Key='mp', UploadId=up,
        MultipartUpload={'Parts': [{'PartNumber': 1, 'ETag': part}]}, **kw),
    'CreateBucket': lambda **kw: s3.create_bucket(Bucket='new-bucket', **kw),
    'GetObject': lambda **kw: s3.get_object(Bucket='tbl', Key='plain', **kw)['Body'].read(),
    'HeadObject': lambda **kw: s3.head_object(Bucket='tbl', Key='plain', **kw),
}
extra = {}
def inject(request, **kw):
    for k, v in extra.items():
        request.headers[k] = v
s3.meta.events.register('before-sign.s3', inject)
def state():
    saved = dict(extra)
    extra.clear()
    try:
        return [[b['Name'] for b in s3.list_buckets()['Buckets']],
                [(o['Key'], o['ETag']) for o in s3.list_objects_v2(Bucket='tbl').get('Contents', [])],
                [u['Key'] for u in s3.list_multipart_uploads(Bucket='tbl').get('Uploads', [])],
                [p['PartNumber'] for p in s3.list_parts(Bucket='tbl', Key='mp', UploadId=up)['Parts']]]
    finally:
        extra.update(saved)
def call(op, headers={}, **kw):
    extra.clear()
    extra.update(headers)
    try:
        OPS[op](**kw)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
    finally:
        extra.clear()
def undo():
    for key in ['new']:
        s3.delete_object(Bucket='tbl', Key=key)
    for u in s3.list_multipart_uploads(Bucket='tbl').get('Uploads', []):
        if u['UploadId'] != up:
            s3.abort_multipart_upload(Bucket='tbl', Key=u['Key'], UploadId=u['UploadId'])
    if 'new-bucket' in state()[0]:
        s3.delete_bucket(Bucket='new-bucket')
"#;

#[tokio::test]
async fn every_refused_header_is_refused_on_its_operations_and_stores_nothing() {
    let s3 = S3Store::start(&[]);
    let rows: Vec<serde_json::Value> = ndpipe_store::S3_REFUSALS
        .iter()
        .map(|r| {
            j!({
                "headers": r.headers, "allowed": r.allowed, "operations": r.operations,
                "code": r.code, "status": r.status,
            })
        })
        .collect();
    let rows = serde_json::to_string(&rows).unwrap();
    let out = s3.boto3(&format!(
        r#"{OPERATIONS}
ROWS = json.loads({rows:?})
before = state()
wrong, walked, served = [], 0, 0
for row in ROWS:
    want = [row['code'], row['status']]
    for header in row['headers']:
        for op in row['operations']:
            got = call(op, {{header: 'refused-value'}})
            walked += 1
            if got != (want if op != 'HeadObject' else [str(row['status']), row['status']]):
                wrong.append([header, op, got, want])
            if state() != before:
                wrong.append([header, op, 'changed', state()])
            for value in row['allowed']:
                got = call(op, {{header: value}})
                served += 1
                if got != 'ok':
                    wrong.append([header, op, value, got])
                undo()
key = b'k' * 32
ssec = {{'SSECustomerAlgorithm': 'AES256', 'SSECustomerKey': key}}
clients = {{
    'ssec_put': call('PutObject', **ssec),
    'ssec_get_plain': call('GetObject', **ssec),
    'ssec_part': call('UploadPart', **ssec),
    'sse_s3': call('PutObject', ServerSideEncryption='AES256'),
    'sse_kms': call('CreateMultipartUpload', ServerSideEncryption='aws:kms', SSEKMSKeyId='k'),
    'glacier': call('CopyObject', StorageClass='GLACIER'),
    'public': call('PutObject', ACL='public-read'),
    'lock': call('PutObject', ObjectLockLegalHoldStatus='ON'),
    'lock_bucket': call('CreateBucket', ObjectLockEnabledForBucket=True),
    'redirect': call('PutObject', WebsiteRedirectLocation='/elsewhere'),
}}
print(json.dumps({{'wrong': wrong, 'walked': walked, 'served': served, 'clients': clients,
                  'same': state() == before, 'plain': s3.get_object(Bucket='tbl', Key='plain')['Body'].read().decode()}}))
"#
    ));
    assert_eq!(out["wrong"], j!([]), "{out}");
    assert!(out["walked"].as_u64().unwrap() > 50, "{out}");
    assert!(out["served"].as_u64().unwrap() >= 8, "allowed values work");
    let not_implemented = j!(["NotImplemented", 501]);
    assert_eq!(
        out["clients"],
        j!({
            "ssec_put": not_implemented, "ssec_part": not_implemented,
            "ssec_get_plain": ["InvalidRequest", 400],
            "sse_s3": not_implemented, "sse_kms": not_implemented, "glacier": not_implemented,
            "public": ["AccessControlListNotSupported", 400],
            "lock": ["InvalidRequest", 400], "lock_bucket": not_implemented,
            "redirect": not_implemented,
        })
    );
    assert_eq!((&out["same"], &out["plain"]), (&j!(true), &j!("plain")));
}

/// A script's SigV2 checks: a HMAC-SHA1 client (`AWS key:sig`) and a V2 presigned URL
/// (`AWSAccessKeyId`, `Signature`) with `key` and `secret`, each an `InvalidRequest`.
fn sigv2_script(key: &str, secret: &str) -> String {
    format!(
        r#"
import urllib.request
v2 = boto3.client('s3', endpoint_url=ENDPOINT, region_name='us-east-1', aws_access_key_id='{key}',
    aws_secret_access_key='{secret}', config=Config(signature_version='s3',
    s3={{'addressing_style': 'path'}}, retries={{'max_attempts': 1}}))
def code(f):
    try:
        f()
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
def fetch(url, data=None, headers={{}}, method=None):
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers,
                                                      method=method))
        return 'ok'
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        return [body.split('<Code>')[1].split('</Code>')[0], e.code, 'AWS4-HMAC-SHA256' in body]
def sigv2():
    v2_url = v2.generate_presigned_url('get_object', Params={{'Bucket': 'bkt', 'Key': 'a.txt'}})
    assert 'AWSAccessKeyId=' in v2_url and 'Signature=' in v2_url, v2_url
    return {{
        'put': code(lambda: v2.put_object(Bucket='bkt', Key='v2.txt', Body=b'v2')),
        'get': code(lambda: v2.get_object(Bucket='bkt', Key='a.txt')),
        'list': code(lambda: v2.list_objects(Bucket='bkt')),
        'presigned': fetch(v2_url),
    }}
def form(fields):
    boundary = 'ndpipeform'
    body = b''
    for name, value in fields:
        body += b'--%s\r\nContent-Disposition: form-data; name="%s"' % (boundary.encode(), name.encode())
        body += b'; filename="f.txt"\r\n\r\n' if name == 'file' else b'\r\n\r\n'
        body += value.encode() + b'\r\n'
    body += b'--%s--\r\n' % boundary.encode()
    return fetch(ENDPOINT + '/bkt', body, {{'Content-Type': 'multipart/form-data; boundary=' + boundary}})
"#
    )
}

#[tokio::test]
async fn sigv2_and_browser_form_posts_are_refused_signed_or_on_an_open_store() {
    let keyed = S3Store::start(&["--token", "s3cret"]);
    let out = keyed.boto3(&format!(
        r#"{}
admin = client('ndpipe-admin', 's3cret')
admin.create_bucket(Bucket='bkt')
admin.put_object(Bucket='bkt', Key='a.txt', Body=b'kept')
post = admin.generate_presigned_post('bkt', 'posted.txt')
refused = sigv2()
refused['form'] = form(list(post['fields'].items()) + [('file', 'posted')])
print(json.dumps({{'refused': refused,
    'keys': [o['Key'] for o in admin.list_objects_v2(Bucket='bkt')['Contents']]}}))
"#,
        sigv2_script("ndpipe-admin", "s3cret")
    ));
    let v2 = j!(["InvalidRequest", 400]);
    let v2_raw = j!(["InvalidRequest", 400, true]);
    let form = j!(["NotImplemented", 501, false]);
    let refused = j!({"put": v2, "get": v2, "list": v2, "presigned": v2_raw, "form": form});
    assert_eq!(out["refused"], refused, "with keys");
    assert_eq!(out["keys"], j!(["a.txt"]), "nothing was stored");

    let open = S3Store::start(&[]);
    let out = open.boto3(&format!(
        r#"{}
s3.create_bucket(Bucket='bkt')
s3.put_object(Bucket='bkt', Key='a.txt', Body=b'kept')
refused = sigv2()
refused['form'] = form([('key', 'posted.txt'), ('file', 'posted')])
print(json.dumps({{'refused': refused, 'anonymous': s3.get_object(Bucket='bkt', Key='a.txt')['Body'].read().decode(),
    'keys': [o['Key'] for o in s3.list_objects_v2(Bucket='bkt')['Contents']]}}))
"#,
        sigv2_script("anyone", "anything")
    ));
    assert_eq!(out["refused"], refused, "on an open store");
    assert_eq!(out["anonymous"], "kept", "unsigned requests still work");
    assert_eq!(out["keys"], j!(["a.txt"]), "nothing was stored");
}

#[tokio::test]
async fn presigned_urls_over_seven_days_are_refused() {
    let s3 = S3Store::start(&["--token", "s3cret"]);
    let out = s3.boto3(
        r#"
import urllib.request
admin = client('ndpipe-admin', 's3cret')
admin.create_bucket(Bucket='bkt')
admin.put_object(Bucket='bkt', Key='a.txt', Body=b'kept')
def fetch(url, data=None):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=data, method='PUT' if data else 'GET')).status
    except urllib.error.HTTPError as e:
        return [e.read().decode().split('<Code>')[1].split('</Code>')[0], e.code]
week = 7 * 24 * 3600
get = lambda s: admin.generate_presigned_url('get_object', Params={'Bucket': 'bkt', 'Key': 'a.txt'}, ExpiresIn=s)
put = admin.generate_presigned_url('put_object', Params={'Bucket': 'bkt', 'Key': 'late.txt'}, ExpiresIn=week + 1)
print(json.dumps({'week': fetch(get(week)), 'longer': fetch(get(week + 1)), 'put': fetch(put, b'late'),
                  'keys': [o['Key'] for o in admin.list_objects_v2(Bucket='bkt')['Contents']]}))
"#,
    );
    let refused = j!(["AuthorizationQueryParametersError", 400]);
    assert_eq!(out["week"], 200, "7 days is the longest AWS allows");
    assert_eq!(out["longer"], refused);
    assert_eq!(out["put"], refused);
    assert_eq!(out["keys"], j!(["a.txt"]));
}

#[tokio::test]
async fn delete_objects_over_1000_keys_is_malformed_and_deletes_nothing() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
s3.create_bucket(Bucket='bkt')
for k in ['k1', 'k2']:
    s3.put_object(Bucket='bkt', Key=k, Body=b'x')
keys = ['k1', 'k2'] + ['missing-%d' % i for i in range(999)]
try:
    s3.delete_objects(Bucket='bkt', Delete={'Objects': [{'Key': k} for k in keys]})
    refused = 'ok'
except botocore.exceptions.ClientError as e:
    refused = [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
left = [o['Key'] for o in s3.list_objects_v2(Bucket='bkt')['Contents']]
done = s3.delete_objects(Bucket='bkt', Delete={'Objects': [{'Key': k} for k in keys[:1000]]})
print(json.dumps({'refused': refused, 'left': left, 'deleted': len(done['Deleted']),
                  'after': s3.list_objects_v2(Bucket='bkt')['KeyCount']}))
"#,
    );
    assert_eq!(out["refused"], j!(["MalformedXML", 400]), "1001 keys");
    assert_eq!(out["left"], j!(["k1", "k2"]), "nothing was deleted");
    assert_eq!(
        (out["deleted"].as_u64(), out["after"].as_u64()),
        (Some(1000), Some(0))
    );
}

#[tokio::test]
async fn a_copy_onto_itself_needs_replaced_metadata() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
s3.create_bucket(Bucket='bkt')
s3.put_object(Bucket='bkt', Key='k', Body=b'x', Metadata={'v': '1'}, ContentType='text/plain')
try:
    s3.copy_object(Bucket='bkt', Key='k', CopySource='bkt/k')
    refused = 'ok'
except botocore.exceptions.ClientError as e:
    refused = [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode'],
               'without changing' in e.response['Error']['Message']]
kept = s3.head_object(Bucket='bkt', Key='k')
s3.copy_object(Bucket='bkt', Key='k', CopySource='bkt/k', MetadataDirective='REPLACE',
               Metadata={'v': '2'}, ContentType='text/csv')
replaced = s3.head_object(Bucket='bkt', Key='k')
print(json.dumps({'refused': refused, 'kept': [kept['Metadata'], kept['ContentType']],
                  'replaced': [replaced['Metadata'], replaced['ContentType'],
                               s3.get_object(Bucket='bkt', Key='k')['Body'].read().decode()]}))
"#,
    );
    assert_eq!(out["refused"], j!(["InvalidRequest", 400, true]));
    assert_eq!(
        out["kept"],
        j!([{"v": "1"}, "text/plain"]),
        "nothing changed"
    );
    assert_eq!(out["replaced"], j!([{"v": "2"}, "text/csv", "x"]));
}

#[tokio::test]
async fn every_error_carries_its_request_id_in_the_body_and_the_header() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
import urllib.request
s3.create_bucket(Bucket='bkt')
def ids(url, method='GET', headers={}):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers))
        return [r.headers.get('x-amz-request-id'), None]
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        inside = body.split('<RequestId>')[1].split('</RequestId>')[0] if '<RequestId>' in body else None
        return [e.headers.get('x-amz-request-id'), inside]
print(json.dumps({
    'missing': [ids(ENDPOINT + '/bkt/missing') for _ in range(2)],
    'bad_bucket': ids(ENDPOINT + '/B_A_D/k'),
    'sigv2': ids(ENDPOINT + '/bkt/k', headers={'Authorization': 'AWS a:b'}),
    'ok': ids(ENDPOINT + '/bkt'),
    'head': ids(ENDPOINT + '/bkt/missing', 'HEAD'),
    'boto3': s3.list_objects_v2(Bucket='bkt')['ResponseMetadata'].get('RequestId'),
}))
"#,
    );
    let pair = |v: &serde_json::Value| {
        let (header, body) = (v[0].as_str(), v[1].as_str());
        assert!(header.is_some_and(|h| h.len() == 16), "{v}");
        assert_eq!(header, body, "one id in the header and the body: {v}");
        header.unwrap().to_string()
    };
    let first = pair(&out["missing"][0]);
    assert_ne!(first, pair(&out["missing"][1]), "one id per request");
    pair(&out["bad_bucket"]);
    pair(&out["sigv2"]);
    assert!(out["ok"][0].as_str().is_some_and(|h| h.len() == 16));
    assert!(out["head"][0].as_str().is_some_and(|h| h.len() == 16));
    assert!(out["boto3"].as_str().is_some_and(|h| h.len() == 16));
}
