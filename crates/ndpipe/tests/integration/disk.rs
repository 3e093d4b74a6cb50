//! A full disk: the store runs on a small tmpfs that the test mounts (root only; where mounting
//! is impossible the test says so and passes). Uploads are refused with 507 below the reserve,
//! nothing acknowledged is lost, deletes happen completely or not at all, the server starts on
//! a full disk, and uploads work again once space returns, without a restart.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Instance, jpeg, sha256};

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Gives the file system `bytes` in all.
    fn resize(&self, bytes: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(status.success(), "remounting the tmpfs failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Fills the file system holding `dir` to the last byte, as another program would.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    for chunk in [1 << 20, 4096, 1] {
        let block = vec![0u8; chunk];
        while file.write_all(&block).is_ok() {}
    }
    filler
}

/// Uploads distinct photos from `clients` clients until each is refused; every refusal must be
/// a 507 with the JSON error. Returns the acknowledged (id, sha256) and the next seed.
async fn upload_until_full(inst: &Instance, clients: u32, seed: u32) -> (Vec<(u64, String)>, u32) {
    let mut tasks = Vec::new();
    for client in 0..clients {
        let url = inst.url.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acked = Vec::new();
            for n in 0..10_000 {
                let photo = jpeg(320, 240, seed + client * 10_000 + n);
                let resp = http
                    .post(format!("{url}/v1/photos"))
                    .body(photo.clone())
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let body: serde_json::Value = resp.json().await.unwrap();
                if status == 201 {
                    acked.push((body["id"].as_u64().unwrap(), sha256(&photo)));
                    continue;
                }
                assert_eq!(status, 507, "an upload on a filling disk: {body}");
                assert_eq!(body["error"], "insufficient_storage", "{body}");
                assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
                return acked;
            }
            panic!("the disk never filled");
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    (acked, seed + clients * 10_000)
}

/// Every acknowledged photo not deleted reads back byte for byte; returns how many did.
async fn verify(inst: &Instance, acked: &[(u64, String)], deleted: &HashSet<u64>) -> usize {
    let mut verified = 0;
    for (id, sum) in acked.iter().filter(|(id, _)| !deleted.contains(id)) {
        let (status, bytes) = inst.get(&format!("/v1/photos/{id}")).await;
        assert_eq!(
            status,
            200,
            "acknowledged photo {id} is missing\n{}",
            inst.log()
        );
        assert_eq!(&sha256(&bytes), sum, "photo {id} is corrupt");
        verified += 1;
    }
    verified
}

/// Deletes `ids` one by one; each is refused (507) or done (204), and after each the store
/// (`GET`) and the catalog (`meta`) agree. Returns the ids deleted.
async fn delete_agreeing(inst: &Instance, ids: &[u64]) -> Vec<u64> {
    let mut deleted = Vec::new();
    for id in ids {
        let resp = inst
            .client()
            .delete(format!("{}/v1/photos/{id}", inst.url))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        if status != 204 {
            let body: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(
                (status, &body["error"]),
                (507, &"insufficient_storage".into()),
                "{body}"
            );
        }
        let photo = inst.get(&format!("/v1/photos/{id}")).await.0;
        let meta = inst.get(&format!("/v1/photos/{id}/meta")).await.0;
        assert_eq!(
            photo, meta,
            "photo {id}: store says {photo}, catalog says {meta}"
        );
        assert_eq!(photo == 404, status == 204, "photo {id} after a {status}");
        if status == 204 {
            deleted.push(*id);
        }
    }
    deleted
}

#[tokio::test]
async fn a_full_disk_loses_nothing_and_uploads_resume_when_space_returns() {
    let Some(fs) = Tmpfs::mount(64 << 20) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root and mount)");
        return;
    };
    let mut inst = Instance::launch_at(
        fs.path().join("data"),
        &[
            "--no-model",
            "--min-free-bytes",
            "2097152",
            "--max-volume-bytes",
            "4194304",
        ],
    );
    let (mut acked, seed) = upload_until_full(&inst, 4, 0).await;
    assert!(
        acked.len() >= 50,
        "only {} photos fit on 64 MiB",
        acked.len()
    );
    verify(&inst, &acked, &HashSet::new()).await;

    // Another program takes the rest, to the last byte: even the index and tombstones meet
    // ENOSPC now.
    let filler = fill(fs.path());
    assert_eq!(inst.upload(jpeg(64, 64, 1), "").await.0, 507);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let health = inst.json("/healthz").await;
    assert_eq!(health["read_only"], true, "{health}");
    let victims: Vec<u64> = acked.iter().take(8).map(|(id, _)| *id).collect();
    let mut deleted: HashSet<u64> = delete_agreeing(&inst, &victims).await.into_iter().collect();
    assert_eq!(
        inst.json("/v1/photos?limit=5").await["photos"]
            .as_array()
            .unwrap()
            .len(),
        5
    );

    // A restart on the full disk starts read-only.
    inst.restart();
    assert_eq!(inst.json("/healthz").await["read_only"], true);
    verify(&inst, &acked, &deleted).await;
    let (status, body) = inst.upload(jpeg(64, 64, 2), "").await;
    assert_eq!(
        (status, &body["error"]),
        (507, &"insufficient_storage".into()),
        "{body}"
    );

    // Space returns: uploads are accepted again without a restart.
    std::fs::remove_file(filler).unwrap();
    fs.resize(128 << 20);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let photo = jpeg(320, 240, seed);
        let (status, body) = inst.upload(photo.clone(), "").await;
        if status == 201 {
            acked.push((body["id"].as_u64().unwrap(), sha256(&photo)));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "uploads still refused after space returned: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in 1..20 {
        let photo = jpeg(320, 240, seed + n);
        let (status, body) = inst.upload(photo.clone(), "").await;
        assert_eq!(status, 201, "{body}");
        acked.push((body["id"].as_u64().unwrap(), sha256(&photo)));
    }
    assert_eq!(inst.json("/healthz").await["read_only"], false);
    let more: Vec<u64> = acked.iter().skip(8).take(4).map(|(id, _)| *id).collect();
    let done = delete_agreeing(&inst, &more).await;
    assert_eq!(done.len(), more.len(), "deletes with free space");
    deleted.extend(done);

    // Once more from a restart: every acknowledged photo is there, store and catalog agree.
    inst.restart();
    let verified = verify(&inst, &acked, &deleted).await;
    let lost = acked.len() - deleted.len() - verified;
    let (store, catalog) = inst.counts().await;
    assert_eq!(
        store, catalog,
        "store and catalog disagree after the restart"
    );
    assert_eq!(store, verified as u64);
    eprintln!(
        "disk-full test: {} acknowledged, {} deleted, {verified} verified, {lost} lost",
        acked.len(),
        deleted.len()
    );
    assert_eq!(lost, 0);
}

/// A reserve larger than the free space (a small disk under the default 256 MiB) makes the
/// store read-only from its first start: it says so in a warning and in `/healthz`.
#[tokio::test]
async fn a_store_that_starts_below_its_reserve_says_so() {
    let reserve = 1u64 << 60;
    let inst = Instance::start_with(&["--min-free-bytes", &reserve.to_string()]);
    assert!(
        inst.log().contains("the store starts read-only"),
        "{}",
        inst.log()
    );
    let health = inst.json("/healthz").await;
    assert_eq!(health["read_only"], true, "{health}");
    assert_eq!(health["reserve_bytes"], reserve, "{health}");
    assert_eq!(inst.upload(jpeg(40, 40, 1), "").await.0, 507);

    let roomy = Instance::start();
    assert!(!roomy.log().contains("the store starts read-only"));
}
