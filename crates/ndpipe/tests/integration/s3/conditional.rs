//! Conditional requests with boto3, on a photo and on a plain object each: GET and HEAD answer
//! 304 or 412 as S3 orders If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since
//! (a 304 with its ETag and Last-Modified and no body); PUT and CompleteMultipartUpload create
//! only (`If-None-Match: *`) or replace only (`If-Match`); CopyObject checks its source's
//! `x-amz-copy-source-if-*` and its destination's `If-None-Match`; and writers racing to
//! create or replace one key have exactly one winner, whose bytes are the object's, with
//! nothing left of the others.

use std::path::Path;

use serde_json::json;

use super::S3Store;
use crate::common::jpeg;

/// `outcome(f)`: `f` run, as `[HTTP status, error code]` (`[200, None]` when it succeeds).
const OUTCOME: &str = r#"
import datetime, socket, threading, urllib.parse
def outcome(f):
    try:
        f()
        return [200, None]
    except botocore.exceptions.ClientError as e:
        return [e.response['ResponseMetadata']['HTTPStatusCode'], e.response['Error'].get('Code')]
DAY = datetime.timedelta(days=1)
"#;

/// Writers racing on key `{photo,plain}/key` of bucket `race` through `ENDPOINTS` in turn:
/// eight create it with `If-None-Match: *` from `PHOTOS[..8]` or `PLAIN[..8]`, then eight
/// replace it with `If-Match` and the winner's ETag from the next eight. For each race: how
/// many won and were refused (412 `PreconditionFailed`), any other outcome, and whether every
/// endpoint reads the winner's bytes back.
pub(crate) const RACE: &str = r#"
def race(key, bodies, **condition):
    clients = [client(endpoint=ENDPOINTS[i % len(ENDPOINTS)]) for i in range(len(bodies))]
    start = threading.Barrier(len(bodies))
    results = [None] * len(bodies)
    def put(i):
        start.wait(timeout=120)
        results[i] = outcome(lambda: clients[i].put_object(Bucket='race', Key=key, Body=bodies[i], **condition))
    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    won = [i for i, r in enumerate(results) if r == [200, None]]
    refused = sum(r == [412, 'PreconditionFailed'] for r in results)
    others = [r for r in results if r not in ([200, None], [412, 'PreconditionFailed'])]
    read = [client(endpoint=e).get_object(Bucket='race', Key=key)['Body'].read() for e in ENDPOINTS]
    winner_read = len(won) == 1 and all(b == bodies[won[0]] for b in read)
    return {'won': len(won), 'refused': refused, 'others': others, 'winner_read': winner_read}
s3.create_bucket(Bucket='race')
out = {}
for kind, bodies in [('photo', PHOTOS), ('plain', PLAIN)]:
    key = f'{kind}/key'
    created = race(key, bodies[:8], IfNoneMatch='*')
    etag = s3.head_object(Bucket='race', Key=key)['ETag']
    out[kind] = {'create': created, 'replace': race(key, bodies[8:], IfMatch=etag)}
print(json.dumps(out))
"#;

/// What each race of [`RACE`] must give.
pub(crate) fn one_winner_each(out: &serde_json::Value) {
    let one = json!({"won": 1, "refused": 7, "others": [], "winner_read": true});
    for kind in ["photo", "plain"] {
        for race in ["create", "replace"] {
            assert_eq!(out[kind][race], one, "{kind} {race}: {out}");
        }
    }
}

/// [`RACE`]'s inputs: `PHOTOS`, sixteen distinct JPEGs written under `dir`, and `PLAIN`,
/// sixteen distinct plain bodies.
pub(crate) fn race_inputs(dir: &Path) -> String {
    let paths: Vec<String> = (0..16u32)
        .map(|i| {
            let path = dir.join(format!("racer-{i}.jpg"));
            std::fs::write(&path, jpeg(64, 48, 100 + i)).unwrap();
            path.to_str().unwrap().to_string()
        })
        .collect();
    format!(
        "{OUTCOME}PHOTOS = [open(p, 'rb').read() for p in {paths:?}]\n\
         PLAIN = [f'plain object {{i}}'.encode() for i in range(16)]\n"
    )
}

