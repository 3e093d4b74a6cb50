//! Similar photos with the real model and real processes: on one `ndpipe serve` an edited copy
//! of a photo finds its original first and a posted cat finds the cat; an unknown photo is 404,
//! one not labelled yet 409, a bad batch of neighbours 400; after kill -9 during uploads and
//! deletes the index answers for exactly the photos with features, and a damaged index file is
//! rebuilt. On three PipeStores with two copies of each photo, every front door and a gateway
//! find photos of all nodes, and each node's batch of neighbours above a cosine similarity
//! (the semantic duplicates API) finds the edited copy of the cat across nodes; with a node
//! killed or stopped, the answer comes back within its deadline, names that node and is
//! marked partial, and a photo whose first holder is the stopped node is still answered for.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Instance, jpeg, on_postgres, sample};
use crate::gateway::SecuredCluster;

/// Tries before a wait counts as a hang (a bounded count, not a clock).
const POLLS: u32 = 600;
const POLL: Duration = Duration::from_millis(200);

/// `GET` or `POST` (with `body`) of `path` on `inst`: (status, JSON). The client gives up
/// after 20 s, a hang guard far beyond the queries' 2 s deadline.
async fn call(inst: &Instance, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let url = format!("{}{path}", inst.url);
    let req = match body {
        Some(b) => client.post(url).body(b),
        None => client.get(url),
    };
    let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn ids(answer: &Value) -> Vec<u64> {
    answer["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|h| h["id"].as_u64().unwrap())
        .collect()
}

/// Polls the query until its answer is complete (no node silent, no index building) and
/// holds exactly `want` photos.
async fn settled(inst: &Instance, path: &str, body: Option<&[u8]>, want: &BTreeSet<u64>) -> Value {
    let mut last = Value::Null;
    for _ in 0..POLLS {
        let (status, answer) = call(inst, path, body.map(<[u8]>::to_vec)).await;
        if status == 200 && answer["partial"] == false {
            let got: BTreeSet<u64> = ids(&answer).into_iter().collect();
            if &got == want {
                return answer;
            }
        }
        last = answer;
        tokio::time::sleep(POLL).await;
    }
    panic!("{path} never answered {want:?}: {last}\n{}", inst.log());
}

async fn upload(inst: &Instance, bytes: Vec<u8>) -> u64 {
    let (status, body) = inst.upload(bytes, "").await;
    assert_eq!(status, 201, "{body}\n{}", inst.log());
    body["id"].as_u64().unwrap()
}

/// The cat, resized to 3/4 and saved again as a JPEG.
fn edited_cat() -> Vec<u8> {
    let cat = image::load_from_memory(&sample("chelsea.png")).unwrap();
    let smaller = cat.resize(
        cat.width() * 3 / 4,
        cat.height() * 3 / 4,
        image::imageops::FilterType::Triangle,
    );
    let mut out = Vec::new();
    smaller
        .to_rgb8()
        .write_to(
            &mut std::io::Cursor::new(&mut out),
            image::ImageFormat::Jpeg,
        )
        .unwrap();
    out
}

/// Stops the server with SIGTERM and waits until it logs that it stopped (its log holds one
/// more "PipeStore stopped" than before: the log spans restarts), its index saved.
async fn stop_cleanly(inst: &Instance) {
    const LINE: &str = "PipeStore stopped";
    let before = inst.log().matches(LINE).count();
    inst.signal("TERM");
    for _ in 0..POLLS {
        if inst.log().matches(LINE).count() > before {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("never logged {LINE:?} again\n{}", inst.log());
}

#[tokio::test]
async fn similar_photos_on_one_store_survive_kill9_and_a_damaged_index() {
    let mut inst = Instance::start_with_model(&["--similar-save-interval-ms", "3600000"]);
    let mut photos = BTreeSet::new();
    let cat = upload(&inst, sample("chelsea.png")).await;
    photos.insert(cat);
    for name in ["coffee.png", "motorcycle_left.png", "motorcycle_right.png"] {
        photos.insert(upload(&inst, sample(name)).await);
    }
    let edited = upload(&inst, edited_cat()).await;
    photos.insert(edited);

    // The edited copy's nearest photo is its original; the posted cat finds the cat first.
    let others: BTreeSet<u64> = photos.iter().copied().filter(|id| *id != edited).collect();
    let path = format!("/v1/photos/{edited}/similar?k=10");
    let answer = settled(&inst, &path, None, &others).await;
    assert_eq!(ids(&answer)[0], cat, "{answer}");
    assert_eq!(answer["hits"][0]["node"], "pipestore-data", "{answer}");
    let posted = settled(
        &inst,
        "/v1/similar?k=10",
        Some(&sample("chelsea.png")),
        &photos,
    )
    .await;
    assert_eq!(ids(&posted)[0], cat, "{posted}");
    assert!(
        posted["hits"][0]["score"].as_f64().unwrap() > 0.99,
        "{posted}"
    );

    // Errors: unknown photo, bad k, a body that is no image.
    let (status, body) = call(&inst, "/v1/photos/999999/similar", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = call(&inst, &format!("/v1/photos/{cat}/similar?k=0"), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_query")),
        "{body}"
    );
    let (status, body) = call(&inst, "/v1/similar", Some(b"not an image".to_vec())).await;
    assert_eq!(status, 415, "{body}");
    let too_many: Vec<u64> = (1..=1025).collect();
    let body = json!({"ids": too_many, "min_score": 0.9});
    let (status, body) = post_json(&inst, "/v1/similar/neighbours", body).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_query")),
        "{body}"
    );
    let body = json!({"ids": [cat], "min_score": 2.0});
    let (status, body) = post_json(&inst, "/v1/similar/neighbours", body).await;
    assert_eq!(status, 400, "{body}");

    // A clean stop saves the index; then uploads and a delete, and kill -9 before any save.
    stop_cleanly(&inst).await;
    inst.restart();
    let uploads: Vec<_> = (0..12)
        .map(|seed| {
            let url = inst.url.clone();
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(format!("{url}/v1/photos"))
                    .body(jpeg(96 + seed, 80, seed * 11))
                    .send()
                    .await
            })
        })
        .collect();
    let (status, _) = {
        let resp = inst
            .client()
            .delete(format!("{}/v1/photos/{}", inst.url, photos.last().unwrap()))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), ())
    };
    assert_eq!(status, 204);
    for u in uploads.into_iter().take(6) {
        let _ = u.await;
    }
    inst.kill9();
    inst.restart();

    // Every photo the store kept is labelled again if need be, and the index holds exactly
    // them: none lost, the deleted one gone.
    let listed = inst.json("/v1/photos?limit=1000").await;
    let kept: BTreeSet<u64> = listed["photos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert!(!kept.contains(photos.last().unwrap()));
    settled(
        &inst,
        "/v1/similar?k=1000",
        Some(&sample("chelsea.png")),
        &kept,
    )
    .await;

    // A damaged index file is found at the next start and rebuilt.
    stop_cleanly(&inst).await;
    let dir = inst.data.join("index");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "usearch"))
        .unwrap_or_else(|| panic!("no index file in {}", dir.display()));
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&file, bytes).unwrap();
    inst.restart();
    settled(
        &inst,
        "/v1/similar?k=1000",
        Some(&sample("chelsea.png")),
        &kept,
    )
    .await;
    assert!(
        inst.log().contains("checksum does not match"),
        "{}",
        inst.log()
    );
}

