//! Helpers of the crate's unit tests.

use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::{Catalog, SqliteCatalog};
use ndpipe_model::FakeBackend;

use crate::storage::{DEFAULT_FEATURE_CACHE_BYTES, FeatureStore, PhotoStore, StoreConfig};

/// A PNG of 64x48 whose pixels depend on `seed`.
pub(crate) fn png(seed: u8) -> bytes::Bytes {
    let img = image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([seed, (x * 4) as u8, (y * 5) as u8])
    });
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out.into()
}

/// A store, feature store and catalog in a temporary directory, and a fake model.
pub(crate) struct Setup {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) store: Arc<PhotoStore>,
    pub(crate) features: Arc<FeatureStore>,
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) fake: Arc<FakeBackend>,
}

/// A fresh [`Setup`] whose fake model (16-d features, 10 classes, batches of 8) is slow enough
/// that 16 concurrent uploads overflow a labelling queue of 4.
pub(crate) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = PhotoStore::open(&dir.path().join("store"), &StoreConfig::default()).unwrap();
    Setup {
        store: Arc::new(store),
        features: Arc::new(
            FeatureStore::open(
                &dir.path().join("features.redb"),
                DEFAULT_FEATURE_CACHE_BYTES,
            )
            .unwrap(),
        ),
        catalog: Arc::new(SqliteCatalog::open(&dir.path().join("c.sqlite")).unwrap()),
        fake: Arc::new(
            FakeBackend::new(16, 10)
                .with_max_batch(8)
                .with_latency(Duration::from_millis(40)),
        ),
        _dir: dir,
    }
}
