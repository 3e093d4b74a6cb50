//! Hostile numbers and framing on `/v1` and the Tuner (issue 25): never a panic or a 500, always
//! a JSON body where the server writes the answer.

use crate::common::{Instance, TunerProcess, jpeg};

/// An offset at `u64::MAX` is a 400 on a PipeStore's search and an empty page on the Tuner's
/// (both sum it with the limit without overflowing).
#[tokio::test]
async fn a_huge_search_offset_is_answered_not_a_panic() {
    let inst = Instance::start();
    let (status, body) = inst
        .get("/v1/search?label=x&offset=18446744073709551615")
        .await;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_query")),
        "{body}"
    );
    let tuner = TunerProcess::start();
    let reply = reqwest::get(format!(
        "{}/v1/search?label=x&offset=18446744073709551615&limit=1000",
        tuner.url
    ))
    .await
    .unwrap();
    assert_eq!(reply.status(), 200);
    let body: serde_json::Value = reply.json().await.unwrap();
    assert_eq!(body["hits"], serde_json::json!([]), "{body}");
    assert!(tuner.log().find("panicked").is_none(), "{}", tuner.log());
}

/// A photo has one URL: `+1` and `0001` are not photo 1.
#[tokio::test]
async fn photo_ids_are_canonical_decimal() {
    let inst = Instance::start();
    let (status, body) = inst.upload(jpeg(40, 40, 1), "").await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_u64().unwrap();
    assert_eq!(inst.get(&format!("/v1/photos/{id}")).await.0, 200);
    for raw in [format!("+{id}"), format!("000{id}"), format!("%2B{id}")] {
        let (status, body) = inst.get(&format!("/v1/photos/{raw}")).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("bad_id")),
            "{raw}: {body}"
        );
    }
}

/// Too many headers is a 431 with a JSON body, not the HTTP parser's empty one.
#[tokio::test]
async fn too_many_headers_is_a_431_with_a_json_body() {
    let inst = Instance::start();
    let mut request = inst.client().get(format!("{}/v1/photos", inst.url));
    for i in 0..300 {
        request = request.header(format!("x-h{i}"), "v");
    }
    let reply = request.send().await.unwrap();
    assert_eq!(reply.status(), 431);
    let body: serde_json::Value = reply.json().await.unwrap();
    assert_eq!(body["error"], "headers_too_large", "{body}");
}

/// Half a JPEG with an end marker appended is refused as truncated (the decoder alone would
/// fill the missing half with grey), and nothing is stored.
#[tokio::test]
async fn half_a_jpeg_with_an_end_marker_is_refused() {
    let inst = Instance::start();
    let whole = jpeg(256, 192, 3);
    let mut half = whole[..whole.len() / 2].to_vec();
    half.extend_from_slice(&[0xFF, 0xD9]);
    let (status, body) = inst.upload(half, "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("truncated_image")),
        "{body}"
    );
    let (status, body) = inst.upload(whole, "").await;
    assert_eq!(status, 201, "the whole photo: {body}");
    assert_eq!(inst.counts().await.0, 1);
}
