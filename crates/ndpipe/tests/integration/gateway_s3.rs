//! S3 through a gateway in front of three PipeStores on one PostgreSQL catalog with two copies
//! of everything, all real processes behind a cluster secret, driven by boto3: a photo, a
//! sidecar and a multipart upload put through the gateway read back byte for byte through the
//! gateway and every node's S3 API; plain objects lie on two nodes each; a put placed on a holder
//! that cannot write fails with 503 and leaves nothing behind; a holder killed and
//! removed, repair brings them back to two copies; a delete removes every copy; a damaged copy
//! is replaced on read, and by the scrub when nobody reads it; the Replication calls for files refuse a caller without the secret;
//! and an access key made on a PipeStore signs requests at the gateway.

use crate::common::{Instance, cli, free_port, jpeg, on_postgres, sha256};
use crate::gateway::SecuredCluster;
use crate::s3::boto3_at;

const NAMES: [&str; 3] = ["gs-a", "gs-b", "gs-c"];
/// Pause between two tries of something the cluster settles in the background.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// Tries before a wait counts as a hang (a bounded count, not a clock).
const POLLS: u32 = 300;

/// The plain objects' files of `node` whose name starts with the first 16 hex digits of
/// `sum` (a file's name begins with its content's SHA-256).
fn files_of(node: &Instance, sum: &str) -> Vec<std::path::PathBuf> {
    node.plain_object_files()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&sum[..16]))
        })
        .collect()
}

/// How many of `nodes` hold a file of the content with checksum `sum`.
fn holders_of(nodes: &[&Instance], sum: &str) -> usize {
    nodes
        .iter()
        .filter(|n| !files_of(n, sum).is_empty())
        .count()
}

/// [`boto3_at`], which must succeed; panics with the gateway's log otherwise.
fn boto3(gateway: &Instance, endpoints: &[&str], script: &str) -> serde_json::Value {
    boto3_at(endpoints, script).unwrap_or_else(|e| panic!("{e}\ngateway log:\n{}", gateway.log()))
}

/// Every key of bucket `lib` with the SHA-256 of its bytes, through each of `endpoints`
/// (signed with `key` when given), as `{"0": {key: sum}, "1": ...}`.
const READ_ALL: &str = r#"
import hashlib
out = {}
for i, e in enumerate(ENDPOINTS):
    c = client(*CREDS, endpoint=e) if CREDS else client(endpoint=e)
    listed = c.list_objects_v2(Bucket='lib').get('Contents', [])
    out[str(i)] = {o['Key']: hashlib.sha256(c.get_object(Bucket='lib', Key=o['Key'])['Body'].read()).hexdigest() for o in listed}
print(json.dumps(out))
"#;

