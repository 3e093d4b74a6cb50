//! The node's index against its feature store: changes followed, saved and reopened, damaged
//! or foreign files rebuilt, a crash reconciled, recall against exact search, and the batch
//! of neighbours above a least score (semantic duplicates).

use std::sync::Arc;
use std::time::Duration;

use ndpipe_model::FakeBackend;
use rand::{Rng, SeedableRng};

use super::ann::{AnnIndex, AnnOptions};
use super::front::Local;
use super::index::{IndexSettings, Queries, SimilarIndex};
use super::metrics::SimilarMetrics;
use super::persist::IndexDir;
use super::{Embedder, SimilarError, SimilarFront, front_settings};
use crate::inference::ActiveModel;
use crate::inference::model::SharedModel;
use crate::storage::{DEFAULT_FEATURE_CACHE_BYTES, FeatureStore, PhotoStore, StoreConfig};

const DIM: usize = 16;

struct Node {
    dir: tempfile::TempDir,
    /// The feature store this process has open (one at a time, as redb allows).
    open: Option<Arc<FeatureStore>>,
}

impl Node {
    fn new() -> Self {
        let mut node = Node {
            dir: tempfile::tempdir().unwrap(),
            open: None,
        };
        node.restart();
        node
    }

    fn features(&self) -> &FeatureStore {
        self.open.as_ref().unwrap()
    }

    /// Opens the feature store again, as a restarted process does (the index that followed
    /// it must be gone).
    fn restart(&mut self) {
        self.open = None;
        let path = self.dir.path().join("f.redb");
        self.open = Some(Arc::new(
            FeatureStore::open(&path, DEFAULT_FEATURE_CACHE_BYTES).unwrap(),
        ));
    }

    /// The index of a model with `classes` classes (its backbone is `fake-16x<classes>`).
    fn start(&self, classes: usize) -> Arc<SimilarIndex> {
        let model = model(classes);
        let settings = IndexSettings {
            dir: self.dir.path().join("index"),
            save_interval: Duration::from_secs(3600),
            options: AnnOptions::default(),
        };
        let index = SimilarIndex::start(
            self.open.clone().unwrap(),
            model,
            settings,
            SimilarMetrics::default(),
        )
        .unwrap();
        index.settle();
        index
    }

    fn index_dir(&self) -> IndexDir {
        IndexDir::new(self.dir.path().join("index"))
    }
}

/// A fake model with `classes` classes (its backbone is `fake-16x<classes>`).
fn model(classes: usize) -> SharedModel {
    SharedModel::new(ActiveModel::named(
        Arc::new(FakeBackend::new(DIM, classes)),
        "fake",
    ))
}

/// A vector pointing mostly along axis `id % DIM`.
fn vector(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|i| {
            if i == (id as usize) % DIM {
                1.0
            } else {
                0.01 * (id as f32 + i as f32).sin().abs()
            }
        })
        .collect()
}

fn put(features: &FeatureStore, backbone: &str, ids: impl IntoIterator<Item = u64>) {
    let vectors: Vec<(u64, Vec<f32>)> = ids.into_iter().map(|id| (id, vector(id))).collect();
    let rows: Vec<(u64, &[f32])> = vectors.iter().map(|(id, v)| (*id, v.as_slice())).collect();
    features.put_many(backbone, &rows).unwrap();
}

fn query<'a>(backbone: &'a str, v: &'a [f32], exclude: &'a [u64]) -> Queries<'a> {
    Queries {
        backbone,
        vectors: v,
        dim: DIM,
        k: 3,
        min_score: -1.0,
        exclude,
    }
}

const BB: &str = "fake-16x10";

#[test]
fn follows_the_feature_store_adds_and_removes() {
    let node = Node::new();
    let index = node.start(10);
    put(node.features(), BB, 1..=40);
    index.settle();
    assert_eq!(index.indexed(), (1..=40).collect::<Vec<_>>());
    let q = vector(5);
    let found = index.search(&query(BB, &q, &[])).unwrap();
    assert!(!found.building);
    assert_eq!(found.hits[0][0].0, 5);
    assert!((found.hits[0][0].1 - 1.0).abs() < 1e-3);
    let without = index.search(&query(BB, &q, &[5])).unwrap();
    assert!(without.hits[0].iter().all(|(id, _)| *id != 5));
    assert_eq!(without.hits[0].len(), 3);
    node.features().remove_photo(5).unwrap();
    put(node.features(), "another-backbone", [99]);
    index.settle();
    assert!(!index.indexed().contains(&5));
    assert!(
        !index.indexed().contains(&99),
        "only the active backbone is indexed"
    );
    let high = Queries {
        min_score: 0.99,
        ..query(BB, &q, &[])
    };
    assert!(
        index.search(&high).unwrap().hits[0]
            .iter()
            .all(|(_, s)| *s >= 0.99)
    );
    assert!(matches!(
        index.search(&query("other", &q, &[])),
        Err(SimilarError::OtherBackbone { .. })
    ));
    assert!(matches!(
        index.search(&Queries {
            dim: 3,
            ..query(BB, &q, &[])
        }),
        Err(SimilarError::BadQuery(_))
    ));
}

#[test]
fn a_damaged_index_file_is_rebuilt_from_the_feature_store() {
    let mut node = Node::new();
    put(node.features(), BB, 1..=30);
    let index = node.start(10);
    assert_eq!(index.indexed().len(), 30);
    index.stop();
    drop(index);
    node.restart();
    let file = node.index_dir().index_path(BB).expect("saved at stop");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    assert!(
        node.index_dir()
            .open(BB, DIM, AnnOptions::default())
            .is_err()
    );
    let index = node.start(10);
    assert_eq!(index.indexed(), (1..=30).collect::<Vec<_>>());
    assert_eq!(
        index.search(&query(BB, &vector(7), &[])).unwrap().hits[0][0].0,
        7
    );
}

