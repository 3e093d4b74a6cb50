//! Photos through S3: a large JPEG uploaded in parts (aws s3 cp, boto3) and parts that do not
//! match, labels as tags and metadata with the real model, and bad images refused with nothing
//! stored.

use std::path::Path;

use super::S3Store;
use crate::api::png_bomb;
use crate::common::{jpeg, sample, sha256};

/// A JPEG of pseudo-random noise (it compresses badly): about 1.5 bytes a pixel.
fn noisy_jpeg(width: u32, height: u32) -> Vec<u8> {
    let mut state = 0x2545_f491_u32;
    let img = image::RgbImage::from_fn(width, height, |_, _| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let [a, b, c, _] = state.to_le_bytes();
        image::Rgb([a, b, c])
    });
    let mut out = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut out),
        image::ImageFormat::Jpeg,
    )
    .unwrap();
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_large_jpeg_in_parts_becomes_one_photo_and_parts_that_do_not_match_store_nothing() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let big = noisy_jpeg(3400, 3000);
    assert!(big.len() > 10 << 20, "{} bytes is not large", big.len());
    let path = write(work.path(), "big.jpg", &big);
    let (ok, _, err) = s3.aws(&["s3", "mb", "s3://big"]);
    assert!(ok, "{err}");
    let (ok, _, err) = s3.aws(&["s3", "cp", &path, "s3://big/aws.jpg"]);
    assert!(ok, "multipart cp: {err}");
    let (ok, out, err) = s3.aws(&[
        "s3api",
        "head-object",
        "--bucket",
        "big",
        "--key",
        "aws.jpg",
    ]);
    assert!(ok, "{err}");
    let head: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(head["ETag"].as_str().unwrap().ends_with("-2\""), "{head}");
    let back = work.path().join("back.jpg");
    let (ok, _, err) = s3.aws(&["s3", "cp", "s3://big/aws.jpg", back.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(sha256(&std::fs::read(&back).unwrap()), sha256(&big));

    let out = s3.boto3(&format!(
        r#"
import hashlib
data = open({path:?}, 'rb').read()
MiB = 1 << 20
def error(f):
    try:
        f()
    except botocore.exceptions.ClientError as e:
        return e.response['Error']['Code']
up = s3.create_multipart_upload(Bucket='big', Key='boto.jpg', ContentType='image/jpeg')['UploadId']
chunks = [data[:5 * MiB], data[5 * MiB:10 * MiB], data[10 * MiB:]]
etags = [s3.upload_part(Bucket='big', Key='boto.jpg', UploadId=up, PartNumber=i + 1, Body=c)['ETag']
         for i, c in enumerate(chunks)]
listed = s3.list_parts(Bucket='big', Key='boto.jpg', UploadId=up)['Parts']
extra = [s3.create_multipart_upload(Bucket='big', Key=f'z{{i}}')['UploadId'] for i in range(2)]
uploads = [u['Key'] for u in s3.list_multipart_uploads(Bucket='big').get('Uploads', [])]
first = s3.list_multipart_uploads(Bucket='big', MaxUploads=2)
rest = s3.list_multipart_uploads(Bucket='big', KeyMarker=first['NextKeyMarker'],
                                 UploadIdMarker=first['NextUploadIdMarker'])
paged = [[u['Key'] for u in p.get('Uploads', [])] for p in (first, rest)] + [first['IsTruncated']]
for i, e in enumerate(extra):
    s3.abort_multipart_upload(Bucket='big', Key=f'z{{i}}', UploadId=e)
parts = lambda pairs: {{'Parts': [{{'PartNumber': n, 'ETag': e}} for n, e in pairs]}}
done = lambda pairs: s3.complete_multipart_upload(Bucket='big', Key='boto.jpg', UploadId=up,
                                                  MultipartUpload=parts(pairs))
wrong_etag = error(lambda: done([(1, etags[0]), (2, etags[0]), (3, etags[2])]))
wrong_order = error(lambda: done([(2, etags[1]), (1, etags[0]), (3, etags[2])]))
missing = error(lambda: done([(1, etags[0]), (4, etags[2])]))
small_first = error(lambda: done([(3, etags[2]), (4, etags[2])]))
after_refusals = s3.list_objects_v2(Bucket='big', Prefix='boto')['KeyCount']
etag = done([(1, etags[0]), (2, etags[1]), (3, etags[2])])['ETag']
want = hashlib.md5(b''.join(hashlib.md5(c).digest() for c in chunks)).hexdigest() + '-3'
got = s3.get_object(Bucket='big', Key='boto.jpg')['Body'].read()
gone = s3.create_multipart_upload(Bucket='big', Key='gone.bin')['UploadId']
s3.upload_part(Bucket='big', Key='gone.bin', UploadId=gone, PartNumber=1, Body=b'x')
s3.abort_multipart_upload(Bucket='big', Key='gone.bin', UploadId=gone)
aborted = error(lambda: s3.list_parts(Bucket='big', Key='gone.bin', UploadId=gone))
print(json.dumps({{
    'listed': [[p['PartNumber'], p['Size'], p['ETag'] == etags[i]] for i, p in enumerate(listed)],
    'uploads': uploads, 'paged': paged, 'refused': [wrong_etag, wrong_order, missing, small_first],
    'after_refusals': after_refusals, 'etag': etag == '"%s"' % want, 'same': got == data,
    'aborted': aborted,
}}))
"#
    ));
    let tail = big.len() - (10 << 20);
    assert_eq!(
        out["listed"],
        serde_json::json!([[1, 5 << 20, true], [2, 5 << 20, true], [3, tail, true]])
    );
    assert_eq!(out["uploads"], serde_json::json!(["boto.jpg", "z0", "z1"]));
    assert_eq!(
        out["paged"],
        serde_json::json!([["boto.jpg", "z0"], ["z1"], true])
    );
    assert_eq!(
        out["refused"],
        serde_json::json!([
            "InvalidPart",
            "InvalidPartOrder",
            "InvalidPart",
            "EntityTooSmall"
        ])
    );
    assert_eq!(
        out["after_refusals"], 0,
        "refused completions store nothing"
    );
    assert_eq!(
        (out["etag"].as_bool(), out["same"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(out["aborted"], "NoSuchUpload");
    let photos = s3.inst.json("/v1/photos").await["photos"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(photos, 2, "each completed JPEG is one photo");
}

#[tokio::test]
async fn bad_uploads_are_refused_with_s3_errors_and_nothing_is_stored() {
    let s3 = S3Store::start(&["--max-upload-bytes", "200000"]);
    let work = tempfile::tempdir().unwrap();
    let good = jpeg(64, 48, 3);
    let truncated = write(work.path(), "cut.jpg", &good[..good.len() / 2]);
    let bomb = write(work.path(), "bomb.png", &png_bomb(60_000, 60_000));
    let out = s3.boto3(&format!(
        r#"
import urllib.request
s3.create_bucket(Bucket='bad')
def put(body, **kw):
    try:
        s3.put_object(Bucket='bad', Key='k', Body=body, **kw)
        return 'stored'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
def wrong_crc32():
    import subprocess
    out = subprocess.run(['curl', '-s', '-X', 'PUT', '-H', 'x-amz-checksum-crc32: AAAAAA==',
                          '--data-binary', 'sidecar', ENDPOINT + '/bad/k.json'],
                         capture_output=True).stdout.decode()
    return '<Code>BadDigest</Code>' in out
def unsigned_chunks():
    body = b'5\r\nhello\r\n0\r\n\r\n'
    req = urllib.request.Request(ENDPOINT + '/bad/c.bin', data=body, method='PUT', headers={{
        'x-amz-content-sha256': 'STREAMING-UNSIGNED-PAYLOAD-TRAILER',
        'content-encoding': 'aws-chunked', 'x-amz-decoded-content-length': '5'}})
    try:
        urllib.request.urlopen(req)
        return 'stored'
    except urllib.error.HTTPError as e:
        return e.code
def part_too_large():
    up = s3.create_multipart_upload(Bucket='bad', Key='big')['UploadId']
    try:
        s3.upload_part(Bucket='bad', Key='big', UploadId=up, PartNumber=1, Body=b'x' * 300000)
        return 'stored'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
    finally:
        s3.abort_multipart_upload(Bucket='bad', Key='big', UploadId=up)
print(json.dumps({{
    'text_as_jpeg': put(b'this is not a photo', ContentType='image/jpeg'),
    'truncated': put(open({truncated:?}, 'rb').read()),
    'bomb': put(open({bomb:?}, 'rb').read()),
    'label_on_text': put(b'{{}}', Metadata={{'ndpipe-label': 'cat'}}),
    'too_large': put(b'x' * 300000),
    'part_too_large': part_too_large(),
    'wrong_crc32': wrong_crc32(),
    'unsigned_chunks': unsigned_chunks(),
    'left': s3.list_objects_v2(Bucket='bad')['KeyCount'],
}}))
"#
    ));
    assert_eq!(
        out["text_as_jpeg"],
        serde_json::json!(["UnsupportedImageFormat", 415])
    );
    assert_eq!(out["truncated"], serde_json::json!(["TruncatedImage", 422]));
    assert_eq!(out["bomb"], serde_json::json!(["TooManyPixels", 413]));
    assert_eq!(
        out["label_on_text"],
        serde_json::json!(["InvalidArgument", 400])
    );
    let too_large = serde_json::json!(["EntityTooLarge", 413]);
    assert_eq!(out["too_large"], too_large, "over --max-upload-bytes");
    assert_eq!(out["part_too_large"], too_large);
    assert_eq!(
        out["wrong_crc32"], true,
        "a body that fails its checksum is BadDigest"
    );
    assert_eq!(out["left"], 0);
    assert_eq!(s3.inst.json("/healthz").await["photos"], 0);
    let blobs = std::fs::read_dir(s3.inst.data.join("objects"))
        .unwrap()
        .count();
    assert_eq!(blobs, 0, "no plain object was left behind");
}

#[tokio::test]
async fn an_image_put_is_labelled_and_its_labels_show_as_tags_and_metadata() {
    let s3 = S3Store::start_with_model();
    let work = tempfile::tempdir().unwrap();
    let cat = write(work.path(), "chelsea.png", &sample("chelsea.png"));
    let out = s3.boto3(&format!(
        r#"
import time
s3.create_bucket(Bucket='pets')
s3.put_object(Bucket='pets', Key='chelsea.png', Body=open({cat:?}, 'rb').read(),
              Metadata={{'ndpipe-label': 'cat', 'ndpipe-split': 'val', 'camera': 'x100'}})
for _ in range(600):
    tags = s3.get_object_tagging(Bucket='pets', Key='chelsea.png')['TagSet']
    if tags:
        break
    time.sleep(0.1)
head = s3.head_object(Bucket='pets', Key='chelsea.png')
s3.put_object_tagging(Bucket='pets', Key='chelsea.png',
                      Tagging={{'TagSet': [{{'Key': 'album', 'Value': 'home'}}]}})
both = s3.get_object_tagging(Bucket='pets', Key='chelsea.png')['TagSet']
print(json.dumps({{'tags': {{t['Key']: t['Value'] for t in tags}}, 'meta': head['Metadata'],
                  'both': {{t['Key']: t['Value'] for t in both}}}}))
"#
    ));
    // One tag pair per task: the general task's top label and its score.
    let label = out["tags"]["ndpipe-general"].as_str().unwrap_or_default();
    assert!(
        ["tabby", "tiger cat", "Egyptian cat"]
            .iter()
            .any(|cat| label.starts_with(cat)),
        "the cat photo's tag holds no cat: {out}"
    );
    assert!(
        out["tags"]["ndpipe-general-score"].as_str().is_some(),
        "{out}"
    );
    let labels = out["meta"]["ndpipe-labels"].as_str().unwrap();
    assert!(labels.starts_with(label), "{labels} vs {label}");
    assert_eq!(out["meta"]["ndpipe-labels-general"], labels, "{out}");
    assert_eq!(out["meta"]["camera"], "x100");
    let mut with_user_tag = out["tags"].clone();
    with_user_tag["album"] = "home".into();
    assert_eq!(
        out["both"], with_user_tag,
        "user tags sit beside the labels"
    );
    let id = s3.inst.json("/v1/photos").await["photos"][0]["id"]
        .as_u64()
        .unwrap();
    let meta = s3.inst.json(&format!("/v1/photos/{id}/meta")).await;
    assert_eq!(
        meta["ground_truth"],
        serde_json::json!({"task": "default", "label": "cat", "split": "val"})
    );
}
