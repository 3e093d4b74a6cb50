//! The embedded index: photo id -> where its original and tensor records are, plus metadata.
//!
//! The index is a cache of the volumes: every entry can be recomputed by scanning them. Per
//! volume it records a watermark (the offset up to which records are reflected), so a restart
//! only replays what was written after the last commit.

use std::path::Path;

use ndpipe_catalog::PhotoMeta;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::storage::StoreError;
use crate::storage::db::Db;
use crate::storage::volume::Location;

const PHOTOS: TableDefinition<'static, u64, &[u8]> = TableDefinition::new("photos");
const META: TableDefinition<'static, &str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_id";
/// Version marker written before every encoded entry.
const ENTRY_VERSION: u8 = 1;

/// One index entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PhotoEntry {
    /// The original photo's record.
    pub(crate) photo: Location,
    /// The preprocessed tensor's record, once written.
    pub(crate) tensor: Option<Location>,
    /// Metadata.
    pub(crate) meta: PhotoMeta,
}

impl PhotoEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![ENTRY_VERSION];
        serde_json::to_writer(&mut out, self).expect("entry serialises; this is a bug");
        out
    }

    pub(crate) fn decode(id: u64, b: &[u8]) -> Result<Self, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            what: format!("index entry of photo {id}"),
            reason,
        };
        match b.split_first() {
            Some((&ENTRY_VERSION, rest)) => {
                serde_json::from_slice(rest).map_err(|e| corrupt(e.to_string()))
            }
            Some((v, _)) => Err(corrupt(format!("unknown entry version {v}"))),
            None => Err(corrupt("empty entry".into())),
        }
    }
}

/// A change applied to the index in one commit.
#[derive(Debug)]
pub(crate) enum Change {
    /// Insert or replace an entry.
    Put(u64, PhotoEntry),
    /// Set the photo location and metadata of an entry, keeping the tensor location of an
    /// existing one (a replayed photo record: its tensor may be indexed already).
    Photo(u64, Location, PhotoMeta),
    /// Set the tensor location of an existing entry (ignored if the entry is gone).
    Tensor(u64, Location),
    /// Remove an entry.
    Remove(u64),
}

/// The redb-backed index; opened again by itself after an I/O failure ([`Db`]).
pub(crate) struct Index {
    db: Db,
}

impl Index {
    /// Opens the index at `path`, creating it if absent, with at most `cache_bytes` of it
    /// cached in memory.
    pub(crate) fn open(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        Ok(Index {
            db: Db::open(path, cache_bytes, create_tables)?,
        })
    }

    /// The entry of `id`.
    pub(crate) fn get(&self, id: u64) -> Result<Option<PhotoEntry>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(PHOTOS).map_err(StoreError::index)?;
            match table.get(id).map_err(StoreError::index)? {
                Some(v) => Ok(Some(PhotoEntry::decode(id, v.value())?)),
                None => Ok(None),
            }
        })
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> Result<u64, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(PHOTOS).map_err(StoreError::index)?;
            table.len().map_err(StoreError::index)
        })
    }

    /// Whether the index is empty.
    pub(crate) fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }

    /// All entries in id order.
    pub(crate) fn entries(&self) -> Result<Vec<(u64, PhotoEntry)>, StoreError> {
        self.db.read(read_entries)
    }

    /// Up to `limit` photo ids above `after`, in order (a range read, not a scan).
    pub(crate) fn ids_after(&self, after: u64, limit: usize) -> Result<Vec<u64>, StoreError> {
        let Some(first) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(PHOTOS).map_err(StoreError::index)?;
            let mut out = Vec::new();
            for item in table.range(first..).map_err(StoreError::index)?.take(limit) {
                out.push(item.map_err(StoreError::index)?.0.value());
            }
            Ok(out)
        })
    }

    /// A metadata counter (next id, watermarks).
    pub(crate) fn meta(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(META).map_err(StoreError::index)?;
            Ok(table
                .get(key)
                .map_err(StoreError::index)?
                .map(|v| v.value()))
        })
    }

    /// The next photo id recorded at the last commit.
    pub(crate) fn next_id(&self) -> Result<Option<u64>, StoreError> {
        self.meta(NEXT_ID)
    }

    /// Applies `changes`, sets `watermarks` (and removes `dropped` ones) and `next_id`, in one
    /// durable transaction. After an I/O failure the index is opened again at its last commit.
    pub(crate) fn commit(
        &self,
        changes: &[Change],
        watermarks: &[(String, u64)],
        dropped: &[String],
        next_id: u64,
    ) -> Result<(), StoreError> {
        self.db.write(|db| {
            let txn = db.begin_write().map_err(StoreError::index)?;
            {
                let mut photos = txn.open_table(PHOTOS).map_err(StoreError::index)?;
                for change in changes {
                    apply(&mut photos, change)?;
                }
                let mut meta = txn.open_table(META).map_err(StoreError::index)?;
                for (key, value) in watermarks {
                    meta.insert(key.as_str(), *value)
                        .map_err(StoreError::index)?;
                }
                for key in dropped {
                    meta.remove(key.as_str()).map_err(StoreError::index)?;
                }
                meta.insert(NEXT_ID, next_id).map_err(StoreError::index)?;
            }
            txn.commit().map_err(StoreError::index)
        })
    }
}