/// The bucket `cond` with a plain object `a.json` and a photo `cat.jpg` (from `photo`).
fn two_kinds(photo: &Path) -> String {
    format!(
        "{OUTCOME}PHOTO = open({:?}, 'rb').read()\n\
         s3.create_bucket(Bucket='cond')\n\
         s3.put_object(Bucket='cond', Key='a.json', Body=b'{{\"a\": 1}}')\n\
         s3.put_object(Bucket='cond', Key='cat.jpg', Body=PHOTO)\n",
        photo.to_str().unwrap()
    )
}

#[tokio::test]
async fn get_and_head_answer_304_and_412_in_s3_order() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let photo = work.path().join("cat.jpg");
    std::fs::write(&photo, jpeg(64, 48, 1)).unwrap();
    let script = r#"
out = {}
for key in ['a.json', 'cat.jpg']:
    head = s3.head_object(Bucket='cond', Key=key)
    etag, lm = head['ETag'], head['LastModified']
    get = lambda **kw: lambda: s3.get_object(Bucket='cond', Key=key, **kw)['Body'].read()
    hd = lambda **kw: lambda: s3.head_object(Bucket='cond', Key=key, **kw)
    cases = {
        'match': get(IfMatch=etag),
        'match_unquoted': get(IfMatch=etag.strip('"')),
        'match_any': get(IfMatch='*'),
        'match_list': get(IfMatch='"0", ' + etag),
        'match_other': get(IfMatch='"0"'),
        'match_weak': get(IfMatch='W/' + etag),
        'none_match': get(IfNoneMatch=etag),
        'none_match_weak': get(IfNoneMatch='W/' + etag),
        'none_match_any': get(IfNoneMatch='*'),
        'none_match_other': get(IfNoneMatch='"0"'),
        'modified_since_then': get(IfModifiedSince=lm),
        'modified_since_before': get(IfModifiedSince=lm - DAY),
        'unmodified_since_then': get(IfUnmodifiedSince=lm),
        'unmodified_since_before': get(IfUnmodifiedSince=lm - DAY),
        'match_beats_unmodified_since': get(IfMatch=etag, IfUnmodifiedSince=lm - DAY),
        'none_match_beats_modified_since': get(IfNoneMatch=etag, IfModifiedSince=lm - DAY),
        'head_match_other': hd(IfMatch='"0"'),
        'head_none_match': hd(IfNoneMatch=etag),
        'head_modified_since_then': hd(IfModifiedSince=lm),
        'head_unmodified_since_before': hd(IfUnmodifiedSince=lm - DAY),
    }
    out[key] = {name: outcome(f)[0] for name, f in cases.items()}
    # The 304 on the wire: its ETag and Last-Modified, and not one byte of body.
    host = urllib.parse.urlparse(ENDPOINT)
    with socket.create_connection((host.hostname, host.port)) as conn:
        conn.sendall(f'GET /cond/{key} HTTP/1.1\r\nHost: {host.netloc}\r\nIf-None-Match: {etag}\r\nConnection: close\r\n\r\n'.encode())
        raw = b''
        while chunk := conn.recv(65536):
            raw += chunk
    status, _, body = raw.partition(b'\r\n\r\n')
    lines = status.decode().split('\r\n')
    fields = {l.split(':', 1)[0].lower(): l.split(':', 1)[1].strip() for l in lines[1:]}
    out[key]['wire'] = [lines[0], fields.get('etag') == etag,
                        fields.get('last-modified') == head['ResponseMetadata']['HTTPHeaders']['last-modified'], body.decode()]
print(json.dumps(out))
"#;
    let out = s3.boto3(&format!("{}{script}", two_kinds(&photo)));
    let want = json!({
        "match": 200, "match_unquoted": 200, "match_any": 200, "match_list": 200,
        "match_other": 412, "match_weak": 412,
        "none_match": 304, "none_match_weak": 304, "none_match_any": 304, "none_match_other": 200,
        "modified_since_then": 304, "modified_since_before": 200,
        "unmodified_since_then": 200, "unmodified_since_before": 412,
        "match_beats_unmodified_since": 200, "none_match_beats_modified_since": 304,
        "head_match_other": 412, "head_none_match": 304,
        "head_modified_since_then": 304, "head_unmodified_since_before": 412,
        "wire": ["HTTP/1.1 304 Not Modified", true, true, ""],
    });
    for key in ["a.json", "cat.jpg"] {
        assert_eq!(out[key], want, "{key}");
    }
}

