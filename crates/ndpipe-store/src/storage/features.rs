//! The feature store: one f16 feature vector per (backbone version, photo).
//!
//! Features are what fine-tuning consumes, so keeping them means a head-only model update can
//! re-label the store, and re-training with an unchanged backbone can re-read features instead
//! of re-running the backbone. Values carry a version byte: `[1, dtype=1 (f16), dim u16 LE,
//! dim * f16 LE]`.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::storage::StoreError;
use crate::storage::db::Db;

const FEATURES: TableDefinition<'static, (&str, u64), &[u8]> = TableDefinition::new("features");
const BACKBONES: TableDefinition<'static, &str, ()> = TableDefinition::new("backbones");
const VALUE_VERSION: u8 = 1;
const DTYPE_F16: u8 = 1;

/// Feature vectors keyed by backbone version and photo id (`DATA/store/features.redb`).
///
/// A building block: a PipeStore owns one and hands it to online labelling, re-labelling,
/// extraction for the Tuner and deletes; a benchmark opens one to run a [`crate::Relabeler`].
///
/// Bytes of the feature store a PipeStore caches in memory unless configured otherwise: about
/// 50,000 photos' features of a 1,280-wide backbone.
pub const DEFAULT_FEATURE_CACHE_BYTES: usize = 128 << 20;

/// After an I/O failure (a full disk) the file is opened again by itself, so features are
/// written again once space returns.
pub struct FeatureStore {
    db: Db,
    hook: OnceLock<Arc<dyn FeatureHook>>,
}

/// Told of every committed change of stored features (the similarity index follows the store
/// by it): `backbone` is the one written, `None` for a removal under every backbone.
pub(crate) trait FeatureHook: Send + Sync {
    /// The features of `ids` changed.
    fn changed(&self, backbone: Option<&str>, ids: &[u64]);
}

