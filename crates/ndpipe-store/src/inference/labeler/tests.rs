use ndpipe_model::{HeadWeights, InferenceBackend};

use super::*;
use crate::inference::model::TaskModel;
use crate::ingest::{IngestConfig, Ingestor};
use crate::testing::{Setup, png, setup};

/// A labeller over `s`'s fake model as version `fake-v1`.
fn start(s: &Setup, metrics: &Arc<StoreMetrics>, config: LabelerConfig) -> Labeler {
    let mut model = ActiveModel::pretrained(s.fake.clone());
    model.tasks[0].version = "fake-v1".into();
    Labeler::start(
        SharedModel::new(model),
        s.store.clone(),
        s.features.clone(),
        s.catalog.clone(),
        metrics.clone(),
        config,
    )
    .unwrap()
}

#[tokio::test]
async fn concurrent_uploads_share_batches_and_get_labels_and_features() {
    let s = setup();
    // A queue of 4 and a backlog of 2 for 16 uploads: the rest wait in the catalog as
    // unlabelled, and are labelled from their stored tensors once the backlog refills.
    let config = LabelerConfig {
        max_batch: 8,
        max_wait: Duration::from_millis(50),
        queue: 4,
        backlog: 2,
        ..LabelerConfig::default()
    };
    let metrics = Arc::new(StoreMetrics::default());
    let labeler = start(&s, &metrics, config);
    let ingestor = Arc::new(
        Ingestor::new(
            s.store.clone(),
            s.features.clone(),
            s.catalog.clone(),
            metrics.clone(),
            IngestConfig::default(),
        )
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
    assert_eq!(metrics.photos.get(), 16, "ingest counts the photos it adds");
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
        assert_eq!(s.features.get(&backbone, *id).unwrap().unwrap().len(), 16);
    }
    assert!(
        s.fake.batches() < 16,
        "16 concurrent uploads must share batches, ran {}",
        s.fake.batches()
    );
    assert!(ingestor.delete(ids[0]).await.unwrap());
    assert_eq!(metrics.photos.get(), 15, "and the photos it deletes");
    // A replicated upload is labelled first: what its copies get carries the features as
    // stored, and its labels are filed once it is catalogued.
    let backbone = s.fake.info().backbone_version.clone();
    let sent = std::sync::Mutex::new(None);
    let id = ingestor
        .ingest_then(png(98), None, |id, photo| {
            *sent.lock().unwrap() = Some((id, photo.features));
            async { Ok(()) }
        })
        .await
        .unwrap()
        .id;
    let (copied, features) = sent.into_inner().unwrap().unwrap();
    assert_eq!(copied, id);
    let (sent_backbone, sent_features) = features.expect("the copy carries features");
    assert_eq!(sent_backbone, backbone);
    assert_eq!(
        s.features.encoded(&backbone, id).unwrap(),
        Some(sent_features)
    );
    let preds = s.catalog.predictions(id).unwrap();
    assert_eq!((preds[0].0.as_str(), preds[0].1.len()), ("fake-v1", 5));
    ingestor.stop_labeler();
    let late = ingestor.ingest(png(99), None).await.unwrap().id;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        s.catalog.predictions(late).unwrap().is_empty(),
        "a stopped labeler labels nothing"
    );
}

#[tokio::test]
async fn a_backlog_past_its_bound_refills_from_the_catalog_and_labels_every_photo() {
    let s = setup();
    let metrics = Arc::new(StoreMetrics::default());
    let ingestor = Ingestor::new(
        s.store.clone(),
        s.features.clone(),
        s.catalog.clone(),
        metrics.clone(),
        IngestConfig::default(),
    );
    let mut ids = Vec::new();
    for i in 0..12u8 {
        ids.push(ingestor.ingest(png(i), None).await.unwrap().id);
    }
    let config = LabelerConfig {
        max_batch: 4,
        backlog: 3,
        ..LabelerConfig::default()
    };
    let labeler = start(&s, &metrics, config);
    labeler.enqueue_stored(ids.clone());
    assert_eq!(
        metrics.label_backlog.get(),
        3,
        "the backlog holds only its bound"
    );
    let all_labelled = async {
        while !ids
            .iter()
            .all(|id| !s.catalog.predictions(*id).unwrap().is_empty())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // A guard against hanging, not a speed target.
    tokio::time::timeout(Duration::from_secs(120), all_labelled)
        .await
        .expect("the photos past the bound were never labelled");
    assert!(s.catalog.unlabelled("fake-v1").unwrap().is_empty());
    labeler.stop();
}

#[tokio::test]
async fn every_task_labels_a_batch_from_one_backbone_run() {
    let s = setup();
    let dim = s.fake.info().feature_dim;
    let classes = vec!["shirt".to_string(), "shoe".to_string()];
    let mut weights = vec![0.0; 2 * dim];
    weights[0] = 1.0;
    weights[dim + 1] = 1.0;
    let head = HeadWeights::new(classes, dim, weights, vec![0.0, 0.0]).unwrap();
    let model = ActiveModel::named(s.fake.clone(), "fake-v1").with_task(TaskModel {
        task: "fashion".parse().unwrap(),
        version: "fashion-v1".into(),
        head: Some(Arc::new(head)),
        floor: None,
    });
    let config = LabelerConfig {
        max_batch: 8,
        ..LabelerConfig::default()
    };
    let metrics = Arc::new(StoreMetrics::default());
    let ingestor = Ingestor::new(
        s.store.clone(),
        s.features.clone(),
        s.catalog.clone(),
        metrics.clone(),
        IngestConfig::default(),
    );
    let mut ids = Vec::new();
    for i in 0..8u8 {
        ids.push(ingestor.ingest(png(i), None).await.unwrap().id);
    }
    let labeler = Labeler::start(
        SharedModel::new(model),
        s.store.clone(),
        s.features.clone(),
        s.catalog.clone(),
        metrics.clone(),
        config,
    )
    .unwrap();
    labeler.enqueue_stored(ids.clone());
    let labelled = async {
        while !ids
            .iter()
            .all(|id| s.catalog.predictions(*id).unwrap().len() == 2)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // A guard against hanging, not a speed target.
    tokio::time::timeout(Duration::from_secs(120), labelled)
        .await
        .expect("the photos were never labelled by both tasks");
    labeler.stop();
    assert_eq!(
        s.fake.batches(),
        1,
        "both tasks label the batch from one backbone run"
    );
    for id in &ids {
        let versions: Vec<String> = s
            .catalog
            .predictions(*id)
            .unwrap()
            .into_iter()
            .map(|(version, preds)| {
                assert!(!preds.is_empty());
                version
            })
            .collect();
        assert!(versions.contains(&"fake-v1".to_string()), "{versions:?}");
        assert!(versions.contains(&"fashion-v1".to_string()), "{versions:?}");
    }
    let counted = |task: &str| {
        ["class", "other"]
            .iter()
            .map(|outcome| {
                let labels = crate::metrics::TaskOutcome {
                    task: task.into(),
                    outcome: (*outcome).into(),
                };
                metrics.task_labels.get_or_create(&labels).get()
            })
            .sum::<u64>()
    };
    assert_eq!((counted("general"), counted("fashion")), (8, 8));
}
