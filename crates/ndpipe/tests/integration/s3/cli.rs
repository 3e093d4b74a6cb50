//! `aws s3` and `aws s3api` against the store: buckets, copies both ways, listing, sync of a
//! photo folder with sidecars both ways, removal, and a "directory" HEAD that is a 404.

use super::{S3Store, photo_folder, tree};
use crate::common::{sample, sha256};

#[tokio::test]
async fn aws_cli_copies_lists_syncs_and_removes_photos_and_sidecars() {
    let s3 = S3Store::start(&[]);
    let (ok, _, err) = s3.aws(&["s3", "mb", "s3://photos"]);
    assert!(ok, "mb: {err}");
    let (ok, _, err) = s3.aws(&["s3", "mb", "s3://photos"]);
    assert!(!ok && err.contains("BucketAlreadyOwnedByYou"), "{err}");

    let work = tempfile::tempdir().unwrap();
    let up = work.path().join("chelsea.png");
    std::fs::write(&up, sample("chelsea.png")).unwrap();
    let (ok, _, err) = s3.aws(&[
        "s3",
        "cp",
        up.to_str().unwrap(),
        "s3://photos/cats/chelsea.png",
    ]);
    assert!(ok, "cp up: {err}");
    let down = work.path().join("back.png");
    let (ok, _, err) = s3.aws(&[
        "s3",
        "cp",
        "s3://photos/cats/chelsea.png",
        down.to_str().unwrap(),
    ]);
    assert!(ok, "cp down: {err}");
    assert_eq!(
        sha256(&std::fs::read(&down).unwrap()),
        sha256(&sample("chelsea.png"))
    );
    let photos = s3.inst.json("/v1/photos").await;
    let id = photos["photos"][0]["id"]
        .as_u64()
        .expect("the image is a photo");
    let meta = s3.inst.json(&format!("/v1/photos/{id}/meta")).await;
    assert_eq!(
        (meta["bucket"].as_str(), meta["key"].as_str()),
        (Some("photos"), Some("cats/chelsea.png"))
    );

    let (ok, out, err) = s3.aws(&["s3", "ls", "s3://photos/"]);
    assert!(ok && out.contains("PRE cats/"), "ls: {out}{err}");
    let port = s3.endpoint.rsplit(':').next().unwrap();
    let by_name = format!("http://localhost:{port}");
    let (ok, out, err) = s3.aws_at(&by_name, &["s3", "ls", "s3://photos/cats/"]);
    assert!(
        ok && out.contains("chelsea.png"),
        "path-style by host name: {out}{err}"
    );
    let vhost = std::process::Command::new("curl")
        .args(["-sf", "-H", &format!("Host: photos.localhost:{port}")])
        .arg(format!("{}/cats/chelsea.png", s3.endpoint))
        .output()
        .unwrap();
    assert!(vhost.status.success(), "virtual-host-style GET failed");
    assert_eq!(sha256(&vhost.stdout), sha256(&sample("chelsea.png")));
    let (ok, _, err) = s3.aws(&[
        "s3api",
        "head-object",
        "--bucket",
        "photos",
        "--key",
        "cats",
    ]);
    assert!(
        !ok && err.contains("404"),
        "a directory-like key is a 404: {err}"
    );

    let folder = work.path().join("folder");
    photo_folder(&folder);
    let (ok, _, err) = s3.aws(&["s3", "sync", folder.to_str().unwrap(), "s3://photos/lib"]);
    assert!(ok, "sync up: {err}");
    let (ok, out, _) = s3.aws(&["s3", "sync", folder.to_str().unwrap(), "s3://photos/lib"]);
    assert!(
        ok && out.trim().is_empty(),
        "a second sync copies nothing: {out}"
    );
    let back = work.path().join("back");
    let (ok, _, err) = s3.aws(&["s3", "sync", "s3://photos/lib", back.to_str().unwrap()]);
    assert!(ok, "sync down: {err}");
    assert_eq!(tree(&back), tree(&folder));
    let photos = s3.inst.json("/v1/photos").await["photos"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        photos, 3,
        "the three images are photos, the sidecars plain objects"
    );

    let (ok, _, err) = s3.aws(&["s3", "rb", "s3://photos"]);
    assert!(!ok && err.contains("BucketNotEmpty"), "{err}");
    let (ok, _, err) = s3.aws(&["s3", "rm", "--recursive", "s3://photos/"]);
    assert!(ok, "rm: {err}");
    let (ok, out, _) = s3.aws(&["s3", "ls", "--recursive", "s3://photos/"]);
    assert!(ok && out.trim().is_empty(), "{out}");
    assert_eq!(s3.inst.json("/healthz").await["photos"], 0);
    let (ok, _, err) = s3.aws(&["s3", "rb", "s3://photos"]);
    assert!(ok, "rb: {err}");
    let (ok, out, _) = s3.aws(&["s3", "ls"]);
    assert!(ok && !out.contains("photos"), "{out}");
}