impl FeatureStore {
    /// Opens or creates the store at `path`, with at most `cache_bytes` of it cached in
    /// memory ([`DEFAULT_FEATURE_CACHE_BYTES`] is the PipeStore's default).
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        Ok(FeatureStore {
            db: Db::open(path, cache_bytes, create_tables)?,
            hook: OnceLock::new(),
        })
    }

    /// Tells `hook` of every later change; a store takes one hook (false when it has one).
    pub(crate) fn set_hook(&self, hook: Arc<dyn FeatureHook>) -> bool {
        self.hook.set(hook).is_ok()
    }

    fn notify(&self, backbone: Option<&str>, ids: &[u64]) {
        if let Some(hook) = self.hook.get() {
            hook.changed(backbone, ids);
        }
    }

    /// Stores the features of many photos under `backbone` in one transaction.
    pub(crate) fn put_many(
        &self,
        backbone: &str,
        rows: &[(u64, &[f32])],
    ) -> Result<(), StoreError> {
        let encoded = rows
            .iter()
            .map(|(id, features)| Ok((*id, encode(features)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.put_rows(backbone, &encoded)
    }

    /// Stores encoded features under `backbone` in one transaction.
    fn put_rows(&self, backbone: &str, rows: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        self.db.write(|db| {
            let txn = db.begin_write().map_err(StoreError::index)?;
            {
                txn.open_table(BACKBONES)
                    .map_err(StoreError::index)?
                    .insert(backbone, ())
                    .map_err(StoreError::index)?;
                let mut table = txn.open_table(FEATURES).map_err(StoreError::index)?;
                for (id, value) in rows {
                    table
                        .insert((backbone, *id), value.as_slice())
                        .map_err(StoreError::index)?;
                }
            }
            txn.commit().map_err(StoreError::index)
        })?;
        let ids: Vec<u64> = rows.iter().map(|(id, _)| *id).collect();
        self.notify(Some(backbone), &ids);
        Ok(())
    }

    /// The features of one photo under `backbone` (what a benchmark compares photos by).
    pub fn get(&self, backbone: &str, id: u64) -> Result<Option<Vec<f32>>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(FEATURES).map_err(StoreError::index)?;
            match table.get((backbone, id)).map_err(StoreError::index)? {
                Some(v) => decode(id, v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    /// The features of one photo under `backbone` as stored (the encoding of the module docs):
    /// what a copy of the photo carries to another node.
    pub(crate) fn encoded(&self, backbone: &str, id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(FEATURES).map_err(StoreError::index)?;
            Ok(table
                .get((backbone, id))
                .map_err(StoreError::index)?
                .map(|v| v.value().to_vec()))
        })
    }

    /// Every backbone's stored features of photo `id`, encoded: what a benchmark or a test
    /// compares between the copies of a photo.
    pub fn photo_features(&self, id: u64) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(FEATURES).map_err(StoreError::index)?;
            let mut out = Vec::new();
            for item in txn
                .open_table(BACKBONES)
                .map_err(StoreError::index)?
                .iter()
                .map_err(StoreError::index)?
            {
                let backbone = item.map_err(StoreError::index)?.0.value().to_string();
                if let Some(v) = table
                    .get((backbone.as_str(), id))
                    .map_err(StoreError::index)?
                {
                    out.push((backbone.clone(), v.value().to_vec()));
                }
            }
            Ok(out)
        })
    }

    /// Stores features of photo `id` under `backbone` that arrive encoded (a copy from another
    /// node), after checking that they decode to `dim` values.
    pub(crate) fn put_encoded(
        &self,
        backbone: &str,
        id: u64,
        encoded: &[u8],
        dim: usize,
    ) -> Result<(), StoreError> {
        check_encoded(id, encoded, dim)?;
        self.put_rows(backbone, &[(id, encoded.to_vec())])
    }

    /// Ids with features under `backbone`, ascending.
    pub(crate) fn ids(&self, backbone: &str) -> Result<Vec<u64>, StoreError> {
        self.db.read(|db| {
            let txn = db.begin_read().map_err(StoreError::index)?;
            let table = txn.open_table(FEATURES).map_err(StoreError::index)?;
            let mut out = Vec::new();
            for item in table
                .range((backbone, 0)..=(backbone, u64::MAX))
                .map_err(StoreError::index)?
            {
                let (k, _) = item.map_err(StoreError::index)?;
                out.push(k.value().1);
            }
            Ok(out)
        })
    }

    /// Removes a photo's features under every backbone.
    pub(crate) fn remove_photo(&self, id: u64) -> Result<(), StoreError> {
        self.db.write(|db| {
            let txn = db.begin_write().map_err(StoreError::index)?;
            {
                let mut backbones = Vec::new();
                for item in txn
                    .open_table(BACKBONES)
                    .map_err(StoreError::index)?
                    .iter()
                    .map_err(StoreError::index)?
                {
                    backbones.push(item.map_err(StoreError::index)?.0.value().to_string());
                }
                let mut table = txn.open_table(FEATURES).map_err(StoreError::index)?;
                for b in &backbones {
                    table.remove((b.as_str(), id)).map_err(StoreError::index)?;
                }
            }
            txn.commit().map_err(StoreError::index)
        })?;
        self.notify(None, &[id]);
        Ok(())
    }
}

/// Creates the tables of a new feature store; one that has them is not written to (so that it
/// opens on a full disk).
fn create_tables(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(StoreError::index)?;
    let present = txn.open_table(FEATURES).is_ok() && txn.open_table(BACKBONES).is_ok();
    drop(txn);
    if present {
        return Ok(());
    }
    let txn = db.begin_write().map_err(StoreError::index)?;
    txn.open_table(FEATURES).map_err(StoreError::index)?;
    txn.open_table(BACKBONES).map_err(StoreError::index)?;
    txn.commit().map_err(StoreError::index)
}

