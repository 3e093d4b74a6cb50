//! Append-only volume files: one directory per record set (original photos, tensors).
//!
//! Records are only ever appended to the newest volume; a volume that reaches its size limit is
//! sealed and a new one started. Each record carries its own checksums, so a volume can be
//! scanned to rebuild the index, and a torn record at the tail of the newest volume (a crash in
//! the middle of a write) is recognised and cut.

pub(crate) mod format;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use format::{FILE_HEADER_LEN, FileHeader, RECORD_HEADER_LEN, RecordHeader, RecordKind};
use serde::{Deserialize, Serialize};

use ndpipe_util::sync::{lock, read, write};

use crate::storage::StoreError;

/// Where a record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Location {
    /// Volume number.
    pub(crate) volume: u32,
    /// Byte offset of the record header in the volume file.
    pub(crate) offset: u64,
    /// Length of the whole record.
    pub(crate) len: u64,
}

/// A record found while scanning a volume.
#[derive(Debug)]
pub(crate) struct ScannedRecord {
    /// Put or tombstone.
    pub(crate) kind: RecordKind,
    /// Photo id.
    pub(crate) id: u64,
    /// Where it is.
    pub(crate) location: Location,
    /// Its metadata bytes.
    pub(crate) meta: Vec<u8>,
}

/// The outcome of scanning a volume from some offset to its end.
#[derive(Debug)]
pub(crate) struct Scan {
    /// Valid records, in file order.
    pub(crate) records: Vec<ScannedRecord>,
    /// Offset just past the last valid record.
    pub(crate) end: u64,
    /// Set when bytes after `end` do not form a valid record: the offset's reason.
    pub(crate) invalid_tail: Option<&'static str>,
}

/// A record read back and verified.
#[derive(Debug)]
pub(crate) struct Record {
    /// Its metadata bytes.
    pub(crate) meta: Vec<u8>,
    /// Its data bytes.
    pub(crate) data: Vec<u8>,
}

struct Active {
    number: u32,
    file: File,
    len: u64,
}

/// One directory of volumes belonging to one record set.
pub(crate) struct VolumeSet {
    dir: PathBuf,
    set: u8,
    max_volume_bytes: u64,
    readers: RwLock<HashMap<u32, Arc<File>>>,
    active: Mutex<Option<Active>>,
}

