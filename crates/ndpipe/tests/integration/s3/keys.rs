//! Access keys: `ndpipe keys` online and offline, then every call needs a key whose role
//! allows it, on `/v1` (bearer) and on S3 (SigV4); each refusal changes nothing, and a deleted
//! key stops working.

use super::S3Store;
use crate::common::{cli, jpeg};

fn create(s3: &S3Store, token: Option<&str>, name: &str, role: &str) -> (String, String) {
    let mut args = vec!["keys", "--server", &s3.inst.url];
    if let Some(t) = token {
        args.extend(["--token", t]);
    }
    args.extend(["create", "--name", name, "--role", role]);
    let (ok, out, err) = cli(&args);
    assert!(ok, "keys create {name}: {err}");
    let key: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        key["access_key"].as_str().unwrap().to_string(),
        key["secret_key"].as_str().unwrap().to_string(),
    )
}

async fn status(s3: &S3Store, method: reqwest::Method, path: &str, bearer: Option<&str>) -> u16 {
    let mut req = s3
        .inst
        .client()
        .request(method, format!("{}{path}", s3.inst.url));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    if path == "/v1/photos" {
        req = req.body(jpeg(32, 32, 1));
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn once_a_key_exists_every_call_needs_one_with_the_right_role() {
    let s3 = S3Store::start(&[]);
    let (_, admin) = create(&s3, None, "ops", "admin");
    let (read_id, read) = create(&s3, Some(&admin), "viewer", "read");
    let (write_id, write) = create(&s3, Some(&admin), "uploader", "write");
    let data = s3.inst.data.to_str().unwrap().to_string();
    let (ok, out, err) = cli(&[
        "keys", "--data", &data, "create", "--name", "cron", "--role", "read",
    ]);
    assert!(ok && out.contains("secret_key"), "offline create: {err}");
    let (ok, out, _) = cli(&["keys", "--server", &s3.inst.url, "--token", &admin, "list"]);
    let names: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["name"].to_string())
        .collect();
    assert!(
        ok && names == ["\"cron\"", "\"ops\"", "\"uploader\"", "\"viewer\""],
        "{out}"
    );
    assert!(
        !out.contains(&read) && !out.contains(&write),
        "a listing shows no secret"
    );

    use reqwest::Method;
    assert_eq!(status(&s3, Method::GET, "/healthz", None).await, 200);
    assert_eq!(status(&s3, Method::GET, "/v1/photos", None).await, 401);
    assert_eq!(status(&s3, Method::GET, "/metrics", None).await, 401);
    assert_eq!(
        status(&s3, Method::GET, "/v1/photos", Some("guess")).await,
        401
    );
    assert_eq!(
        status(&s3, Method::GET, "/v1/photos", Some(&read)).await,
        200
    );
    assert_eq!(
        status(&s3, Method::POST, "/v1/photos", Some(&read)).await,
        403
    );
    assert_eq!(
        status(&s3, Method::GET, "/v1/admin/keys", Some(&write)).await,
        403
    );
    assert_eq!(
        status(&s3, Method::POST, "/v1/photos", Some(&write)).await,
        201
    );

    let out = s3.boto3(&format!(
        r#"
def code(f):
    try:
        f()
        return 'ok'
    except botocore.exceptions.ClientError as e:
        return e.response['Error']['Code']
reader, writer = client({read_id:?}, {read:?}), client({write_id:?}, {write:?})
writer.create_bucket(Bucket='shared')
writer.put_object(Bucket='shared', Key='a.json', Body=b'1')
put = lambda c: lambda: c.put_object(Bucket='shared', Key='a.json', Body=b'changed')
print(json.dumps({{
    'reader_get': reader.get_object(Bucket='shared', Key='a.json')['Body'].read().decode(),
    'reader_put': code(put(reader)),
    'reader_delete': code(lambda: reader.delete_object(Bucket='shared', Key='a.json')),
    'anonymous_list': code(lambda: s3.list_objects_v2(Bucket='shared')),
    'unknown': code(put(client('NDPNOSUCHKEY', {write:?}))),
    'wrong_secret': code(put(client({write_id:?}, {read:?}))),
    'after': writer.get_object(Bucket='shared', Key='a.json')['Body'].read().decode(),
}}))
"#
    ));
    assert_eq!(out["reader_get"], "1");
    assert_eq!(out["reader_put"], "AccessDenied");
    assert_eq!(out["reader_delete"], "AccessDenied");
    assert_eq!(out["anonymous_list"], "AccessDenied");
    assert_eq!(out["unknown"], "InvalidAccessKeyId");
    assert_eq!(out["wrong_secret"], "SignatureDoesNotMatch");
    assert_eq!(out["after"], "1", "no refused call changed the object");

    let (ok, _, err) = cli(&[
        "keys",
        "--server",
        &s3.inst.url,
        "--token",
        &admin,
        "delete",
        "uploader",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        status(&s3, Method::POST, "/v1/photos", Some(&write)).await,
        401
    );
    let out = s3.boto3(&format!(
        r#"
try:
    client({write_id:?}, {write:?}).list_buckets()
    print(json.dumps('served'))
except botocore.exceptions.ClientError as e:
    print(json.dumps(e.response['Error']['Code']))
"#
    ));
    assert_eq!(out, "InvalidAccessKeyId", "a deleted key stops working");
}