fn read_all(
    gateway: &Instance,
    endpoints: &[&str],
    creds: Option<(&str, &str)>,
) -> serde_json::Value {
    let creds = match creds {
        Some((k, s)) => format!("CREDS = ({k:?}, {s:?})\n"),
        None => "CREDS = None\n".into(),
    };
    boto3(gateway, endpoints, &format!("{creds}{READ_ALL}"))
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn s3_through_a_gateway_serves_photos_and_plain_objects_from_every_front_door() {
    on_postgres("gateway_s3", |url| async move { gateway_s3_on(&url).await });
}

async fn gateway_s3_on(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    // The scrub re-reads 50 local copies and files a second.
    let scrub = ["--scrub-photos-per-second", "50"];
    let cluster = SecuredCluster::start(url, &NAMES, dir.path(), &scrub).await;
    // The gateway reads gs-a's keys.master, which gs-a made when it first started.
    let master = cluster.nodes[0].data.join("keys.master");
    let s3_listen = format!("127.0.0.1:{}", free_port());
    let staging = dir.path().join("staging");
    let gateway = cluster.gateway(
        url,
        &[
            "--s3-listen",
            &s3_listen,
            "--s3-staging",
            staging.to_str().unwrap(),
            "--keys-master-file",
            master.to_str().unwrap(),
        ],
    );
    let SecuredCluster {
        tuner,
        mut nodes,
        s3_ports,
        registered,
        ..
    } = cluster;
    let gw = format!("http://{s3_listen}");
    let node_endpoints: Vec<String> = s3_ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let mut every: Vec<&str> = vec![gw.as_str()];
    every.extend(node_endpoints.iter().map(String::as_str));

    // A photo with its ground truth, a sidecar and a 6 MiB multipart upload through the gateway.
    let photo = jpeg(320, 240, 5);
    let side = br#"{"taken": "2024-05-01", "album": "garden"}"#.to_vec();
    let big: Vec<u8> = (0..6u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let (photo_path, side_path, big_path) = (
        dir.path().join("cat.jpg"),
        dir.path().join("cat.json"),
        dir.path().join("clip.mov"),
    );
    std::fs::write(&photo_path, &photo).unwrap();
    std::fs::write(&side_path, &side).unwrap();
    std::fs::write(&big_path, &big).unwrap();
    let put = format!(
        r#"
from boto3.s3.transfer import TransferConfig
s3.create_bucket(Bucket='lib')
s3.put_object(Bucket='lib', Key='2024/cat.jpg', Body=open({photo:?}, 'rb').read(),
              ContentType='image/jpeg', Metadata={{'ndpipe-label': 'cat'}})
s3.put_object(Bucket='lib', Key='2024/cat.json', Body=open({side:?}, 'rb').read(),
              ContentType='application/json')
s3.upload_file({big:?}, 'lib', '2024/clip.mov',
               Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
head = s3.head_object(Bucket='lib', Key='2024/cat.jpg')
print(json.dumps({{'labels': head['Metadata'].get('ndpipe-labels', ''),
                   'etag': s3.head_object(Bucket='lib', Key='2024/clip.mov')['ETag']}}))
"#,
        photo = photo_path.to_str().unwrap(),
        side = side_path.to_str().unwrap(),
        big = big_path.to_str().unwrap(),
    );
    let stored = boto3(&gateway, &[&gw], &put);
    assert!(
        !stored["labels"].as_str().unwrap().is_empty(),
        "the photo is labelled through the gateway: {stored}"
    );
    assert!(
        stored["etag"].as_str().unwrap().ends_with("-2\""),
        "two parts: {stored}"
    );
    let (photo_sum, side_sum, big_sum) = (sha256(&photo), sha256(&side), sha256(&big));
    let want = serde_json::json!({
        "2024/cat.jpg": photo_sum, "2024/cat.json": side_sum, "2024/clip.mov": big_sum,
    });
    let seen = read_all(&gateway, &every, None);
    for i in 0..every.len() {
        assert_eq!(seen[i.to_string()], want, "through {}", every[i]);
    }
    // Each plain object lies on two distinct nodes; the photo is not a file.
    let all: Vec<&Instance> = nodes.iter().collect();
    assert_eq!(holders_of(&all, &side_sum), 2);
    assert_eq!(holders_of(&all, &big_sum), 2);
    assert_eq!(holders_of(&all, &photo_sum), 0);

    // A holder that cannot write (its objects folder replaced by a file): every plain object
    // placed on it fails with 503 ServiceUnavailable and leaves nothing behind, no key and no
    // copy on the other holder; the others are stored.
    let folder = nodes[2].data.join("objects");
    let aside = nodes[2].data.join("objects.aside");
    std::fs::rename(&folder, &aside).unwrap();
    std::fs::write(&folder, b"not a folder").unwrap();
    let tried = boto3(
        &gateway,
        &[&gw],
        r#"
s3.create_bucket(Bucket='broken')
out = []
for i in range(24):
    try:
        s3.put_object(Bucket='broken', Key=f'{i}', Body=f'broken object {i}'.encode())
        put = 200
    except botocore.exceptions.ClientError as e:
        put = e.response['ResponseMetadata']['HTTPStatusCode']
        assert e.response['Error']['Code'] == 'ServiceUnavailable', e.response
    try:
        s3.head_object(Bucket='broken', Key=f'{i}')
        head = 200
    except botocore.exceptions.ClientError as e:
        head = e.response['ResponseMetadata']['HTTPStatusCode']
    out.append([put, head])
for i in range(24):
    s3.delete_object(Bucket='broken', Key=f'{i}')
print(json.dumps(out))
"#,
    );
    std::fs::remove_file(&folder).unwrap();
    std::fs::rename(&aside, &folder).unwrap();
    let tried: Vec<(u64, u64)> = tried
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t[0].as_u64().unwrap(), t[1].as_u64().unwrap()))
        .collect();
    let failed: Vec<usize> = (0..24).filter(|&i| tried[i].0 == 503).collect();
    // Each object lands on gs-c with probability 2/3: all 24 or none of them would be 1 in
    // 17,000 or 1 in 3 x 10^11.
    assert!(
        !failed.is_empty() && failed.len() < 24,
        "{tried:?}\n{}",
        gateway.log()
    );
    for (i, outcome) in tried.iter().enumerate() {
        assert!(
            [(200, 200), (503, 404)].contains(outcome),
            "object {i}: a stored one reads, a failed put leaves no key: {outcome:?}"
        );
    }
    for i in failed {
        let sum = sha256(format!("broken object {i}").as_bytes());
        assert_eq!(holders_of(&all, &sum), 0, "object {i} left a copy behind");
    }

    // The Replication calls for files refuse a caller without the cluster secret.
    {
        use ndpipe_proto::pb;
        use ndpipe_proto::pb::replication_client::ReplicationClient;
        let url = registered[0]["url"].as_str().unwrap().to_string();
        let mut stranger = ReplicationClient::connect(url).await.unwrap();
        let refused = [
            stranger
                .put_blob(pb::BlobCopy::default())
                .await
                .err()
                .map(|s| s.code()),
            stranger
                .read_blob(pb::ReadBlobRequest::default())
                .await
                .err()
                .map(|s| s.code()),
            stranger
                .drop_blob(pb::DropBlobRequest::default())
                .await
                .err()
                .map(|s| s.code()),
        ];
        assert_eq!(refused, [Some(tonic::Code::Unauthenticated); 3]);
    }

    // A holder of the sidecar (not gs-a, whose keys.master the gateway reads) is killed: it
    // still reads back through the gateway and every live node. Once the node is removed,
    // repair brings both files back to two copies.
    let victim = (1..3)
        .find(|&i| !files_of(&nodes[i], &side_sum).is_empty())
        .unwrap();
    nodes[victim].kill9();
    let live: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let mut endpoints: Vec<&str> = vec![gw.as_str()];
    endpoints.extend(live.iter().map(|&i| node_endpoints[i].as_str()));
    let seen = read_all(&gateway, &endpoints, None);
    for i in 0..endpoints.len() {
        assert_eq!(
            seen[i.to_string()],
            want,
            "through {} after the kill",
            endpoints[i]
        );
    }
    let (ok, out, err) = cli(&[
        "nodes",
        "--server",
        &tuner.url,
        "remove",
        NAMES[victim],
        "--wait",
    ]);
    assert!(ok, "{out}{err}");
    let report = out.lines().last().unwrap_or_default();
    assert!(
        report.ends_with("back at 2 copies; 0 photos and 0 plain objects lost")
            && !report.contains(" and 0 plain objects back"),
        "the sidecar was short of a copy: {out}"
    );
    let survivors: Vec<&Instance> = live.iter().map(|&i| &nodes[i]).collect();
    let mut polls = 0;
    while holders_of(&survivors, &side_sum) < 2 || holders_of(&survivors, &big_sum) < 2 {
        polls += 1;
        assert!(
            polls < POLLS,
            "plain objects not repaired: {} and {} copies\n{}",
            holders_of(&survivors, &side_sum),
            holders_of(&survivors, &big_sum),
            survivors[0].log()
        );
        tokio::time::sleep(POLL).await;
    }

    let (ok, out, err) = cli(&["cluster", "--server", &gateway.url, "status"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("plain objects: 2 at target, 0 under-replicated, 0 lost"),
        "{out}"
    );

    // A damaged copy read through its node: the bytes come from the other copy, and the
    // damaged one is replaced.
    let (damaged_node, other) = (survivors[0], survivors[1]);
    let file = &files_of(damaged_node, &big_sum)[0];
    let mut bytes = std::fs::read(file).unwrap();
    bytes[1 << 20] ^= 0x40;
    std::fs::write(file, &bytes).unwrap();
    let at_node = node_endpoints[live[0]].as_str();
    let seen = read_all(&gateway, &[at_node], None);
    assert_eq!(seen["0"], want, "the damaged node answers intact bytes");
    assert_eq!(
        sha256(&std::fs::read(file).unwrap()),
        big_sum,
        "the copy is replaced"
    );
    assert_eq!(holders_of(&[other], &big_sum), 1);
    // A damaged copy nobody reads: the scrub finds and replaces it.
    let file = &files_of(other, &big_sum)[0];
    let mut bytes = std::fs::read(file).unwrap();
    bytes[7] ^= 0x01;
    std::fs::write(file, &bytes).unwrap();
    let mut polls = 0;
    while sha256(&std::fs::read(file).unwrap()) != big_sum {
        polls += 1;
        assert!(
            polls < POLLS,
            "the scrub did not replace the damaged copy\n{}",
            other.log()
        );
        tokio::time::sleep(POLL).await;
    }

    // A delete through the gateway removes both copies of the sidecar.
    let gone = boto3(
        &gateway,
        &[&gw],
        r#"
s3.delete_object(Bucket='lib', Key='2024/cat.json')
try:
    s3.head_object(Bucket='lib', Key='2024/cat.json')
    print(json.dumps({'status': 200}))
except botocore.exceptions.ClientError as e:
    print(json.dumps({'status': e.response['ResponseMetadata']['HTTPStatusCode']}))
"#,
    );
    assert_eq!(gone["status"], 404);
    assert_eq!(holders_of(&survivors, &side_sum), 0, "both copies are gone");

    // An access key made on the PipeStore whose keys.master the gateway reads signs requests
    // at the gateway; once a key exists, an unsigned request is refused there.
    let created = nodes[0]
        .client()
        .post(format!("{}/v1/admin/keys", nodes[0].url))
        .json(&serde_json::json!({"name": "sync", "role": "write"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let key: serde_json::Value = created.json().await.unwrap();
    let (access, secret_key) = (
        key["access_key"].as_str().unwrap(),
        key["secret_key"].as_str().unwrap(),
    );
    let signed = read_all(&gateway, &[&gw], Some((access, secret_key)));
    let mut left = want.clone();
    left.as_object_mut().unwrap().remove("2024/cat.json");
    assert_eq!(signed["0"], left);
    let refused = boto3_at(&[&gw], "s3.list_objects_v2(Bucket='lib')\nprint('{}')");
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("AccessDenied")),
        "{refused:?}"
    );
    drop(tuner);
}
