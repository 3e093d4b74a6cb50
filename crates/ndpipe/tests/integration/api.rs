//! The HTTP API: uploads, reads, listing, deletes, errors, tokens, concurrency.

use crate::common::{Instance, all_samples, jpeg, sample, sha256};

#[tokio::test]
async fn real_photos_round_trip_byte_for_byte() {
    let inst = Instance::start();
    let mut ids = Vec::new();
    for (name, bytes) in all_samples() {
        let (status, body) = inst.upload(bytes.clone(), "").await;
        assert_eq!(status, 201, "{name}: {body}");
        assert_eq!(body["sha256"], sha256(&bytes), "{name}");
        ids.push((body["id"].as_u64().unwrap(), name, bytes));
    }
    assert!(
        ids.len() >= 15,
        "expected the scikit-image photos, found {}",
        ids.len()
    );
    for (id, name, bytes) in &ids {
        let resp = inst
            .client()
            .get(format!("{}/v1/photos/{id}", inst.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        let etag = resp.headers()["etag"].to_str().unwrap().to_string();
        let got = resp.bytes().await.unwrap();
        assert_eq!(&got[..], &bytes[..], "{name}");
        assert_eq!(etag, format!("\"{}\"", sha256(bytes)));
        let want = if name.ends_with(".jpg") {
            "image/jpeg"
        } else {
            "image/png"
        };
        assert_eq!(ctype, want, "{name}");
        let tensor = inst.get(&format!("/v1/photos/{id}/tensor")).await;
        assert_eq!(tensor.0, 200);
        let t = ndpipe_model::TensorBlob::decode(&tensor.1).unwrap();
        assert_eq!((t.height(), t.width(), t.channels()), (224, 224, 3));
    }
    let cat = inst
        .json(&format!(
            "/v1/photos/{}/meta",
            ids.iter().find(|i| i.1 == "chelsea.png").unwrap().0
        ))
        .await;
    assert_eq!(
        (cat["width"].as_u64(), cat["height"].as_u64()),
        (Some(451), Some(300))
    );
    let not_modified = inst
        .client()
        .get(format!("{}/v1/photos/{}", inst.url, ids[0].0))
        .header("if-none-match", format!("\"{}\"", sha256(&ids[0].2)))
        .send()
        .await
        .unwrap();
    assert_eq!(not_modified.status(), 304);
}

#[tokio::test]
async fn ground_truth_listing_paging_and_delete() {
    let inst = Instance::start();
    for i in 0..7 {
        let (s, _) = inst
            .upload(jpeg(64, 48, i), &format!("?label=cls{}&split=val", i % 2))
            .await;
        assert_eq!(s, 201);
    }
    let req = inst
        .client()
        .post(format!("{}/v1/photos", inst.url))
        .header("x-ndpipe-label", "from header")
        .body(jpeg(30, 30, 99))
        .send()
        .await
        .unwrap();
    assert_eq!(req.status(), 201);
    let page = inst.json("/v1/photos?limit=3").await;
    let ids: Vec<u64> = page["photos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(page["photos"][1]["ground_truth"]["label"], "cls1");
    assert_eq!(page["photos"][1]["ground_truth"]["split"], "val");
    let next = inst
        .json(&format!("/v1/photos?after={}&limit=10", page["next_after"]))
        .await;
    assert_eq!(next["photos"].as_array().unwrap().len(), 5);
    assert_eq!(next["photos"][4]["ground_truth"]["label"], "from header");
    assert_eq!(next["photos"][4]["ground_truth"]["split"], "train");
    assert!(next["next_after"].is_null());

    let del = inst
        .client()
        .delete(format!("{}/v1/photos/2", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    let again = inst
        .client()
        .delete(format!("{}/v1/photos/2", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    assert_eq!(inst.get("/v1/photos/2").await.0, 404);
    assert_eq!(inst.get("/v1/photos/2/meta").await.0, 404);
    assert_eq!(inst.counts().await, (7, 7));

    let set = inst
        .client()
        .put(format!("{}/v1/photos/3/ground-truth", inst.url))
        .json(&serde_json::json!({"label": "relabelled", "split": "test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 204);
    let meta = inst.json("/v1/photos/3/meta").await;
    assert_eq!(
        meta["ground_truth"],
        serde_json::json!({"task": "default", "label": "relabelled", "split": "test"})
    );
}

/// Every bad upload gets a 4xx with a JSON body naming the problem, and leaves nothing behind.
#[tokio::test]
async fn bad_uploads_are_refused_and_leave_nothing() {
    let inst = Instance::start_with(&["--max-upload-bytes", "2000000", "--max-pixels", "40000000"]);
    let (s, _) = inst.upload(sample("coffee.png"), "?label=cup").await;
    assert_eq!(s, 201);
    let before_disk = inst.json("/healthz").await["disk_bytes"].as_u64().unwrap();
    let good_jpeg = jpeg(300, 200, 1);
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0u8; 200]);
    let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec();
    let cases: Vec<(&str, Vec<u8>, &str, u16, &str)> = vec![
        ("zero bytes", vec![], "", 400, "empty_body"),
        (
            "not an image",
            b"just some text, definitely not a photo".to_vec(),
            "",
            415,
            "unsupported_format",
        ),
        ("bmp", bmp, "", 415, "unsupported_format"),
        ("gif", gif, "", 415, "unsupported_format"),
        (
            "truncated jpeg",
            good_jpeg[..good_jpeg.len() / 2].to_vec(),
            "",
            422,
            "truncated_image",
        ),
        (
            "too large body",
            vec![0xFF; 2_500_000],
            "",
            413,
            "body_too_large",
        ),
        (
            "decompression bomb",
            png_bomb(60_000, 60_000),
            "",
            413,
            "too_many_pixels",
        ),
        (
            "split without label",
            jpeg(20, 20, 2),
            "?split=val",
            400,
            "invalid_label",
        ),
        (
            "bad split",
            jpeg(20, 20, 2),
            "?label=x&split=holdout",
            400,
            "invalid_split",
        ),
        (
            "control chars in label",
            jpeg(20, 20, 2),
            "?label=a%0Ab",
            400,
            "invalid_label",
        ),
    ];
    for (name, body, query, status, kind) in cases {
        let (got, json) = inst.upload(body, query).await;
        assert_eq!(got, status, "{name}: {json}");
        assert_eq!(json["error"], kind, "{name}: {json}");
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}: {json}"
        );
    }
    assert_eq!(inst.counts().await, (1, 1));
    assert_eq!(
        inst.json("/healthz").await["disk_bytes"].as_u64().unwrap(),
        before_disk
    );
    assert_eq!(inst.get("/v1/photos/abc").await.0, 400);
    assert_eq!(inst.get("/v1/photos/99").await.0, 404);
    let (status, body) = inst.get("/v1/nothing-here").await;
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("no_route"));
    let metrics = String::from_utf8(inst.get("/metrics").await.1).unwrap();
    assert!(
        metrics.contains("ndpipe_store_errors_total{kind=\"unsupported_format\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ndpipe_store_uploads_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ndpipe_store_ingest_duration_seconds_bucket"),
        "{metrics}"
    );
}

/// A PNG whose header declares `w` x `h` pixels, with almost no data: a decompression bomb.
pub(crate) fn png_bomb(w: u32, h: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut c = kind.to_vec();
        c.extend_from_slice(data);
        out.extend_from_slice(&c);
        out.extend_from_slice(&crc32(&c).to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(
        &mut out,
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test]
async fn thirty_two_concurrent_uploads_are_all_stored_once() {
    let inst = Instance::start();
    let photos: Vec<Vec<u8>> = (0..32).map(|i| jpeg(200 + i, 150, i)).collect();
    let tasks: Vec<_> = photos
        .iter()
        .cloned()
        .map(|p| {
            let url = inst.url.clone();
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!("{url}/v1/photos"))
                    .body(p)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 201);
                resp.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_u64()
                    .unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 32, "ids must be distinct: {ids:?}");
    assert_eq!(inst.counts().await, (32, 32));
    for (id, photo) in ids.iter().zip(&photos) {
        assert_eq!(inst.get(&format!("/v1/photos/{id}")).await.1, *photo);
    }
}

#[tokio::test]
async fn a_token_guards_writes_but_not_reads() {
    let inst = Instance::start_with(&["--token", "s3cret"]);
    let (s, body) = inst.upload(jpeg(40, 40, 1), "").await;
    assert_eq!(s, 401);
    assert_eq!(body["error"], "unauthorized");
    let wrong = inst
        .client()
        .post(format!("{}/v1/photos", inst.url))
        .bearer_auth("guess")
        .body(jpeg(40, 40, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = inst
        .client()
        .post(format!("{}/v1/photos", inst.url))
        .bearer_auth("s3cret")
        .body(jpeg(40, 40, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
    assert_eq!(inst.get("/v1/photos/1").await.0, 200);
    let del = inst
        .client()
        .delete(format!("{}/v1/photos/1", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 401);
    let compact = inst
        .client()
        .post(format!("{}/v1/admin/compact", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(compact.status(), 401);
    assert_eq!(inst.counts().await, (1, 1));
}

#[tokio::test]
async fn a_token_on_the_command_line_is_warned_about_and_a_token_file_is_not() {
    let inst = Instance::start_with(&["--token", "s3cret"]);
    let warning = "the bearer token was given as --token";
    assert!(inst.log().contains(warning), "{}", inst.log());
    assert!(inst.log().contains("--token-file"), "{}", inst.log());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let quiet = Instance::start_with(&["--token-file", file.to_str().unwrap()]);
    assert!(!quiet.log().contains(warning), "{}", quiet.log());
    let ok = quiet
        .client()
        .post(format!("{}/v1/photos", quiet.url))
        .bearer_auth("s3cret")
        .body(jpeg(40, 40, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
}

/// Ids above what the catalog can hold (i64::MAX) do not exist (404); `after` above it is a bad
/// query (400). None is a 500.
#[tokio::test]
async fn ids_beyond_the_catalog_are_404_or_400_never_500() {
    let inst = Instance::start();
    assert_eq!(inst.upload(jpeg(40, 40, 1), "").await.0, 201);
    let json_error = |body: &[u8]| -> String {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        v["error"].as_str().unwrap().to_string()
    };
    for after in ["18446744073709551615", "9223372036854775808"] {
        let (status, body) = inst.get(&format!("/v1/photos?after={after}")).await;
        assert_eq!(
            (status, json_error(&body).as_str()),
            (400, "bad_query"),
            "after={after}"
        );
    }
    let page = inst.json("/v1/photos?after=9223372036854775807").await;
    assert!(page["photos"].as_array().unwrap().is_empty());
    for id in ["9223372036854775808", "18446744073709551615"] {
        for path in ["", "/meta", "/labels", "/tensor"] {
            let (status, body) = inst.get(&format!("/v1/photos/{id}{path}")).await;
            assert_eq!(
                (status, json_error(&body).as_str()),
                (404, "not_found"),
                "{id}{path}"
            );
        }
        let del = inst
            .client()
            .delete(format!("{}/v1/photos/{id}", inst.url))
            .send()
            .await
            .unwrap();
        assert_eq!(del.status(), 404);
        let truth = inst
            .client()
            .put(format!("{}/v1/photos/{id}/ground-truth", inst.url))
            .json(&serde_json::json!({"label": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(truth.status(), 404);
    }
    let (status, body) = inst.get("/v1/photos/18446744073709551616").await;
    assert_eq!((status, json_error(&body).as_str()), (400, "bad_id"));
    let metrics = String::from_utf8(inst.get("/metrics").await.1).unwrap();
    assert!(!metrics.contains("catalog_error"), "{metrics}");
}

/// 405 and 431 answer the same JSON error body as every other error.
#[tokio::test]
async fn method_not_allowed_and_oversized_headers_have_json_bodies() {
    let inst = Instance::start();
    for (method, path) in [
        (reqwest::Method::PUT, "/v1/photos"),
        (reqwest::Method::DELETE, "/v1/search"),
        (reqwest::Method::POST, "/healthz"),
    ] {
        let resp = inst
            .client()
            .request(method.clone(), format!("{}{path}", inst.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method} {path}");
        assert!(resp.headers().contains_key("allow"), "{method} {path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "method_not_allowed", "{method} {path}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let resp = inst
        .client()
        .get(format!("{}/v1/photos", inst.url))
        .header("x-padding", "a".repeat(100 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 431);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "headers_too_large", "{body}");
    assert_eq!(inst.get("/v1/photos?limit=1").await.0, 200);
}

/// `%` and `_` in a searched label are characters, not SQL wildcards.
#[tokio::test]
async fn label_search_treats_wildcards_as_characters() {
    let inst = Instance::start_with_model(&[]);
    let (status, body) = inst.upload(sample("chelsea.png"), "").await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_u64().unwrap();
    let labels = inst.labels_when_ready(id).await;
    // A class with synonyms ("tabby, tabby cat"): the patterns below matched it as wildcards.
    let synonyms = labels[0]["labels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["label"].as_str())
        .find(|l| l.contains(", ") && l.is_ascii())
        .unwrap_or_else(|| panic!("no label with synonyms in {labels}"))
        .to_string();
    let first = synonyms.split(", ").next().unwrap();
    let hits = |v: serde_json::Value| v["hits"].as_array().unwrap().len();
    assert_eq!(
        hits(inst.json(&format!("/v1/search?label={first}")).await),
        1,
        "{first}"
    );
    let mut one_wrong = first.to_string();
    one_wrong.replace_range(1..2, "_");
    let prefix = format!("{}%25", &first[..2]);
    for wildcard in ["%25", "_", "%25%25", one_wrong.as_str(), prefix.as_str()] {
        let (status, body) = inst.get(&format!("/v1/search?label={wildcard}")).await;
        assert_eq!(
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"].as_str()
            ),
            (404, Some("unknown_class")),
            "label={wildcard} must match only itself"
        );
    }
}