/// Applies `changes` to a new index held in memory, with the code a commit runs, and returns
/// its entries as a read decodes them: the index side of a rebuild, for the `volume` fuzz
/// target.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn rebuild_in_memory(changes: &[Change]) -> Result<Vec<(u64, PhotoEntry)>, StoreError> {
    let db = redb::Builder::new()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .map_err(StoreError::index)?;
    create_tables(&db)?;
    let txn = db.begin_write().map_err(StoreError::index)?;
    {
        let mut photos = txn.open_table(PHOTOS).map_err(StoreError::index)?;
        for change in changes {
            apply(&mut photos, change)?;
        }
    }
    txn.commit().map_err(StoreError::index)?;
    read_entries(&db)
}

/// Every entry of `db`'s photo table in id order, decoded.
fn read_entries(db: &redb::Database) -> Result<Vec<(u64, PhotoEntry)>, StoreError> {
    let txn = db.begin_read().map_err(StoreError::index)?;
    let table = txn.open_table(PHOTOS).map_err(StoreError::index)?;
    let mut out = Vec::new();
    for item in table.iter().map_err(StoreError::index)? {
        let (k, v) = item.map_err(StoreError::index)?;
        out.push((k.value(), PhotoEntry::decode(k.value(), v.value())?));
    }
    Ok(out)
}

/// Applies one change to the photos table.
fn apply(photos: &mut redb::Table<'_, u64, &[u8]>, change: &Change) -> Result<(), StoreError> {
    let existing = |photos: &redb::Table<'_, u64, &[u8]>, id: u64| {
        photos
            .get(id)
            .map_err(StoreError::index)?
            .map(|v| PhotoEntry::decode(id, v.value()))
            .transpose()
    };
    let entry = match change {
        Change::Put(id, entry) => Some((*id, entry.clone())),
        Change::Photo(id, loc, meta) => {
            let tensor = existing(photos, *id)?.and_then(|e| e.tensor);
            Some((
                *id,
                PhotoEntry {
                    photo: *loc,
                    tensor,
                    meta: meta.clone(),
                },
            ))
        }
        Change::Tensor(id, loc) => existing(photos, *id)?.map(|mut entry| {
            entry.tensor = Some(*loc);
            (*id, entry)
        }),
        Change::Remove(id) => {
            photos.remove(*id).map_err(StoreError::index)?;
            None
        }
    };
    if let Some((id, entry)) = entry {
        photos
            .insert(id, entry.encode().as_slice())
            .map_err(StoreError::index)?;
    }
    Ok(())
}

/// Creates the tables of a new index; an index that has them is not written to (so that it
/// opens on a full disk).
fn create_tables(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(StoreError::index)?;
    let present = txn.open_table(PHOTOS).is_ok() && txn.open_table(META).is_ok();
    drop(txn);
    if present {
        return Ok(());
    }
    let txn = db.begin_write().map_err(StoreError::index)?;
    txn.open_table(PHOTOS).map_err(StoreError::index)?;
    txn.open_table(META).map_err(StoreError::index)?;
    txn.commit().map_err(StoreError::index)
}

/// The metadata key of a volume's watermark.
pub(crate) fn watermark_key(set: &str, volume: u32) -> String {
    format!("wm/{set}/{volume:08}")
}