/// Checks that `encoded` features of photo `id` decode to `dim` values.
pub(crate) fn check_encoded(id: u64, encoded: &[u8], dim: usize) -> Result<(), StoreError> {
    let len = decode(id, encoded)?.len();
    if len != dim {
        return Err(StoreError::Corrupt {
            what: format!("features of photo {id}"),
            reason: format!("{len} values where the backbone makes {dim}"),
        });
    }
    Ok(())
}

/// `features` as the store keeps them.
pub(crate) fn encode(features: &[f32]) -> Result<Vec<u8>, StoreError> {
    let dim = u16::try_from(features.len()).map_err(|_| StoreError::FeaturesTooLong {
        len: features.len(),
    })?;
    let mut out = Vec::with_capacity(4 + features.len() * 2);
    out.push(VALUE_VERSION);
    out.push(DTYPE_F16);
    out.extend_from_slice(&dim.to_le_bytes());
    ndpipe_util::f16::encode_into(features, &mut out);
    Ok(out)
}

fn decode(id: u64, b: &[u8]) -> Result<Vec<f32>, StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt {
        what: format!("features of photo {id}"),
        reason: reason.into(),
    };
    if b.len() < 4 || b[0] != VALUE_VERSION || b[1] != DTYPE_F16 {
        return Err(corrupt("unknown feature encoding"));
    }
    let dim = usize::from(u16::from_le_bytes([b[2], b[3]]));
    if b.len() != 4 + dim * 2 {
        return Err(corrupt("length does not match the dimension"));
    }
    Ok(ndpipe_util::f16::decode(&b[4..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_round_trip_per_backbone_and_are_removed_with_the_photo() {
        let dir = tempfile::tempdir().unwrap();
        let fs =
            FeatureStore::open(&dir.path().join("f.redb"), DEFAULT_FEATURE_CACHE_BYTES).unwrap();
        let a = [0.5f32, -1.25, 3.0];
        let b = [1.0f32, 2.0, 4.0];
        fs.put_many("bb1", &[(1, &a), (2, &b)]).unwrap();
        fs.put_many("bb2", &[(1, &b)]).unwrap();
        assert_eq!(fs.get("bb1", 1).unwrap().unwrap(), a);
        assert_eq!(fs.get("bb2", 1).unwrap().unwrap(), b);
        assert_eq!(fs.ids("bb1").unwrap(), vec![1, 2]);
        fs.remove_photo(1).unwrap();
        assert_eq!(fs.get("bb1", 1).unwrap(), None);
        assert_eq!(fs.get("bb2", 1).unwrap(), None);
        assert_eq!(fs.ids("bb1").unwrap(), vec![2]);
    }

    #[test]
    fn encoded_features_copy_byte_for_byte_and_malformed_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let from =
            FeatureStore::open(&dir.path().join("a.redb"), DEFAULT_FEATURE_CACHE_BYTES).unwrap();
        let to =
            FeatureStore::open(&dir.path().join("b.redb"), DEFAULT_FEATURE_CACHE_BYTES).unwrap();
        from.put_many("bb1", &[(7, &[0.5f32, -1.0, 2.0])]).unwrap();
        let sent = from.encoded("bb1", 7).unwrap().unwrap();
        to.put_encoded("bb1", 7, &sent, 3).unwrap();
        assert_eq!(
            to.photo_features(7).unwrap(),
            vec![("bb1".to_string(), sent.clone())]
        );
        assert!(matches!(
            to.put_encoded("bb1", 8, &sent[..sent.len() - 1], 3),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            to.put_encoded("bb1", 8, &sent, 4),
            Err(StoreError::Corrupt { .. })
        ));
        assert_eq!(to.photo_features(8).unwrap(), vec![]);
    }

    #[test]
    fn f16_keeps_three_significant_digits() {
        let v: Vec<f32> = (0..1280).map(|i| (i as f32).sqrt() * 0.37).collect();
        let back = decode(1, &encode(&v).unwrap()).unwrap();
        for (x, y) in v.iter().zip(&back) {
            assert!((x - y).abs() <= x.abs() * 1e-3 + 1e-4, "{x} vs {y}");
        }
    }
}