#[tokio::test]
async fn puts_and_completed_uploads_create_only_or_replace_only() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let (first, second) = (work.path().join("1.jpg"), work.path().join("2.jpg"));
    std::fs::write(&first, jpeg(64, 48, 1)).unwrap();
    std::fs::write(&second, jpeg(64, 48, 2)).unwrap();
    let script = format!(
        r#"{OUTCOME}
s3.create_bucket(Bucket='writes')
put = lambda key, body, **kw: lambda: s3.put_object(Bucket='writes', Key=key, Body=body, **kw)
body = lambda key: s3.get_object(Bucket='writes', Key=key)['Body'].read()
etag = lambda key: s3.head_object(Bucket='writes', Key=key)['ETag']
out = {{}}
out['create'] = outcome(put('lock', b'first', IfNoneMatch='*'))
out['create_again'] = outcome(put('lock', b'second', IfNoneMatch='*'))
out['kept'] = body('lock') == b'first'
first = etag('lock')
out['replace_other'] = outcome(put('lock', b'third', IfMatch='"0123"'))
out['replace_weak'] = outcome(put('lock', b'third', IfMatch='W/' + first))
out['replace'] = outcome(put('lock', b'fourth', IfMatch=first))
out['replace_stale'] = outcome(put('lock', b'fifth', IfMatch=first))
out['replace_any'] = outcome(put('lock', b'sixth', IfMatch='*'))
out['replaced'] = body('lock') == b'sixth'
out['replace_missing'] = outcome(put('nothing', b'x', IfMatch=first))
out['replace_any_missing'] = outcome(put('nothing', b'x', IfMatch='*'))
out['both_missing'] = outcome(put('nothing', b'x', IfMatch='*', IfNoneMatch='*'))
out['both_existing'] = outcome(put('lock', b'x', IfMatch='*', IfNoneMatch='*'))
out['none_match_tag'] = outcome(put('lock', b'x', IfNoneMatch=first))
out['missing_stays'] = outcome(lambda: s3.head_object(Bucket='writes', Key='nothing'))
out['kept_again'] = body('lock') == b'sixth'
out['photo'] = outcome(put('cat.jpg', open({first:?}, 'rb').read(), IfNoneMatch='*'))
out['photo_again'] = outcome(put('cat.jpg', open({second:?}, 'rb').read(), IfNoneMatch='*'))
out['photo_kept'] = body('cat.jpg') == open({first:?}, 'rb').read()
def upload(key, data):
    up = s3.create_multipart_upload(Bucket='writes', Key=key)['UploadId']
    part = s3.upload_part(Bucket='writes', Key=key, UploadId=up, PartNumber=1, Body=data)
    parts = {{'Parts': [{{'PartNumber': 1, 'ETag': part['ETag']}}]}}
    return lambda **kw: lambda: s3.complete_multipart_upload(Bucket='writes', Key=key, UploadId=up, MultipartUpload=parts, **kw), up
complete, up = upload('lock', b'parts')
out['complete_existing'] = outcome(complete(IfNoneMatch='*'))
out['upload_stays'] = len(s3.list_parts(Bucket='writes', Key='lock', UploadId=up)['Parts'])
out['complete_stale'] = outcome(complete(IfMatch=first))
out['complete_if_match'] = outcome(complete(IfMatch=etag('lock')))
out['completed'] = body('lock') == b'parts'
complete, _ = upload('new.bin', b'new parts')
out['complete_new'] = outcome(complete(IfNoneMatch='*'))
out['keys'] = [o['Key'] for o in s3.list_objects_v2(Bucket='writes')['Contents']]
print(json.dumps(out))
"#,
        first = first.to_str().unwrap(),
        second = second.to_str().unwrap(),
    );
    let out = s3.boto3(&script);
    let (ok, failed, missing) = (
        json!([200, null]),
        json!([412, "PreconditionFailed"]),
        json!([404, "NoSuchKey"]),
    );
    let want = json!({
        "create": ok, "create_again": failed, "kept": true,
        "replace_other": failed, "replace_weak": failed, "replace": ok, "replace_stale": failed,
        "replace_any": ok, "replaced": true,
        "replace_missing": missing, "replace_any_missing": missing,
        "both_missing": missing, "both_existing": failed,
        "none_match_tag": [501, "NotImplemented"],
        "missing_stays": [404, "404"], "kept_again": true,
        "photo": ok, "photo_again": failed, "photo_kept": true,
        "complete_existing": failed, "upload_stays": 1, "complete_stale": failed,
        "complete_if_match": ok, "completed": true, "complete_new": ok,
        "keys": ["cat.jpg", "lock", "new.bin"],
    });
    assert_eq!(out, want);
    let photos = s3.inst.json("/v1/photos").await;
    assert_eq!(
        photos["photos"].as_array().unwrap().len(),
        1,
        "the refused photo left nothing: {photos}"
    );
    assert_eq!(
        s3.inst.plain_object_files().len(),
        2,
        "one file for each of lock and new.bin: refused and replaced bodies are gone"
    );
}