#[test]
fn an_index_of_another_backbone_is_rebuilt() {
    let mut node = Node::new();
    put(node.features(), BB, 1..=20);
    let index = node.start(10);
    index.stop();
    drop(index);
    node.restart();
    // The saved index of fake-16x10 where fake-16x11's should be.
    let other = "fake-16x11";
    let dir = node.index_dir();
    std::fs::copy(dir.manifest_path(BB), dir.manifest_path(other)).unwrap();
    assert!(
        dir.open(other, DIM, AnnOptions::default())
            .unwrap_err()
            .contains(BB)
    );
    put(node.features(), other, 100..=105);
    let index = node.start(11);
    assert_eq!(index.indexed(), (100..=105).collect::<Vec<_>>());
}

#[test]
fn after_a_crash_the_index_holds_exactly_the_photos_with_features() {
    let mut node = Node::new();
    put(node.features(), BB, 1..=50);
    let index = node.start(10);
    index.stop();
    drop(index);
    node.restart();
    let index = node.start(10);
    put(node.features(), BB, 51..=60);
    for id in 1..=5 {
        node.features().remove_photo(id).unwrap();
    }
    index.settle();
    index.crash();
    drop(index);
    node.restart();
    let index = node.start(10);
    assert_eq!(index.indexed(), node.features().ids(BB).unwrap());
    assert_eq!(index.indexed(), (6..=60).collect::<Vec<_>>());
}

/// Feature-like vectors: non-negative (ReLU), in 40 clusters of different spread, 256-d.
fn feature_like(n: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let dim = 256;
    let centres: Vec<Vec<f32>> = (0..40)
        .map(|_| {
            (0..dim)
                .map(|_| rng.random::<f32>().powi(3) * 4.0)
                .collect()
        })
        .collect();
    (0..n)
        .map(|_| {
            let c = &centres[rng.random_range(0..centres.len())];
            let spread = rng.random_range(0.2..1.0f32);
            c.iter()
                .map(|x| (x + spread * (rng.random::<f32>() - 0.5) * 2.0).max(0.0))
                .collect()
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

#[test]
fn recall_at_10_against_exact_search_is_at_least_095() {
    let vectors = feature_like(4000, 7);
    let mut ann = AnnIndex::new(256, AnnOptions::default()).unwrap();
    for (id, v) in vectors.iter().enumerate() {
        ann.upsert(id as u64, v).unwrap();
    }
    let mut found = 0;
    let queries = 100;
    for q in vectors
        .iter()
        .step_by(vectors.len() / queries)
        .take(queries)
    {
        let mut exact: Vec<(usize, f32)> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| (i, cosine(q, v)))
            .collect();
        exact.sort_by(|a, b| b.1.total_cmp(&a.1));
        let truth: Vec<u64> = exact.iter().take(10).map(|(i, _)| *i as u64).collect();
        let got = ann.search(q, 10).unwrap();
        found += got.iter().filter(|(id, _)| truth.contains(id)).count();
    }
    let recall = found as f64 / (queries * 10) as f64;
    assert!(recall >= 0.95, "recall@10 {recall}");
}

/// The front door of a single PipeStore named `n1` over `index`.
fn single_front(node: &Node, index: Arc<SimilarIndex>) -> SimilarFront {
    let (store, _) =
        PhotoStore::open(&node.dir.path().join("store"), &StoreConfig::default()).unwrap();
    let preprocessor = ndpipe_model::Preprocessor::new(ndpipe_model::PreprocessConfig::default());
    SimilarFront::new(
        front_settings(60_000, 10, 1000).unwrap(),
        SimilarMetrics::default(),
        Some(Local {
            name: "n1".into(),
            index,
            embedder: Embedder::new(model(10), preprocessor),
            store: Arc::new(store),
        }),
        None,
    )
}

#[tokio::test]
async fn neighbours_of_a_batch_are_the_photos_above_the_least_score() {
    let node = Node::new();
    // Ten photos along each of the 16 axes: each photo's neighbours above 0.9 are the other
    // nine of its axis. 160 photos make three batches.
    put(node.features(), BB, 1..=160);
    let index = node.start(10);
    let front = single_front(&node, index);
    let mut asked: Vec<u64> = (1..=160).collect();
    asked.push(999);
    let found = front.neighbours(&asked, 0.9, 20).await.unwrap();
    assert_eq!(found.backbone, BB);
    assert_eq!(found.without_features, vec![999]);
    assert!(!found.partial());
    assert_eq!(found.photos.len(), 160);
    for (photo, id) in found.photos.iter().zip(1..=160u64) {
        assert_eq!(photo.id, id);
        let mut got: Vec<u64> = photo.hits.iter().map(|h| h.id).collect();
        got.sort_unstable();
        let want: Vec<u64> = (1..=160)
            .filter(|o| *o != id && o % DIM as u64 == id % DIM as u64)
            .collect();
        assert_eq!(got, want, "photo {id}: {:?}", photo.hits);
        assert!(
            photo
                .hits
                .iter()
                .all(|h| h.score >= 0.9 && h.node == "n1" && h.available)
        );
    }
    assert!(matches!(
        front.neighbours(&[1], 1.5, 10).await,
        Err(SimilarError::BadQuery(_))
    ));
    assert!(matches!(
        front.neighbours(&[1], 0.9, 0).await,
        Err(SimilarError::BadQuery(_))
    ));
}
