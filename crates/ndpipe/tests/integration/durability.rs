//! Crash safety: what was acknowledged survives, corruption is detected, space is reclaimed.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Instance, jpeg, sha256};

/// Uploads continuously from 6 clients, kills the server with SIGKILL mid-stream once 40 were
/// acknowledged (not after a fixed time), restarts it: every photo that got a 201 reads back
/// with its sha256.
#[tokio::test]
async fn acknowledged_uploads_survive_kill_9() {
    /// Uploads acknowledged before the kill.
    const ACKED_BEFORE_KILL: usize = 40;
    let mut inst = Instance::start();
    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let mut tasks = Vec::new();
    for worker in 0..6u32 {
        let url = inst.url.clone();
        let acked = acked.clone();
        // Each worker uploads until the server is gone (the kill below).
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for n in 0u32.. {
                let photo = jpeg(320, 240, worker * 10_000 + n);
                let Ok(resp) = client
                    .post(format!("{url}/v1/photos"))
                    .body(photo.clone())
                    .send()
                    .await
                else {
                    break;
                };
                if resp.status() != 201 {
                    break;
                }
                let Ok(body) = resp.json::<serde_json::Value>().await else {
                    break;
                };
                acked
                    .lock()
                    .unwrap()
                    .push((body["id"].as_u64().unwrap(), sha256(&photo)));
            }
        }));
    }
    // Kill once enough uploads were acknowledged that the crash lands among writes in flight,
    // however slow the machine; the guard only catches a server that stopped answering.
    let guard = Instant::now() + Duration::from_secs(120);
    while acked.lock().unwrap().len() < ACKED_BEFORE_KILL {
        assert!(
            Instant::now() < guard,
            "only {} uploads acknowledged in 120 s\n{}",
            acked.lock().unwrap().len(),
            inst.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    inst.kill9();
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= ACKED_BEFORE_KILL);
    inst.restart();
    for (id, sum) in &acked {
        let (status, bytes) = inst.get(&format!("/v1/photos/{id}")).await;
        assert_eq!(
            status,
            200,
            "acknowledged photo {id} is missing after kill -9\n{}",
            inst.log()
        );
        assert_eq!(&sha256(&bytes), sum, "photo {id} is corrupt after kill -9");
    }
    let (store, catalog) = inst.counts().await;
    assert!(store >= acked.len() as u64);
    assert_eq!(
        store, catalog,
        "catalog must match the store after recovery"
    );
}

/// A torn record at the tail is cut, and a deleted index is rebuilt from the volumes.
#[tokio::test]
async fn torn_tail_is_cut_and_lost_index_is_rebuilt() {
    let mut inst = Instance::start();
    let photos: Vec<Vec<u8>> = (0..5).map(|i| jpeg(100, 80, i)).collect();
    for p in &photos {
        assert_eq!(inst.upload(p.clone(), "?label=x").await.0, 201);
    }
    assert_eq!(
        inst.client()
            .delete(format!("{}/v1/photos/2", inst.url))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    inst.kill9();
    let vol = inst.volumes("photos").pop().unwrap();
    let good_len = std::fs::metadata(&vol).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(&vol).unwrap();
    f.write_all(b"NDPR\x01\x01\x00\x00 half a record header")
        .unwrap();
    drop(f);
    std::fs::remove_file(inst.data.join("store/index.redb")).unwrap();
    inst.restart();
    assert_eq!(
        std::fs::metadata(&vol).unwrap().len(),
        good_len,
        "torn tail must be cut"
    );
    assert_eq!(inst.counts().await, (4, 4));
    assert_eq!(
        inst.get("/v1/photos/2").await.0,
        404,
        "deleted photo must stay deleted"
    );
    for (i, p) in photos.iter().enumerate() {
        let id = i + 1;
        if id == 2 {
            continue;
        }
        assert_eq!(&inst.get(&format!("/v1/photos/{id}")).await.1, p);
    }
    let meta = inst.json("/v1/photos/1/meta").await;
    assert_eq!(meta["ground_truth"]["label"], "x");
    let (status, body) = inst.upload(jpeg(10, 10, 50), "").await;
    assert_eq!(status, 201);
    assert_eq!(body["id"], 6, "ids are never reused after a rebuild");
}

/// A flipped byte in a stored photo is reported as corrupt, never served.
#[tokio::test]
async fn corrupt_bytes_are_never_served() {
    let mut inst = Instance::start();
    let photo = jpeg(200, 200, 3);
    assert_eq!(inst.upload(photo.clone(), "").await.0, 201);
    inst.kill9();
    let vol = inst.volumes("photos").pop().unwrap();
    let mut bytes = std::fs::read(&vol).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x01;
    std::fs::write(&vol, bytes).unwrap();
    inst.restart();
    let (status, body) = inst.get("/v1/photos/1").await;
    assert_eq!(status, 500);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "corrupt_data");
}

#[tokio::test]
async fn compaction_reclaims_deleted_space_and_keeps_live_photos() {
    let mut inst = Instance::start_with(&["--max-volume-bytes", "200000"]);
    let photos: Vec<Vec<u8>> = (0..12).map(|i| jpeg(400, 300, i)).collect();
    for p in &photos {
        assert_eq!(inst.upload(p.clone(), "?label=keep").await.0, 201);
    }
    for id in (1..=12).filter(|id| id % 3 != 0) {
        assert_eq!(
            inst.client()
                .delete(format!("{}/v1/photos/{id}", inst.url))
                .send()
                .await
                .unwrap()
                .status(),
            204
        );
    }
    let before = inst.json("/healthz").await["disk_bytes"].as_u64().unwrap();
    let resp = inst
        .client()
        .post(format!("{}/v1/admin/compact", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let report: serde_json::Value = resp.json().await.unwrap();
    let after = inst.json("/healthz").await["disk_bytes"].as_u64().unwrap();
    assert_eq!(
        report["records_moved"], 8,
        "4 photos + 4 tensors are live: {report}"
    );
    assert!(
        after < before / 2,
        "compaction must reclaim space: {before} -> {after}"
    );
    let check = |inst: &Instance| {
        let inst_url = inst.url.clone();
        let photos = photos.clone();
        async move {
            for id in 1..=12u64 {
                let resp = reqwest::get(format!("{inst_url}/v1/photos/{id}"))
                    .await
                    .unwrap();
                if id % 3 == 0 {
                    assert_eq!(resp.status(), 200);
                    assert_eq!(resp.bytes().await.unwrap(), photos[(id - 1) as usize]);
                } else {
                    assert_eq!(resp.status(), 404);
                }
            }
        }
    };
    check(&inst).await;
    assert_eq!(inst.upload(jpeg(50, 50, 77), "").await.1["id"], 13);
    inst.restart();
    check(&inst).await;
    assert_eq!(inst.counts().await, (5, 5));
    std::fs::remove_file(inst.data.join("store/index.redb")).unwrap();
    inst.restart();
    check(&inst).await;
    assert_eq!(inst.upload(jpeg(50, 50, 78), "").await.1["id"], 14);
}
