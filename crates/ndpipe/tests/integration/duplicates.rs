//! Duplicate photos on one `ndpipe serve`: the same bytes uploaded again are answered per
//! `--exact-duplicates`; resized, recompressed and cropped copies made with the `image` crate
//! are grouped with their original as near duplicates, with the original as the keeper;
//! unrelated photos are in no group; `ndpipe photos duplicates` prints the group.

use std::time::{Duration, Instant};

use image::codecs::jpeg::JpegEncoder;
use image::{DynamicImage, ImageEncoder};

use crate::common::{Instance, cli, sample};

/// `image` as a JPEG of `quality`.
fn jpeg_of(image: &DynamicImage, quality: u8) -> Vec<u8> {
    let rgb = image.to_rgb8();
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, quality)
        .write_image(
            &rgb,
            rgb.width(),
            rgb.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

/// The three edited copies of `original`: recompressed at JPEG quality 50, resized to half,
/// and cropped by 5% of its width and height, half on each side (a 5% crop at one corner is
/// found for about half the photos at the default threshold: `docs/benchmarks.md`).
fn edited_copies(original: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let image = image::load_from_memory(original).unwrap();
    let (w, h) = (image.width(), image.height());
    let half = image.resize_exact(w / 2, h / 2, image::imageops::FilterType::Triangle);
    let cropped = image.crop_imm(w / 40, h / 40, w - w / 20, h - h / 20);
    vec![
        ("jpeg q50", jpeg_of(&image, 50)),
        ("resized 50%", jpeg_of(&half, 90)),
        ("cropped 5%", jpeg_of(&cropped, 90)),
    ]
}

/// Uploads `bytes`, expecting `status`; the reply.
async fn upload_expecting(inst: &Instance, bytes: Vec<u8>, status: u16) -> serde_json::Value {
    let (got, body) = inst.upload(bytes, "").await;
    assert_eq!(got, status, "{body}");
    body
}

/// `GET /v1/duplicates?level=...` once every photo has its perceptual hash (the worker hashes
/// them off the upload's path); a hang guard fails the test after 60 s.
async fn duplicates_when_hashed(inst: &Instance, levels: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = inst.json(&format!("/v1/duplicates?level={levels}")).await;
        if page["unhashed"] == 0 {
            return page;
        }
        assert!(Instant::now() < deadline, "photos never hashed: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (id, reason) of every member of `group`.
fn members(group: &serde_json::Value) -> Vec<(u64, String)> {
    group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_u64().unwrap(),
                m["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn same_bytes_answer_the_existing_photo_and_edited_copies_group_with_it() {
    let inst = Instance::start();
    let original = sample("chelsea.png");
    let first = upload_expecting(&inst, original.clone(), 201).await;
    let id = first["id"].as_u64().unwrap();
    assert!(first.get("duplicate_of").is_none(), "{first}");
    let again = upload_expecting(&inst, original.clone(), 200).await;
    assert_eq!(
        (again["id"].as_u64(), again["duplicate_of"].as_u64()),
        (Some(id), Some(id))
    );
    let listed = inst.json("/v1/photos").await;
    assert_eq!(
        listed["photos"].as_array().unwrap().len(),
        1,
        "nothing new stored: {listed}"
    );

    let mut copies = Vec::new();
    for (edit, bytes) in edited_copies(&original) {
        let reply = upload_expecting(&inst, bytes, 201).await;
        copies.push((edit, reply["id"].as_u64().unwrap()));
    }
    let mut unrelated = Vec::new();
    for name in ["coffee.png", "rocket.jpg", "astronaut.png"] {
        let reply = upload_expecting(&inst, sample(name), 201).await;
        unrelated.push(reply["id"].as_u64().unwrap());
    }

    let page = duplicates_when_hashed(&inst, "exact,near").await;
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(
        groups.len(),
        1,
        "one group, no unrelated photo grouped: {page}"
    );
    let group = &groups[0];
    let mut expected: Vec<(u64, String)> = std::iter::once(id)
        .chain(copies.iter().map(|(_, c)| *c))
        .map(|m| (m, "near".to_string()))
        .collect();
    expected.sort();
    assert_eq!(members(group), expected, "copies {copies:?}: {page}");
    assert_eq!(
        group["keeper"].as_u64(),
        Some(id),
        "the original is the largest: {group}"
    );
    one_photos_group_is_the_listed_one(&inst, id, group, &copies, &unrelated).await;

    let (ok, out, err) = cli(&["photos", "--server", &inst.url, "duplicates"]);
    assert!(ok, "{err}");
    let keeper_line = out
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("no line for photo {id}:\n{out}"));
    assert!(
        keeper_line.contains("near") && keeper_line.ends_with("keeper"),
        "{out}"
    );
    assert!(
        out.contains(&format!("group {id}: 4 photos, keep {id}")),
        "{out}"
    );
    for (_, copy) in &copies {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{copy} "))),
            "{out}"
        );
    }
    for other in &unrelated {
        assert!(
            !out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{other} "))),
            "{out}"
        );
    }
}

/// `GET /v1/photos/{id}/duplicates` gives each member of `group` that group, each photo of
/// `unrelated` none, and refuses unknown and malformed ids.
async fn one_photos_group_is_the_listed_one(
    inst: &Instance,
    id: u64,
    group: &serde_json::Value,
    copies: &[(&str, u64)],
    unrelated: &[u64],
) {
    for member in std::iter::once(id).chain(copies.iter().map(|(_, c)| *c)) {
        let one = inst.json(&format!("/v1/photos/{member}/duplicates")).await;
        assert_eq!(one["photo"].as_u64(), Some(member), "{one}");
        assert_eq!(&one["group"], group, "photo {member}");
    }
    for other in unrelated {
        let one = inst.json(&format!("/v1/photos/{other}/duplicates")).await;
        assert!(one["group"].is_null(), "{one}");
    }
    for (path, status, kind) in [
        ("/v1/photos/999999/duplicates", 404, "not_found"),
        ("/v1/photos/x/duplicates", 400, "bad_id"),
        ("/v1/photos/1/duplicates?level=similar", 400, "bad_query"),
    ] {
        let (got, body) = inst.get(path).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (got, body["error"].as_str()),
            (status, Some(kind)),
            "{path}"
        );
    }
}

#[tokio::test]
async fn store_mode_stores_the_same_bytes_again_and_groups_them_as_exact() {
    let inst = Instance::start_with(&["--exact-duplicates", "store"]);
    let photo = sample("coffee.png");
    let first = upload_expecting(&inst, photo.clone(), 201).await;
    let id = first["id"].as_u64().unwrap();
    let second = upload_expecting(&inst, photo, 201).await;
    let copy = second["id"].as_u64().unwrap();
    assert_ne!(copy, id, "a new photo: {second}");
    assert_eq!(second["duplicate_of"].as_u64(), Some(id), "{second}");
    upload_expecting(&inst, sample("rocket.jpg"), 201).await;

    let page = inst.json("/v1/duplicates?level=exact").await;
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{page}");
    assert_eq!(
        members(&groups[0]),
        [(id, "exact".to_string()), (copy, "exact".to_string())]
    );
    assert_eq!(
        groups[0]["keeper"].as_u64(),
        Some(id),
        "the same size: the older one"
    );
}

#[tokio::test]
async fn semantic_duplicates_come_from_the_similarity_index_and_labels_reach_the_stored_photo() {
    let inst = Instance::start_with_model(&[]);
    let original = sample("chelsea.png");
    let id = upload_expecting(&inst, original.clone(), 201).await["id"]
        .as_u64()
        .unwrap();
    // A mirror image: another perceptual hash, the same content.
    let mirrored = image::load_from_memory(&original).unwrap().fliph();
    let mirror = upload_expecting(&inst, jpeg_of(&mirrored, 90), 201).await["id"]
        .as_u64()
        .unwrap();
    let mut unrelated = Vec::new();
    for name in ["coffee.png", "rocket.jpg", "astronaut.png"] {
        let reply = upload_expecting(&inst, sample(name), 201).await;
        unrelated.push(reply["id"].as_u64().unwrap());
    }

    // The same bytes again with ground truth: nothing stored, the stored photo labelled.
    let (status, again) = inst.upload(original, "?label=cat&split=val").await;
    assert_eq!(
        (status, again["duplicate_of"].as_u64()),
        (200, Some(id)),
        "{again}"
    );
    let listed = inst.json("/v1/photos").await;
    let stored = listed["photos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"].as_u64() == Some(id))
        .unwrap()
        .clone();
    assert_eq!(stored["ground_truths"][0]["label"], "cat", "{stored}");
    assert_eq!(stored["ground_truths"][0]["split"], "val", "{stored}");

    inst.wait_labelled(5).await;
    let page = inst.json("/v1/duplicates?level=semantic").await;
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{page}");
    assert_eq!(
        members(&groups[0]),
        [
            (id, "semantic".to_string()),
            (mirror, "semantic".to_string())
        ],
        "{page}"
    );

    let storage_only = Instance::start();
    let (status, body) = storage_only.get("/v1/duplicates?level=semantic").await;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("level_unavailable"))
    );
}