impl VolumeSet {
    /// Opens (creating if needed) the set stored in `dir`.
    pub(crate) fn open(dir: &Path, set: u8, max_volume_bytes: u64) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(StoreError::io("create volume directory", dir))?;
        Ok(VolumeSet {
            dir: dir.to_path_buf(),
            set,
            max_volume_bytes,
            readers: RwLock::new(HashMap::new()),
            active: Mutex::new(None),
        })
    }

    /// The set's identifier, written in each volume header.
    pub(crate) fn set_id(&self) -> u8 {
        self.set
    }

    /// The directory of this set.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of volume `number`.
    pub(crate) fn path(&self, number: u32) -> PathBuf {
        self.dir.join(format!("{number:08}.vol"))
    }

    /// Volume numbers present on disk, ascending.
    pub(crate) fn volumes(&self) -> Result<Vec<u32>, StoreError> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(StoreError::io("list volumes", &self.dir))?;
        for entry in entries {
            let entry = entry.map_err(StoreError::io("list volumes", &self.dir))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".vol")) else {
                continue;
            };
            if let Ok(n) = stem.parse::<u32>() {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Reads the header of volume `number`.
    pub(crate) fn header(&self, number: u32) -> Result<FileHeader, StoreError> {
        let file = self.reader(number)?;
        let mut buf = [0u8; FILE_HEADER_LEN as usize];
        let n = read_full_at(&file, &mut buf, 0)
            .map_err(StoreError::io("read volume header", &self.path(number)))?;
        FileHeader::decode(&buf[..n]).map_err(|reason| StoreError::Corrupt {
            what: format!("{} header", self.path(number).display()),
            reason: reason.into(),
        })
    }

    /// Reads and verifies the record at `loc`, which must belong to `id`.
    pub(crate) fn read(&self, loc: Location, id: u64) -> Result<Record, StoreError> {
        let file = self.reader(loc.volume)?;
        let len = usize::try_from(loc.len).map_err(|_| self.corrupt(loc, "record length"))?;
        let mut buf = vec![0u8; len];
        let n = read_full_at(&file, &mut buf, loc.offset)
            .map_err(StoreError::io("read record", &self.path(loc.volume)))?;
        if n < len {
            return Err(self.corrupt(loc, "record is cut short"));
        }
        let header = RecordHeader::decode(&buf).map_err(|r| self.corrupt(loc, r))?;
        if header.id != id || header.kind != RecordKind::Put || header.record_len() != loc.len {
            return Err(self.corrupt(loc, "record does not belong to this id"));
        }
        if !format::body_matches(&header, &buf[RECORD_HEADER_LEN..]) {
            return Err(self.corrupt(loc, "checksum mismatch"));
        }
        let mut meta = buf.split_off(RECORD_HEADER_LEN);
        let data = meta.split_off(header.meta_len as usize);
        Ok(Record { meta, data })
    }

    /// Scans volume `number` from `from` (0 means just after the file header) to its end.
    pub(crate) fn scan(&self, number: u32, from: u64) -> Result<Scan, StoreError> {
        let path = self.path(number);
        let mut file = File::open(&path).map_err(StoreError::io("open volume", &path))?;
        let start = from.max(FILE_HEADER_LEN);
        let file_len = file
            .metadata()
            .map_err(StoreError::io("stat volume", &path))?
            .len();
        file.seek(SeekFrom::Start(start))
            .map_err(StoreError::io("seek volume", &path))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        scan_records(reader, number, start, file_len).map_err(StoreError::io("scan volume", &path))
    }

    /// Cuts volume `number` at `len` bytes (used to drop a torn tail) and syncs it.
    pub(crate) fn truncate(&self, number: u32, len: u64) -> Result<(), StoreError> {
        let path = self.path(number);
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(StoreError::io("open volume", &path))?;
        file.set_len(len)
            .map_err(StoreError::io("truncate volume", &path))?;
        file.sync_all()
            .map_err(StoreError::io("sync volume", &path))
    }

    /// Appends one record to the active volume, starting a new volume first if the active one is
    /// full (or none is open). Not durable until [`VolumeSet::sync`].
    pub(crate) fn append(
        &self,
        kind: RecordKind,
        id: u64,
        meta: &[u8],
        data: &[u8],
        id_floor: u64,
    ) -> Result<Location, StoreError> {
        let record = format::encode_record(kind, id, meta, data);
        let mut guard = lock(&self.active);
        let needs_new = match guard.as_ref() {
            None => true,
            Some(a) => {
                a.len > FILE_HEADER_LEN && a.len + record.len() as u64 > self.max_volume_bytes
            }
        };
        if needs_new {
            if let Some(old) = guard.take() {
                old.file
                    .sync_data()
                    .map_err(StoreError::io("sync volume", &self.path(old.number)))?;
            }
            *guard = Some(self.create_volume(id_floor)?);
        }
        let active = guard.as_mut().expect("active volume was just ensured");
        let path = self.path(active.number);
        active
            .file
            .write_all(&record)
            .map_err(StoreError::io("append record", &path))?;
        let loc = Location {
            volume: active.number,
            offset: active.len,
            len: record.len() as u64,
        };
        active.len += record.len() as u64;
        Ok(loc)
    }

    /// Makes every appended record durable.
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        let guard = lock(&self.active);
        if let Some(a) = guard.as_ref() {
            a.file
                .sync_data()
                .map_err(StoreError::io("sync volume", &self.path(a.number)))?;
        }
        Ok(())
    }

    /// Continues appending to volume `number` of length `len` (after recovery).
    pub(crate) fn resume(&self, number: u32, len: u64) -> Result<(), StoreError> {
        let path = self.path(number);
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(StoreError::io("open volume", &path))?;
        *lock(&self.active) = Some(Active { number, file, len });
        Ok(())
    }

    /// Seals the active volume: the next append starts a new one.
    pub(crate) fn seal(&self) -> Result<(), StoreError> {
        let mut guard = lock(&self.active);
        if let Some(old) = guard.take() {
            old.file
                .sync_data()
                .map_err(StoreError::io("sync volume", &self.path(old.number)))?;
        }
        Ok(())
    }

    /// Closes the active volume without syncing it (its tail is about to be cut off).
    pub(crate) fn abandon(&self) {
        lock(&self.active).take();
    }

    /// The length of volume `number` on disk.
    pub(crate) fn file_len(&self, number: u32) -> Result<u64, StoreError> {
        let path = self.path(number);
        Ok(fs::metadata(&path)
            .map_err(StoreError::io("stat volume", &path))?
            .len())
    }

    /// The active volume's number and length, if one is open.
    pub(crate) fn active(&self) -> Option<(u32, u64)> {
        let guard = lock(&self.active);
        guard.as_ref().map(|a| (a.number, a.len))
    }

    /// Deletes volume `number` (after compaction moved its live records).
    pub(crate) fn remove(&self, number: u32) -> Result<(), StoreError> {
        write(&self.readers).remove(&number);
        let path = self.path(number);
        fs::remove_file(&path).map_err(StoreError::io("remove volume", &path))?;
        sync_dir(&self.dir)
    }

    /// Total bytes of all volume files.
    pub(crate) fn disk_bytes(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        for n in self.volumes()? {
            let path = self.path(n);
            total += fs::metadata(&path)
                .map_err(StoreError::io("stat volume", &path))?
                .len();
        }
        Ok(total)
    }

    fn create_volume(&self, id_floor: u64) -> Result<Active, StoreError> {
        let number = self.volumes()?.last().map_or(1, |n| n + 1);
        let path = self.path(number);
        let header = FileHeader {
            volume: number,
            set: self.set,
            id_floor,
        };
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(StoreError::io("create volume", &path))?;
        let written = file
            .write_all(&header.encode())
            .map_err(StoreError::io("write volume header", &path))
            .and_then(|()| {
                file.sync_all()
                    .map_err(StoreError::io("sync volume", &path))
            })
            .and_then(|()| sync_dir(&self.dir));
        if let Err(e) = written {
            // A volume without its header holds nothing: do not leave it behind (recovery
            // removes one that a crash leaves).
            drop(file);
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(Active {
            number,
            file,
            len: FILE_HEADER_LEN,
        })
    }

    fn reader(&self, number: u32) -> Result<Arc<File>, StoreError> {
        if let Some(f) = read(&self.readers).get(&number) {
            return Ok(f.clone());
        }
        let path = self.path(number);
        let file = match File::open(&path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(StoreError::VolumeGone { volume: number });
            }
            Err(e) => return Err(StoreError::io("open volume", &path)(e)),
        };
        write(&self.readers).insert(number, file.clone());
        Ok(file)
    }

    fn corrupt(&self, loc: Location, reason: &str) -> StoreError {
        StoreError::Corrupt {
            what: format!(
                "{} at offset {}",
                self.path(loc.volume).display(),
                loc.offset
            ),
            reason: reason.into(),
        }
    }
}

