//! The start-up reconcile's catalog check, over more than one page of ids.

use ndpipe_catalog::test_suite::photo;
use ndpipe_catalog::{PhotoCatalog, PhotoMeta, SqliteCatalog};

use super::{RECONCILE_PAGE, add_missing_rows};
use crate::storage::{NewPhoto, PhotoStore, StoreConfig};

fn meta(id: u64) -> PhotoMeta {
    PhotoMeta {
        sha256: format!("{:064x}", id + 1_000_000),
        content_type: "image/png".into(),
        ..photo(id, None).meta
    }
}

#[tokio::test]
async fn missing_rows_are_added_across_pages_and_rows_present_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = PhotoStore::open(dir.path(), &StoreConfig::default()).unwrap();
    let n = 2 * RECONCILE_PAGE as u64 + 5;
    for id in 1..=n {
        let new = NewPhoto {
            meta: meta(id),
            original: vec![1; 3],
            tensor: vec![1; 5],
        };
        assert_eq!(store.put(new).await.unwrap(), id);
    }
    let catalog = SqliteCatalog::in_memory().unwrap();
    // Every third photo has a row already, with other metadata than the store's.
    for id in (1..=n).step_by(3) {
        catalog.upsert_photo(&photo(id, None)).unwrap();
    }
    let added = add_missing_rows(&store, &catalog).unwrap();
    assert_eq!(added, n - n.div_ceil(3));
    assert_eq!(catalog.count_photos().unwrap(), n);
    for id in [1, n] {
        assert_eq!(catalog.photo(id).unwrap().unwrap(), photo(id, None), "kept");
    }
    for id in [2, RECONCILE_PAGE as u64 + 1, n - 1] {
        assert_eq!(catalog.photo(id).unwrap().unwrap().meta, meta(id), "added");
    }
    assert_eq!(add_missing_rows(&store, &catalog).unwrap(), 0, "none left");
}