#[tokio::test]
async fn a_photo_not_labelled_yet_is_409() {
    // An emulated accelerator of one photo every 4 s: the second upload waits for the first.
    let inst = Instance::start_with_model(&["--model-rate-limit", "0.25"]);
    upload(&inst, sample("coffee.png")).await;
    let waiting = upload(&inst, sample("chelsea.png")).await;
    let (status, body) = call(&inst, &format!("/v1/photos/{waiting}/similar"), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_labelled")),
        "{body}"
    );
}

/// The database is made and dropped outside the async runtime (its client blocks).
#[test]
fn similar_photos_across_three_pipestores_and_a_gateway() {
    on_postgres("similar", |url| async move { cluster_on(&url).await });
}

async fn cluster_on(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let names = ["sim-a", "sim-b", "sim-c"];
    let cluster = SecuredCluster::start(url, &names, dir.path(), &[]).await;
    let gateway = cluster.gateway(url, &[]);
    let SecuredCluster {
        tuner: _tuner,
        mut nodes,
        ..
    } = cluster;
    let mut photos = BTreeSet::new();
    let cat = upload(&nodes[0], sample("chelsea.png")).await;
    photos.insert(cat);
    let mut unrelated = Vec::new();
    for name in ["coffee.png", "motorcycle_left.png", "motorcycle_right.png"] {
        unrelated.push(upload(&nodes[1], sample(name)).await);
    }
    photos.extend(&unrelated);
    let edited = upload(&nodes[2], edited_cat()).await;
    photos.insert(edited);
    for seed in 0..20 {
        photos.insert(upload(&nodes[(seed % 3) as usize], jpeg(90, 70 + seed, seed * 13)).await);
    }
    let k = format!("/v1/similar?k={}", photos.len());
    let cat_bytes = sample("chelsea.png");
    // Every node holds some of the photos; every front door finds every photo once, every
    // node answering (a copy's hit is named after whichever holder answered first).
    for node in &nodes {
        assert!(node.json("/healthz").await["photos"].as_u64().unwrap() > 0);
    }
    for front in nodes.iter().chain([&gateway]) {
        let answer = settled(front, &k, Some(&cat_bytes), &photos).await;
        assert_eq!(ids(&answer)[0], cat, "{answer}");
        assert_eq!(answer["not_answered"], serde_json::json!([]), "{answer}");
        for hit in answer["hits"].as_array().unwrap() {
            assert!(names.contains(&hit["node"].as_str().unwrap()), "{answer}");
        }
    }
    let others: BTreeSet<u64> = photos.iter().copied().filter(|id| *id != cat).collect();
    let by_photo = format!("/v1/photos/{cat}/similar?k={}", photos.len());
    settled(&gateway, &by_photo, None, &others).await;
    duplicates_found_across_nodes(&nodes, &photos, (cat, edited), &unrelated).await;

    // A stopped node (it takes connections and answers nothing): the answer comes within the
    // deadline, names it and is partial; every photo still comes from its other copy. A photo
    // held by it and the last node is answered for from the latter (the holders are asked in
    // name order; the stopped one must not use up the deadline).
    let mut held_by_b_and_c = None;
    for id in &photos {
        let meta = gateway.json(&format!("/v1/photos/{id}/meta")).await;
        let copies: BTreeSet<&str> = meta["copies"]
            .as_array()
            .unwrap_or_else(|| panic!("{meta}"))
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        if copies == BTreeSet::from([names[1], names[2]]) {
            held_by_b_and_c = Some(*id);
        }
    }
    let held_by_b_and_c = held_by_b_and_c.expect("some photo is held by the last two nodes");
    nodes[1].signal("STOP");
    let path = format!("/v1/photos/{held_by_b_and_c}/similar?k=3");
    let (status, answer) = call(&gateway, &path, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["partial"], true, "{answer}");
    for front in [&nodes[0], &gateway] {
        let (status, answer) = call(front, &k, Some(cat_bytes.clone())).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["partial"], true, "{answer}");
        let silent = &answer["not_answered"];
        assert_eq!(silent.as_array().unwrap().len(), 1, "{answer}");
        assert_eq!(silent[0]["node"], names[1], "{answer}");
        // Silent until the deadline, or its lease ran out meanwhile.
        let reason = silent[0]["reason"].as_str().unwrap();
        assert!(reason == "timeout" || reason == "no live lease", "{answer}");
        let got: BTreeSet<u64> = ids(&answer).into_iter().collect();
        assert_eq!(
            got, photos,
            "two copies: each photo has a live one\n{answer}"
        );
    }
    nodes[1].signal("CONT");

    // A killed node: named as not answering, the answer partial.
    nodes[2].kill9();
    for front in [&nodes[0], &gateway] {
        let (status, answer) = call(front, &by_photo, None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["partial"], true, "{answer}");
        let silent: Vec<&str> = answer["not_answered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["node"].as_str().unwrap())
            .collect();
        assert_eq!(silent, vec![names[2]], "{answer}");
        let got: BTreeSet<u64> = ids(&answer).into_iter().collect();
        assert_eq!(got, others, "{answer}");
    }
    // The batch of neighbours too: partial, the killed node named.
    let (status, answer) = post_json(
        &nodes[0],
        "/v1/similar/neighbours",
        json!({"ids": photos, "min_score": MIN_SCORE}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["partial"], true, "{answer}");
    assert_eq!(
        answer["not_answered"].as_array().unwrap().len(),
        1,
        "{answer}"
    );
    assert_eq!(answer["not_answered"][0]["node"], names[2], "{answer}");
}

/// The least cosine similarity of the semantic duplicates asked for.
const MIN_SCORE: f64 = 0.9;

/// `POST` of the JSON `body` to `path` on `inst`: (status, JSON).
async fn post_json(inst: &Instance, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
        .post(format!("{}{path}", inst.url))
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Each node's neighbours of every photo above [`MIN_SCORE`]: every photo is answered for
/// by some node that holds it (the others list it without features), the cat and its edited
/// copy find each other wherever their copies are, the `unrelated` photos are not the cat's,
/// and no hit is below the least score or the photo itself.
async fn duplicates_found_across_nodes(
    nodes: &[Instance],
    photos: &BTreeSet<u64>,
    (cat, edited): (u64, u64),
    unrelated: &[u64],
) {
    let asked: Vec<u64> = photos.iter().copied().collect();
    let mut answered = BTreeSet::new();
    for node in nodes {
        let body = json!({"ids": asked, "min_score": MIN_SCORE, "k": 10});
        let (status, answer) = post_json(node, "/v1/similar/neighbours", body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["partial"], false, "{answer}");
        let without = answer["without_features"].as_array().unwrap().len();
        let photos_here = answer["photos"].as_array().unwrap();
        assert_eq!(without + photos_here.len(), asked.len(), "{answer}");
        for photo in photos_here {
            let id = photo["id"].as_u64().unwrap();
            answered.insert(id);
            let found = ids(photo);
            assert!(!found.contains(&id), "{answer}");
            for hit in photo["hits"].as_array().unwrap() {
                assert!(hit["score"].as_f64().unwrap() >= MIN_SCORE, "{answer}");
            }
            if id == cat {
                assert!(found.contains(&edited), "{answer}");
                assert!(found.iter().all(|h| !unrelated.contains(h)), "{answer}");
            }
            if id == edited {
                assert!(found.contains(&cat), "{answer}");
            }
        }
    }
    assert_eq!(&answered, photos);
}
