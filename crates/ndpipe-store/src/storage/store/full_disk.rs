//! The store on a file system that really fills up: a small tmpfs mounted by the test (root
//! only; the test says so and passes where mounting is impossible).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ndpipe_catalog::PhotoMeta;

use super::{NewPhoto, PhotoStore, StoreConfig};
use crate::storage::StoreError;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Gives the file system `bytes` in all.
    fn resize(&self, bytes: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "remounting the tmpfs failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn photo(n: u32, bytes: usize) -> NewPhoto {
    NewPhoto {
        meta: PhotoMeta {
            sha256: format!("{n:064}"),
            bytes: bytes as u64,
            width: 1,
            height: 1,
            content_type: "image/png".into(),
            created_ms: 0,
            ground_truth: None,
        },
        original: vec![n as u8; bytes],
        tensor: vec![!(n as u8); bytes / 4],
    }
}

/// Fills the file system holding `path` to the last byte with one file.
fn fill(path: &Path) -> PathBuf {
    let filler = path.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    for chunk in [1 << 20, 4096, 512, 1] {
        let block = vec![0u8; chunk];
        while file.write_all(&block).is_ok() {}
    }
    let _ = file.sync_all();
    filler
}

/// A photo store on its own 8 MiB tmpfs (None, with a message, where mounting is impossible).
fn small_store() -> Option<(Tmpfs, std::path::PathBuf, PhotoStore)> {
    let Some(fs) = Tmpfs::mount(8 << 20) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return None;
    };
    let root = fs.path().join("store");
    let (store, _) = PhotoStore::open(&root, &small_config()).unwrap();
    Some((fs, root, store))
}

/// Small volumes and no reserve: the disk itself runs out.
fn small_config() -> StoreConfig {
    StoreConfig {
        max_volume_bytes: 1 << 20,
        min_free_bytes: 0,
        ..StoreConfig::default()
    }
}

#[tokio::test]
async fn a_full_disk_refuses_writes_loses_nothing_and_recovers_without_a_restart() {
    let Some((fs, root, store)) = small_store() else {
        return;
    };
    let mut stored = Vec::new();
    for n in 0.. {
        let p = photo(n, 64 << 10);
        let original = p.original.clone();
        match store.put(p).await {
            Ok(id) => stored.push((id, original)),
            Err(StoreError::InsufficientStorage { .. }) => break,
            Err(e) => panic!("a put on a filling disk failed with {e}"),
        }
    }
    assert!(stored.len() > 20, "only {} photos fit", stored.len());

    // The disk fills to the last byte behind the store's back; the free-space reading is
    // fresh, so the next put is tried and meets ENOSPC.
    if let Ok(id) = store.put(photo(1000, 1024)).await {
        stored.push((id, photo(1000, 1024).original));
    }
    let filler = fill(fs.path());
    for n in 1001..1004 {
        let e = store.put(photo(n, 16 << 10)).await.unwrap_err();
        assert!(matches!(e, StoreError::InsufficientStorage { .. }), "{e}");
    }
    let (victim, original) = stored.remove(0);
    match store.delete(victim).await {
        Ok(true) => assert!(!store.contains(victim).unwrap()),
        Err(StoreError::InsufficientStorage { .. }) => {
            assert!(
                store.contains(victim).unwrap(),
                "a refused delete deletes nothing"
            );
            stored.insert(0, (victim, original));
        }
        other => panic!("delete on a full disk: {other:?}"),
    }
    for (id, original) in &stored {
        assert_eq!(
            &store.original(*id).unwrap().unwrap().1,
            original,
            "photo {id}"
        );
    }

    std::fs::remove_file(filler).unwrap();
    fs.resize(16 << 20);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let id = store.put(photo(2000, 64 << 10)).await.unwrap();
    stored.push((id, photo(2000, 64 << 10).original));
    let (gone, _) = stored.remove(1);
    assert!(store.delete(gone).await.unwrap());
    drop(store);

    let (store, report) = PhotoStore::open(&root, &small_config()).unwrap();
    assert_eq!(report.photos, stored.len() as u64, "{report:?}");
    for (id, original) in &stored {
        assert_eq!(
            &store.original(*id).unwrap().unwrap().1,
            original,
            "photo {id} after reopening"
        );
        assert!(store.tensor(*id).unwrap().is_some());
    }
    assert!(store.original(gone).unwrap().is_none());
}

/// Space for the records but not for the index commit: redb fails on I/O (and then refuses
/// every operation until opened again). The batch is rolled back, the index opens again, and
/// reads and later writes work.
#[tokio::test]
async fn a_failed_index_commit_is_rolled_back_and_the_index_opens_again() {
    let Some((fs, root, store)) = small_store() else {
        return;
    };
    let mut stored = Vec::new();
    for n in 0..20 {
        let p = photo(n, 64 << 10);
        let original = p.original.clone();
        stored.push((store.put(p).await.unwrap(), original));
    }
    let mut index_failures = 0;
    for k in 0..12u64 {
        // Leave a little more room each time: first too little for anything, then room for
        // the records but not the index's new pages, then room for both.
        let filler = fill(fs.path());
        let len = std::fs::metadata(&filler).unwrap().len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .unwrap();
        file.set_len(len.saturating_sub((20 << 10) + k * 4096))
            .unwrap();
        drop(file);
        store.shared.space.forget();
        let p = photo(100 + k as u32, 16 << 10);
        let original = p.original.clone();
        match store.put(p).await {
            Ok(id) => stored.push((id, original)),
            Err(StoreError::InsufficientStorage { reason }) => {
                index_failures += usize::from(reason.contains("index error"));
            }
            Err(e) => panic!("put with {k} pages to spare: {e}"),
        }
        for (id, original) in &stored {
            assert_eq!(
                &store.original(*id).unwrap().unwrap().1,
                original,
                "photo {id}"
            );
        }
        std::fs::remove_file(filler).unwrap();
    }
    assert!(
        index_failures > 0,
        "no put met a full disk in the index commit"
    );
    drop(store);
    let (store, report) = PhotoStore::open(&root, &small_config()).unwrap();
    assert_eq!(report.photos, stored.len() as u64, "{report:?}");
    for (id, original) in &stored {
        assert_eq!(
            &store.original(*id).unwrap().unwrap().1,
            original,
            "photo {id}"
        );
    }
}
