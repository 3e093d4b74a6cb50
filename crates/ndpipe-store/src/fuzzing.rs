//! The harnesses of the fuzz targets over this crate's decoders of untrusted bytes (`fuzz/`:
//! `volume`, `s3`), compiled with feature `fuzzing` and in every test build. The unit tests
//! below replay each target's committed seeds and kept crashes through the same harness, so a
//! regression fails `cargo test` without a fuzzer. Not product API.

use std::io::Cursor;

use crate::storage::index::{PhotoEntry, rebuild_in_memory};
use crate::storage::store::{PHOTO_SET, TENSOR_SET, replay_all};
use crate::storage::volume::format::{FILE_HEADER_LEN, FileHeader, RECORD_HEADER_LEN};
use crate::storage::volume::scan_records;

/// The `volume` target. The first byte picks what the rest is: (0) a volume file as recovery
/// reads it: header, record scan, the replay of every record into index changes (photo
/// metadata decoded, the next id raised), and those changes applied to an index in memory
/// and read back, as a rebuild does; (1) the same with every checksum made right first,
/// so the fuzzer reaches the records' contents; (2) an index entry's value as the index
/// decodes it. A scan must account for every byte it accepts.
pub fn volume(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 3 {
        0 => volume_file(rest),
        1 => {
            let mut fixed = rest.to_vec();
            fix_checksums(&mut fixed);
            volume_file(&fixed);
        }
        _ => drop(PhotoEntry::decode(7, rest)),
    }
}

fn volume_file(file: &[u8]) {
    let header = FileHeader::decode(file);
    let set = match header {
        Ok(h) if h.set == PHOTO_SET => PHOTO_SET,
        _ => TENSOR_SET,
    };
    let start = FILE_HEADER_LEN.min(file.len() as u64);
    let len = file.len() as u64;
    let mut reader = Cursor::new(file);
    reader.set_position(start);
    let scan = scan_records(reader, 1, start, len).expect("reading memory cannot fail");
    assert!(scan.end <= len);
    let mut at = start;
    for r in &scan.records {
        assert_eq!(r.location.offset, at, "records are contiguous");
        at += r.location.len;
    }
    assert_eq!(at, scan.end);
    assert_eq!(scan.invalid_tail.is_some(), scan.end < len);
    let mut next_id = header.map_or(1, |h| h.id_floor);
    let ids: Vec<u64> = scan.records.iter().map(|r| r.id).collect();
    let mut changes = Vec::new();
    if replay_all(set, scan.records, &mut next_id, &mut changes).is_ok() {
        assert_eq!(changes.len(), ids.len());
        assert!(ids.iter().all(|&id| id < next_id));
        let entries = rebuild_in_memory(&changes).expect("replayed changes apply");
        assert!(entries.iter().all(|(id, _)| ids.contains(id)));
    }
}

/// Rewrites the file header's and every record's checksums to match their bytes.
fn fix_checksums(file: &mut [u8]) {
    let crc_into = |file: &mut [u8], at: usize, over: std::ops::Range<usize>| {
        let crc = crc32c::crc32c(&file[over]);
        file[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    };
    let header = FILE_HEADER_LEN as usize;
    if file.len() < header {
        return;
    }
    crc_into(file, 24, 0..24);
    let mut at = header;
    while at + RECORD_HEADER_LEN <= file.len() {
        let u32_at =
            |i: usize| u32::from_le_bytes([file[i], file[i + 1], file[i + 2], file[i + 3]]);
        let body = u64::from(u32_at(at + 16)) + u64::from(u32_at(at + 20));
        let end = (at + RECORD_HEADER_LEN) as u64 + body;
        let fits = end <= file.len() as u64;
        if fits {
            crc_into(file, at + 24, at + RECORD_HEADER_LEN..end as usize);
        }
        crc_into(file, at + 28, at..at + 28);
        if !fits {
            return;
        }
        at = end as usize;
    }
}

/// The `s3` target: see `api/s3/fuzzing.rs` for what it covers.
pub fn s3(data: &[u8]) {
    crate::api::s3::fuzzing::s3(data);
}

#[cfg(test)]
mod tests {
    use ndpipe_util::fuzzing::{replay, write_seed};

    use super::*;

    const M: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn volume_corpus_replays() {
        replay(M, "volume", volume);
    }

    #[test]
    fn s3_corpus_replays() {
        replay(M, "s3", s3);
    }

    /// Writes the seeds of this crate's targets from real volumes written by a store:
    /// `cargo test -p ndpipe-store -- --ignored write_seeds`.
    #[tokio::test]
    #[ignore = "writes the committed seed corpus"]
    async fn write_seeds() {
        use crate::storage::store::tests::photo;
        use crate::storage::{PhotoStore, StoreConfig};
        let photo = |n| {
            let mut p = photo(n);
            p.meta.ground_truth = Some(ndpipe_catalog::GroundTruth::new(
                "cat",
                ndpipe_catalog::Split::Train,
            ));
            p
        };
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = PhotoStore::open(dir.path(), &StoreConfig::default()).unwrap();
        let a = store.put(photo(1)).await.unwrap();
        store.put(photo(2)).await.unwrap();
        store.delete(a).await.unwrap();
        store.close();
        drop(store);
        for (set, name) in [("photos", "photos.vol"), ("tensors", "tensors.vol")] {
            let file = std::fs::read(dir.path().join(set).join("00000001.vol")).unwrap();
            write_seed(M, "volume", name, &[[0u8].as_slice(), &file].concat());
        }
        let index = crate::storage::index::Index::open(
            &dir.path().join("index.redb"),
            crate::storage::DEFAULT_INDEX_CACHE_BYTES,
        )
        .unwrap();
        let (_, entry) = index.entries().unwrap().into_iter().next().unwrap();
        write_seed(
            M,
            "volume",
            "index-entry",
            &[[2u8].as_slice(), &entry.encode()].concat(),
        );
        let seeds: [(&str, &[&[u8]]); 3] = [
            (
                "virtual-host",
                &[
                    b"s3.example.com",
                    b"photos.s3.example.com:9000",
                    b"2024/a.jpg",
                    b"2024/",
                    b"/",
                    b"323032342f612e6a7067",
                    b"caf\xc3\xa9 100%",
                    b"cat",
                    b"val",
                    b"image/jpeg; charset=x",
                    b"",
                    b"",
                    b"\x01\x01",
                ],
            ),
            (
                "checksums",
                &[
                    b"localhost",
                    b"127.0.0.1:9000",
                    b"a/b/c",
                    b"a/",
                    b"/",
                    b"zz",
                    b"hello",
                    b"  ",
                    b"test",
                    b"application/octet-stream",
                    b"XUFAKrxLKna5cZ2REBfFkg==",
                    b"NhX4DJ0pPtdAJof5d4h1XQ==",
                    b"\x01\x01\x02\x02",
                ],
            ),
            (
                "multipart",
                &[
                    b"",
                    b"",
                    b"",
                    b"",
                    b"",
                    b"00ff",
                    b"GetObject",
                    b"dog\x07",
                    b"",
                    b"image/png",
                    b"",
                    b"",
                    b"\x01\x01\x02\x03\x05\x00",
                ],
            ),
        ];
        for (name, fields) in seeds {
            write_seed(M, "s3", name, &fields.join(&0u8));
        }
    }
}
