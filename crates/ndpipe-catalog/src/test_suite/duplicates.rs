//! Duplicate finding's part of the suite: the SHA-256 lookup, exact-duplicate sets and
//! perceptual hashes.

use super::photo;
use crate::{Catalog, PhotoRecord};

/// Photo `id` whose original has the SHA-256 `sha256`, created at `created_ms`.
fn with_sha(id: u64, sha256: &str, created_ms: i64) -> PhotoRecord {
    let mut p = photo(id, None);
    p.meta.sha256 = sha256.into();
    p.meta.created_ms = created_ms;
    p
}

/// Runs this part on a catalog the rest of the suite has used; cleans up after itself.
pub(super) fn run(c: &dyn Catalog) {
    the_sha256_lookup_finds_every_copy_oldest_first(c);
    hashes_are_kept_per_algorithm_and_follow_their_photo(c);
    hashes_of_photos_under_the_smallest_side_are_left_out(c);
}

fn the_sha256_lookup_finds_every_copy_oldest_first(c: &dyn Catalog) {
    let sha = "d".repeat(64);
    c.upsert_photo(&with_sha(9001, &sha, 3_000)).unwrap();
    c.upsert_photo(&with_sha(9002, &sha, 1_000)).unwrap();
    c.upsert_photo(&with_sha(9003, &"e".repeat(64), 2_000))
        .unwrap();
    let found: Vec<u64> = c
        .photos_with_sha256(&sha)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(
        found,
        [9002, 9001],
        "every photo with the bytes, oldest first"
    );
    assert!(c.photos_with_sha256(&"f".repeat(64)).unwrap().is_empty());
    let sets = c.exact_duplicate_sets().unwrap();
    assert!(sets.contains(&vec![9001, 9002]), "{sets:?}");
    assert!(
        !sets.iter().flatten().any(|&id| id == 9003),
        "a photo with bytes of its own is in no set: {sets:?}"
    );
    let rows = c.photo_metas(&[9003, 9001, 424_242]).unwrap();
    let ids: Vec<u64> = rows.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [9001, 9003], "known ids in id order");
    assert_eq!(rows[0].1.sha256, sha);
    assert_eq!(rows[1].1.created_ms, 2_000);
    for id in [9001, 9002, 9003] {
        c.delete_photo(id).unwrap();
    }
    assert!(c.photos_with_sha256(&sha).unwrap().is_empty());
}

fn hashes_are_kept_per_algorithm_and_follow_their_photo(c: &dyn Catalog) {
    let before = c.count_without_near_hash("a").unwrap();
    for id in [9101, 9102, 9103] {
        c.upsert_photo(&photo(id, None)).unwrap();
    }
    assert_eq!(c.count_without_near_hash("a").unwrap(), before + 3);
    let pending = unhashed(c, "a");
    assert!(pending.windows(2).all(|w| w[0] < w[1]), "in id order");
    assert!([9101, 9102, 9103].iter().all(|id| pending.contains(id)));
    // u64::MAX checks that all 64 bits survive a signed column; 9999 no longer exists.
    let written = c
        .put_near_hashes("a", &[(9101, u64::MAX), (9102, 7), (9999, 1)])
        .unwrap();
    assert_eq!(written, 2, "a photo that does not exist is skipped");
    assert_eq!(c.count_without_near_hash("a").unwrap(), before + 1);
    let hashes = c.near_hashes("a", 0).unwrap();
    assert!(hashes.contains(&(9101, u64::MAX)) && hashes.contains(&(9102, 7)));
    assert!(!unhashed(c, "a").contains(&9101));
    assert_eq!(
        c.photos_without_near_hash("a", Some(9100), 2).unwrap(),
        (vec![], Some(9102)),
        "a window of hashed photos: none, and where the next window starts"
    );
    assert_eq!(
        c.photos_without_near_hash("a", Some(9102), 2).unwrap(),
        (vec![9103], Some(9103))
    );
    assert_eq!(
        c.photos_without_near_hash("a", Some(9103), 2).unwrap(),
        (vec![], None)
    );
    // Another algorithm replaces the hash: the photo needs one by "a" again.
    assert_eq!(c.put_near_hashes("b", &[(9101, 3)]).unwrap(), 1);
    assert!(unhashed(c, "a").contains(&9101));
    assert_eq!(c.near_hashes("b", 0).unwrap(), [(9101, 3)]);
    for id in [9101, 9102, 9103] {
        c.delete_photo(id).unwrap();
    }
    assert!(
        !c.near_hashes("a", 0)
            .unwrap()
            .iter()
            .any(|(id, _)| *id == 9102)
    );
    assert!(
        c.near_hashes("b", 0).unwrap().is_empty(),
        "deleted with the photo"
    );
}

/// Every photo of this node without a hash by `algorithm`, by a scan in windows of 2.
fn unhashed(c: &dyn Catalog, algorithm: &str) -> Vec<u64> {
    let (mut all, mut after) = (Vec::new(), None);
    while let (ids, Some(last)) = c.photos_without_near_hash(algorithm, after, 2).unwrap() {
        all.extend(ids);
        after = Some(last);
    }
    all
}

fn hashes_of_photos_under_the_smallest_side_are_left_out(c: &dyn Catalog) {
    for (id, width, height) in [(9201, 28, 28), (9202, 640, 480), (9203, 480, 640)] {
        let mut p = photo(id, None);
        (p.meta.width, p.meta.height) = (width, height);
        c.upsert_photo(&p).unwrap();
    }
    c.put_near_hashes("s", &[(9201, 1), (9202, 2), (9203, 3)])
        .unwrap();
    let ids = |min_side| -> Vec<u64> {
        let hashes = c.near_hashes("s", min_side).unwrap();
        hashes.iter().map(|(id, _)| *id).collect()
    };
    assert_eq!(ids(0), [9201, 9202, 9203]);
    assert_eq!(ids(64), [9202, 9203], "28 px is under 64");
    assert_eq!(ids(480), [9202, 9203], "480 px is not under 480");
    assert!(ids(481).is_empty(), "both sides count");
    for id in [9201, 9202, 9203] {
        c.delete_photo(id).unwrap();
    }
}
