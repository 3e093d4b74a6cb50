//! The user's object tags: `x-amz-tagging` on PUT and CreateMultipartUpload, PutObjectTagging,
//! DeleteObjectTagging, CopyObject's tagging directive and `x-amz-tagging-count` on GET and
//! HEAD; a set past AWS's limits or on the labels' `ndpipe-` keys is 400 `InvalidTag` and
//! changes nothing. (Tags beside a photo's labels: `photos`.)

use super::S3Store;

#[tokio::test]
async fn user_tags_are_kept_replaced_copied_and_refused_past_the_limits() {
    let s3 = S3Store::start(&[]);
    let out = s3.boto3(
        r#"
def error(f, **kw):
    try:
        f(**kw)
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return [e.response['Error']['Code'], e.response['ResponseMetadata']['HTTPStatusCode']]
tags = lambda key: {t['Key']: t['Value'] for t in s3.get_object_tagging(Bucket='tags', Key=key)['TagSet']}
tag_set = lambda pairs: {'TagSet': [{'Key': k, 'Value': v} for k, v in pairs]}
put_tags = lambda key, pairs: s3.put_object_tagging(Bucket='tags', Key=key, Tagging=tag_set(pairs))
s3.create_bucket(Bucket='tags')
s3.put_object(Bucket='tags', Key='a.txt', Body=b'a', Tagging='team=blue&stage=draft%20one')
on_put = tags('a.txt')
counts = [s3.get_object(Bucket='tags', Key='a.txt').get('TagCount'),
          s3.head_object(Bucket='tags', Key='a.txt')['ResponseMetadata']['HTTPHeaders'].get('x-amz-tagging-count')]
put_tags('a.txt', [('team', 'red')])
replaced = tags('a.txt')
refused = {
    'eleven': error(put_tags, key='a.txt', pairs=[(str(i), '') for i in range(11)]),
    'long_key': error(put_tags, key='a.txt', pairs=[('k' * 129, 'v')]),
    'long_value': error(put_tags, key='a.txt', pairs=[('k', 'v' * 257)]),
    'twice': error(put_tags, key='a.txt', pairs=[('k', '1'), ('k', '2')]),
    'label_key': error(put_tags, key='a.txt', pairs=[('ndpipe-general', 'cat')]),
    'label_key_on_put': error(s3.put_object, Bucket='tags', Key='b.txt', Body=b'b', Tagging='ndpipe-x=1'),
    'no_object': error(put_tags, key='missing.txt', pairs=[('k', 'v')]),
}
unchanged = tags('a.txt')
limits_ok = error(put_tags, key='a.txt', pairs=[('k%d' % i + 'k' * 126, 'v' * 256) for i in range(10)])
at_limits = len(tags('a.txt'))
put_tags('a.txt', [('team', 'red')])
deleted = s3.delete_object_tagging(Bucket='tags', Key='a.txt')['ResponseMetadata']['HTTPStatusCode']
after_delete = [tags('a.txt'), s3.get_object(Bucket='tags', Key='a.txt').get('TagCount')]
s3.put_object(Bucket='tags', Key='src.txt', Body=b's', Tagging='k=v')
s3.copy_object(Bucket='tags', Key='copied.txt', CopySource={'Bucket': 'tags', 'Key': 'src.txt'})
s3.copy_object(Bucket='tags', Key='retagged.txt', CopySource={'Bucket': 'tags', 'Key': 'src.txt'},
               TaggingDirective='REPLACE', Tagging='n=m')
up = s3.create_multipart_upload(Bucket='tags', Key='mp.txt', Tagging='mp=yes')['UploadId']
etag = s3.upload_part(Bucket='tags', Key='mp.txt', UploadId=up, PartNumber=1, Body=b'm')['ETag']
s3.complete_multipart_upload(Bucket='tags', Key='mp.txt', UploadId=up,
                             MultipartUpload={'Parts': [{'ETag': etag, 'PartNumber': 1}]})
print(json.dumps({
    'on_put': on_put, 'counts': counts, 'replaced': replaced, 'refused': refused,
    'unchanged': unchanged,
    'limits_ok': limits_ok, 'at_limits': at_limits,
    'deleted': deleted, 'after_delete': after_delete,
    'b_stored': error(s3.head_object, Bucket='tags', Key='b.txt'),
    'copied': tags('copied.txt'), 'retagged': tags('retagged.txt'), 'mp': tags('mp.txt'),
}))
"#,
    );
    assert_eq!(
        out["on_put"],
        serde_json::json!({"team": "blue", "stage": "draft one"})
    );
    assert_eq!(out["counts"], serde_json::json!([2, "2"]));
    assert_eq!(out["replaced"], serde_json::json!({"team": "red"}));
    let invalid = serde_json::json!(["InvalidTag", 400]);
    for case in [
        "eleven",
        "long_key",
        "long_value",
        "twice",
        "label_key",
        "label_key_on_put",
    ] {
        assert_eq!(out["refused"][case], invalid, "{case}");
    }
    assert_eq!(
        out["refused"]["no_object"],
        serde_json::json!(["NoSuchKey", 404])
    );
    assert_eq!(
        out["unchanged"],
        serde_json::json!({"team": "red"}),
        "refusals change nothing"
    );
    assert_eq!(out["limits_ok"], "ok", "ten tags of 128 and 256 characters");
    assert_eq!(out["at_limits"], 10);
    assert_eq!(out["deleted"], 204);
    assert_eq!(out["after_delete"], serde_json::json!([{}, null]));
    assert_eq!(
        out["b_stored"],
        serde_json::json!(["404", 404]),
        "a PUT with refused tags stores nothing"
    );
    assert_eq!(out["copied"], serde_json::json!({"k": "v"}));
    assert_eq!(out["retagged"], serde_json::json!({"n": "m"}));
    assert_eq!(out["mp"], serde_json::json!({"mp": "yes"}));
}