/// Scans the records of volume `number` from `reader`, which stands at byte `start` of a file
/// `file_len` bytes long, to the end or to the first bytes that are not a valid record. The
/// `volume` fuzz target runs this over arbitrary bytes.
pub(crate) fn scan_records(
    mut reader: impl Read,
    number: u32,
    start: u64,
    file_len: u64,
) -> std::io::Result<Scan> {
    let mut records = Vec::new();
    let mut offset = start;
    let mut invalid_tail = None;
    while offset < file_len {
        let mut head = [0u8; RECORD_HEADER_LEN];
        if file_len - offset < RECORD_HEADER_LEN as u64 {
            invalid_tail = Some("record header cut short");
            break;
        }
        reader.read_exact(&mut head)?;
        let header = match RecordHeader::decode(&head) {
            Ok(h) => h,
            Err(reason) => {
                invalid_tail = Some(reason);
                break;
            }
        };
        if offset + header.record_len() > file_len {
            invalid_tail = Some("record body cut short");
            break;
        }
        let mut body = vec![0u8; (header.meta_len + header.data_len) as usize];
        reader.read_exact(&mut body)?;
        if !format::body_matches(&header, &body) {
            invalid_tail = Some("record checksum mismatch");
            break;
        }
        body.truncate(header.meta_len as usize);
        records.push(ScannedRecord {
            kind: header.kind,
            id: header.id,
            location: Location {
                volume: number,
                offset,
                len: header.record_len(),
            },
            meta: body,
        });
        offset += header.record_len();
    }
    Ok(Scan {
        records,
        end: offset,
        invalid_tail,
    })
}

fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Syncs a directory so that created, renamed or removed entries are durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    ndpipe_util::fs::sync_dir(dir).map_err(StoreError::io("sync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_scan_read_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let set = VolumeSet::open(dir.path(), 1, 1 << 20).unwrap();
        let a = set
            .append(RecordKind::Put, 1, b"m1", b"data one", 1)
            .unwrap();
        let b = set
            .append(RecordKind::Put, 2, b"m2", b"data two", 1)
            .unwrap();
        set.append(RecordKind::Tombstone, 1, b"", b"", 1).unwrap();
        set.sync().unwrap();
        assert_eq!(set.read(b, 2).unwrap().data, b"data two");
        assert!(
            set.read(a, 2).is_err(),
            "a record must only be read for its own id"
        );

        // A half-written record at the tail.
        let path = set.path(1);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let rec = format::encode_record(RecordKind::Put, 3, b"m3", b"data three");
        f.write_all(&rec[..rec.len() - 4]).unwrap();
        let scan = set.scan(1, 0).unwrap();
        assert_eq!(scan.records.len(), 3);
        assert_eq!(scan.records[2].kind, RecordKind::Tombstone);
        assert_eq!(scan.invalid_tail, Some("record body cut short"));
        set.truncate(1, scan.end).unwrap();
        let again = set.scan(1, 0).unwrap();
        assert!(again.invalid_tail.is_none());
        assert_eq!(again.end, scan.end);
    }

    #[test]
    fn a_flipped_byte_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let set = VolumeSet::open(dir.path(), 1, 1 << 20).unwrap();
        let loc = set
            .append(RecordKind::Put, 7, b"meta", b"some photo bytes", 1)
            .unwrap();
        set.sync().unwrap();
        let path = set.path(1);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0xFF;
        fs::write(&path, bytes).unwrap();
        let reopened = VolumeSet::open(dir.path(), 1, 1 << 20).unwrap();
        assert!(matches!(
            reopened.read(loc, 7),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn volumes_roll_at_the_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let set = VolumeSet::open(dir.path(), 1, 200).unwrap();
        for id in 0..5 {
            set.append(RecordKind::Put, id, b"", &[0u8; 100], id)
                .unwrap();
        }
        set.sync().unwrap();
        assert_eq!(set.volumes().unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(set.header(4).unwrap().id_floor, 3);
    }
}
