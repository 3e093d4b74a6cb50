//! Online labelling and re-labelling against the deterministic fake model.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndpipe_catalog::{Catalog, SqliteCatalog};
use ndpipe_model::{FakeBackend, ImageTensor, InferenceBackend};
use ndpipe_store::labeler::{ActiveModel, Labeler, LabelerConfig, SharedModel};
use ndpipe_store::metrics::StoreMetrics;
use ndpipe_store::relabel::{RelabelOptions, RelabelReport, Relabeler};
use ndpipe_store::{IngestConfig, Ingestor, PhotoStore, StoreConfig};

fn png(seed: u8) -> bytes::Bytes {
    let img = image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([seed, (x * 4) as u8, (y * 5) as u8])
    });
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out.into()
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<PhotoStore>,
    catalog: Arc<dyn Catalog>,
    fake: Arc<FakeBackend>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = PhotoStore::open(&dir.path().join("store"), &StoreConfig::default()).unwrap();
    Setup {
        store: Arc::new(store),
        catalog: Arc::new(SqliteCatalog::open(&dir.path().join("c.sqlite")).unwrap()),
        // Slow enough that 16 concurrent uploads overflow a queue of 4.
        fake: Arc::new(
            FakeBackend::new(16, 10)
                .with_max_batch(8)
                .with_latency(Duration::from_millis(40)),
        ),
        _dir: dir,
    }
}

#[tokio::test]
async fn concurrent_uploads_share_batches_and_get_labels_and_features() {
    let s = setup();
    let model = ActiveModel {
        backend: s.fake.clone(),
        version: "fake-v1".into(),
        head: None,
    };
    // A queue of 4 for 16 uploads: the rest go through the backlog, from their stored tensors.
    let config = LabelerConfig {
        max_batch: 8,
        max_wait: Duration::from_millis(50),
        queue: 4,
        ..LabelerConfig::default()
    };
    let labeler = Labeler::start(
        SharedModel::new(model),
        s.store.clone(),
        s.catalog.clone(),
        Arc::new(StoreMetrics::default()),
        config,
    )
    .unwrap();
    let ingestor = Arc::new(
        Ingestor::new(s.store.clone(), s.catalog.clone(), IngestConfig::default())
            .with_labeler(labeler),
    );
    let uploads: Vec<_> = (0..16u8)
        .map(|i| {
            let ing = ingestor.clone();
            tokio::spawn(async move { ing.ingest(png(i), None).await.unwrap().id })
        })
        .collect();
    let mut ids = Vec::new();
    for u in uploads {
        ids.push(u.await.unwrap());
    }
    for id in &ids {
        let labelled = async {
            loop {
                let preds = s.catalog.predictions(*id).unwrap();
                if !preds.is_empty() {
                    return preds;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        // A guard against hanging, not a speed target.
        let preds = tokio::time::timeout(Duration::from_secs(120), labelled)
            .await
            .unwrap_or_else(|_| panic!("photo {id} was never labelled"));
        assert_eq!(preds[0].0, "fake-v1");
        assert_eq!(preds[0].1.len(), 5);
        let backbone = s.fake.info().backbone_version.clone();
        assert_eq!(
            s.store
                .features()
                .get(&backbone, *id)
                .unwrap()
                .unwrap()
                .len(),
            16
        );
    }
    assert!(
        s.fake.batches() < 16,
        "16 concurrent uploads must share batches, ran {}",
        s.fake.batches()
    );
}

#[tokio::test]
async fn relabel_matches_online_labels_and_counts_churn() {
    let s = setup();
    let ingestor = Ingestor::new(s.store.clone(), s.catalog.clone(), IngestConfig::default());
    let mut ids = Vec::new();
    for i in 0..20u8 {
        ids.push(ingestor.ingest(png(i * 10), None).await.unwrap().id);
    }
    let run = |version: &str| {
        let model = ActiveModel {
            backend: s.fake.clone(),
            version: version.into(),
            head: None,
        };
        let options = RelabelOptions {
            batch: 8,
            ..RelabelOptions::default()
        };
        let report = Mutex::new(RelabelReport::default());
        Relabeler {
            store: &s.store,
            catalog: &s.catalog,
            features: s.store.features_arc(),
            model: &model,
            options: &options,
        }
        .run(&report, &AtomicBool::new(false), |_| {})
        .unwrap();
        report.into_inner().unwrap()
    };
    let first = run("v1");
    assert_eq!((first.done, first.compared), (20, 0));
    let again = run("v1");
    assert_eq!((again.done, again.compared, again.changed), (20, 20, 0));
    let photo = s.store.tensor(ids[3]).unwrap().unwrap().1;
    let tensor: ImageTensor = ndpipe_model::TensorBlob::decode(&photo).unwrap();
    let direct = s.fake.run(&[tensor]).unwrap();
    let expected = ndpipe_store::labeler::predictions(s.fake.info(), &direct, 0, 5);
    assert_eq!(
        s.catalog.predictions(ids[3]).unwrap()[0].1,
        expected,
        "batched = single"
    );
    s.fake.set_failing(true);
    let model = ActiveModel {
        backend: s.fake.clone(),
        version: "v2".into(),
        head: None,
    };
    let report = Mutex::new(RelabelReport::default());
    let options = RelabelOptions::default();
    let err = Relabeler {
        store: &s.store,
        catalog: &s.catalog,
        features: s.store.features_arc(),
        model: &model,
        options: &options,
    }
    .run(&report, &AtomicBool::new(false), |_| {});
    assert!(err.is_err(), "a failing model fails the job");
}
