//! Byte layout of volume files and records. See `docs/volume-format.md` for the full account.

/// Length of the header at the start of every volume file.
pub(crate) const FILE_HEADER_LEN: u64 = 32;
/// Length of the fixed part of every record.
pub(crate) const RECORD_HEADER_LEN: usize = 32;

const FILE_MAGIC: &[u8; 6] = b"NDPVOL";
const FILE_VERSION: u16 = 1;
const RECORD_MAGIC: &[u8; 4] = b"NDPR";
const RECORD_VERSION: u8 = 1;

/// What a record says about its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// The id's bytes are in this record.
    Put,
    /// The id was deleted.
    Tombstone,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Put => 1,
            RecordKind::Tombstone => 2,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(RecordKind::Put),
            2 => Some(RecordKind::Tombstone),
            _ => None,
        }
    }
}

/// The header of a volume file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileHeader {
    /// The volume's number within its set; also its position in replay order.
    pub(crate) volume: u32,
    /// Which set the volume belongs to (1 = photos, 2 = tensors).
    pub(crate) set: u8,
    /// The store's next photo id when the volume was created: ids below it may have existed.
    pub(crate) id_floor: u64,
}

impl FileHeader {
    /// Serialises the header.
    pub(crate) fn encode(&self) -> [u8; FILE_HEADER_LEN as usize] {
        let mut b = [0u8; FILE_HEADER_LEN as usize];
        b[0..6].copy_from_slice(FILE_MAGIC);
        b[6..8].copy_from_slice(&FILE_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.volume.to_le_bytes());
        b[12] = self.set;
        b[16..24].copy_from_slice(&self.id_floor.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses a header, checking magic, version and checksum.
    pub(crate) fn decode(b: &[u8]) -> Result<Self, &'static str> {
        if b.len() < FILE_HEADER_LEN as usize {
            return Err("file shorter than its header");
        }
        if &b[0..6] != FILE_MAGIC {
            return Err("bad volume magic");
        }
        if u16::from_le_bytes([b[6], b[7]]) != FILE_VERSION {
            return Err("unknown volume version");
        }
        if crc32c::crc32c(&b[0..24]) != u32_at(b, 24) {
            return Err("volume header checksum mismatch");
        }
        Ok(FileHeader {
            volume: u32_at(b, 8),
            set: b[12],
            id_floor: u64_at(b, 16),
        })
    }
}

/// The fixed part of a record, parsed and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// Put or tombstone.
    pub(crate) kind: RecordKind,
    /// The photo id.
    pub(crate) id: u64,
    /// Length of the metadata that follows the header.
    pub(crate) meta_len: u32,
    /// Length of the data that follows the metadata.
    pub(crate) data_len: u32,
    /// CRC-32C of metadata and data together.
    pub(crate) body_crc: u32,
}

impl RecordHeader {
    /// Total length of the record on disk.
    pub(crate) fn record_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + u64::from(self.meta_len) + u64::from(self.data_len)
    }

    /// Parses and checks the fixed part of a record.
    pub(crate) fn decode(b: &[u8]) -> Result<Self, &'static str> {
        if b.len() < RECORD_HEADER_LEN {
            return Err("record header cut short");
        }
        if &b[0..4] != RECORD_MAGIC {
            return Err("bad record magic");
        }
        if crc32c::crc32c(&b[0..28]) != u32_at(b, 28) {
            return Err("record header checksum mismatch");
        }
        if b[4] != RECORD_VERSION {
            return Err("unknown record version");
        }
        let kind = RecordKind::from_code(b[5]).ok_or("unknown record kind")?;
        Ok(RecordHeader {
            kind,
            id: u64_at(b, 8),
            meta_len: u32_at(b, 16),
            data_len: u32_at(b, 20),
            body_crc: u32_at(b, 24),
        })
    }
}

/// Serialises a whole record (header, metadata, data).
pub(crate) fn encode_record(kind: RecordKind, id: u64, meta: &[u8], data: &[u8]) -> Vec<u8> {
    let meta_len = u32::try_from(meta.len()).expect("record metadata over 4 GiB; this is a bug");
    let data_len = u32::try_from(data.len()).expect("record data over 4 GiB; this is a bug");
    let mut body_crc = crc32c::crc32c(meta);
    body_crc = crc32c::crc32c_append(body_crc, data);
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + meta.len() + data.len());
    out.extend_from_slice(RECORD_MAGIC);
    out.push(RECORD_VERSION);
    out.push(kind.code());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&out[0..28]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(meta);
    out.extend_from_slice(data);
    out
}

/// Checks the body of a record against its header's checksum.
pub(crate) fn body_matches(header: &RecordHeader, body: &[u8]) -> bool {
    body.len() as u64 == u64::from(header.meta_len) + u64::from(header.data_len)
        && crc32c::crc32c(body) == header.body_crc
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_detects_flips() {
        let rec = encode_record(RecordKind::Put, 42, b"{\"a\":1}", b"payload");
        let h = RecordHeader::decode(&rec).unwrap();
        assert_eq!(h.id, 42);
        assert_eq!(h.kind, RecordKind::Put);
        assert_eq!(h.record_len(), rec.len() as u64);
        assert!(body_matches(&h, &rec[RECORD_HEADER_LEN..]));
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x10;
            let ok = RecordHeader::decode(&bad)
                .map(|h| body_matches(&h, &bad[RECORD_HEADER_LEN..]))
                .unwrap_or(false);
            assert!(!ok, "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn file_header_round_trips() {
        let h = FileHeader {
            volume: 3,
            set: 2,
            id_floor: 99,
        };
        assert_eq!(FileHeader::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[17] ^= 1;
        assert!(FileHeader::decode(&bad).is_err());
    }
}