#[tokio::test]
async fn copies_check_the_source_and_create_only_destinations() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let photo = work.path().join("cat.jpg");
    std::fs::write(&photo, jpeg(64, 48, 1)).unwrap();
    let script = r#"
s3.put_object(Bucket='cond', Key='taken', Body=b'taken')
out = {}
for src in ['a.json', 'cat.jpg']:
    head = s3.head_object(Bucket='cond', Key=src)
    etag, lm = head['ETag'], head['LastModified']
    copy = lambda dst, **kw: lambda: s3.copy_object(Bucket='cond', Key=dst, CopySource={'Bucket': 'cond', 'Key': src}, **kw)
    cases = {
        'if_match': dict(CopySourceIfMatch=etag),
        'if_match_other': dict(CopySourceIfMatch='"0"'),
        'if_none_match': dict(CopySourceIfNoneMatch=etag),
        'if_none_match_other': dict(CopySourceIfNoneMatch='"0"'),
        'if_modified_since_then': dict(CopySourceIfModifiedSince=lm),
        'if_modified_since_before': dict(CopySourceIfModifiedSince=lm - DAY),
        'if_unmodified_since_then': dict(CopySourceIfUnmodifiedSince=lm),
        'if_unmodified_since_before': dict(CopySourceIfUnmodifiedSince=lm - DAY),
        'match_beats_unmodified_since': dict(CopySourceIfMatch=etag, CopySourceIfUnmodifiedSince=lm - DAY),
        'none_match_false_modified_since_true': dict(CopySourceIfNoneMatch=etag, CopySourceIfModifiedSince=lm - DAY),
        'create_only_new': dict(IfNoneMatch='*'),
    }
    out[src] = {name: outcome(copy(f'{src}/{name}', **kw))[0] for name, kw in cases.items()}
    out[src]['create_only_taken'] = outcome(copy('taken', IfNoneMatch='*'))[0]
    out[src]['replace_only_missing'] = outcome(copy(f'{src}/missing', IfMatch='*'))[0]
    out[src]['copies'] = sorted(o['Key'].split('/', 1)[1] for o in s3.list_objects_v2(Bucket='cond', Prefix=src + '/')['Contents'])
out['taken'] = s3.get_object(Bucket='cond', Key='taken')['Body'].read().decode()
print(json.dumps(out))
"#;
    let out = s3.boto3(&format!("{}{script}", two_kinds(&photo)));
    let want = json!({
        "if_match": 200, "if_match_other": 412,
        "if_none_match": 412, "if_none_match_other": 200,
        "if_modified_since_then": 412, "if_modified_since_before": 200,
        "if_unmodified_since_then": 200, "if_unmodified_since_before": 412,
        "match_beats_unmodified_since": 200, "none_match_false_modified_since_true": 412,
        "create_only_new": 200, "create_only_taken": 412, "replace_only_missing": 404,
        "copies": [
            "create_only_new", "if_match", "if_modified_since_before", "if_none_match_other",
            "if_unmodified_since_then", "match_beats_unmodified_since",
        ],
    });
    for src in ["a.json", "cat.jpg"] {
        assert_eq!(out[src], want, "{src}");
    }
    assert_eq!(out["taken"], "taken");
    let photos = s3.inst.json("/v1/photos").await;
    assert_eq!(
        photos["photos"].as_array().unwrap().len(),
        7,
        "the photo and its six copies, nothing of the refused ones: {photos}"
    );
}

#[tokio::test]
async fn racing_conditional_puts_on_one_node_have_one_winner() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let out = s3.boto3(&format!("{}{RACE}", race_inputs(work.path())));
    one_winner_each(&out);
    let photos = s3.inst.json("/v1/photos").await;
    assert_eq!(
        photos["photos"].as_array().unwrap().len(),
        1,
        "only the last winner's photo is left: {photos}"
    );
    assert_eq!(s3.inst.plain_object_files().len(), 1);
}
