//! The homophily cache end to end: set-cover promotion under the cap and the
//! budget, a substitute's step filed under the served sample, and reads only
//! for representatives the cache has room for, made outside the policy's lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use crate::common::{DIM, Dataset};
use bytes::Bytes;
use spidercache::{
    Answer, BatchReport, CacheError, CachePolicy, Capacity, HomophilyConfig, MemorySource, Radius,
    Sample, SampleId, SampleSource, ScoringMode, SpiderCache, SpiderConfig, SplitPolicy,
    TrainingSpec,
};

/// Counts reads, and can call back into a policy while reading.
struct Counting {
    inner: Arc<MemorySource>,
    reads: AtomicU64,
    policy: OnceLock<Weak<SpiderCache>>,
}

impl SampleSource for Counting {
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError> {
        if let Some(policy) = self.policy.get().and_then(Weak::upgrade) {
            // Deadlocks if the read is made under the policy's state lock.
            let _ = policy.usage();
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.fetch(id)
    }
}

fn counting(data: &Dataset) -> Arc<Counting> {
    Arc::new(Counting {
        inner: data.source.clone(),
        reads: AtomicU64::new(0),
        policy: OnceLock::new(),
    })
}

fn config(importance: f64, max_neighbours: usize) -> SpiderConfig {
    SpiderConfig {
        k: 60,
        scoring: ScoringMode::Inline,
        split: SplitPolicy::Fixed { importance },
        homophily: HomophilyConfig {
            max_neighbours,
            ..HomophilyConfig::default()
        },
        ..SpiderConfig::default()
    }
}

fn spec(n: usize, batch: usize) -> TrainingSpec {
    TrainingSpec {
        num_samples: n,
        batch_size: batch,
        seed: 3,
    }
}

#[test]
fn few_representatives_cover_many_neighbours_within_the_cap_and_budget() {
    let data = Dataset::clustered(300, 3, 17);
    let source = counting(&data);
    let cap = 4;
    let capacity = Capacity::new(30, 30 * 200);
    let spider =
        SpiderCache::new(config(0.5, cap), spec(300, 30), capacity, source.clone()).unwrap();
    let (mut substitutes, mut fetched) = (0, 0);
    for epoch in 0..5 {
        // run_epoch checks the budget after every call and every substitute's label.
        let (stats, _) = data.run_epoch(&spider, epoch, 0.5);
        let h = stats.homophily.unwrap();
        assert!(h.representatives <= 15, "half the 30 slots: {h:?}");
        assert!(h.covered <= h.representatives * cap, "the cap holds: {h:?}");
        if epoch >= 2 {
            assert!(
                h.covered >= 2 * h.representatives,
                "each covers several: {h:?}"
            );
        }
        substitutes += stats.substitutes;
        fetched += stats.background_fetches;
    }
    assert!(substitutes > 50, "{substitutes} substitutes");
    assert_eq!(
        source.reads.load(Ordering::Relaxed),
        fetched,
        "every read is counted"
    );
}

#[test]
fn no_read_for_a_representative_the_cache_has_no_room_for() {
    let data = Dataset::clustered(200, 3, 4);
    let source = counting(&data);
    let spider = SpiderCache::new(
        config(1.0, 10),
        spec(200, 20),
        Capacity::new(20, 20 * 200),
        source.clone(),
    )
    .unwrap();
    for epoch in 0..4 {
        let (stats, _) = data.run_epoch(&spider, epoch, 0.5);
        assert_eq!(stats.background_fetches, 0);
        assert!(
            epoch == 0 || stats.neighbourhood.unwrap().with_same > 0.2,
            "candidates exist"
        );
    }
    assert_eq!(source.reads.load(Ordering::Relaxed), 0);
}

#[test]
fn representatives_are_read_outside_the_policy_lock() {
    let data = Dataset::clustered(200, 3, 4);
    let source = counting(&data);
    let spider = Arc::new(
        SpiderCache::new(
            config(0.0, 10),
            spec(200, 20),
            Capacity::new(20, 20 * 200),
            source.clone(),
        )
        .unwrap(),
    );
    source.policy.set(Arc::downgrade(&spider)).ok().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let worker = Arc::clone(&spider);
    std::thread::spawn(move || {
        let data = Dataset::clustered(200, 3, 4);
        for epoch in 0..3 {
            data.run_epoch(&*worker, epoch, 0.5);
        }
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("a read under the state lock deadlocks");
    assert!(source.reads.load(Ordering::Relaxed) > 0);
}

/// Samples 0, 1, 2 (label 0) within squared distance 1 of each other; 3..8
/// far apart, each with its own label.
fn triangle() -> (Vec<u32>, Vec<Vec<f32>>) {
    let labels = vec![0, 0, 0, 1, 2, 3, 4, 5];
    let mut emb = vec![vec![0.0f32; DIM]; 8];
    emb[1][0] = 0.7;
    emb[2][1] = 0.7;
    for (id, row) in emb.iter_mut().enumerate().skip(3) {
        row[id % DIM] = 10.0 * id as f32;
    }
    (labels, emb)
}

fn report(p: &SpiderCache, ids: &[SampleId], labels: &[u32], emb: &[Vec<f32>]) {
    let l: Vec<u32> = ids.iter().map(|&i| labels[i as usize]).collect();
    let e: Vec<f32> = ids.iter().flat_map(|&i| emb[i as usize].clone()).collect();
    p.report_batch(&BatchReport {
        ids,
        labels: &l,
        embeddings: &e,
        dim: DIM,
        losses: &vec![1.0; ids.len()],
    })
    .unwrap();
}

#[test]
fn a_substitute_step_is_filed_under_the_served_sample() {
    let (labels, mut emb) = triangle();
    let source = Arc::new(MemorySource::new(
        labels
            .iter()
            .map(|&label| Sample {
                label,
                data: Bytes::from(vec![label as u8; 16]),
            })
            .collect(),
    ));
    let config = SpiderConfig {
        k: 8,
        scoring_interval: 1,
        radius: Radius::artifact(),
        ..config(0.0, 10)
    };
    let spider = SpiderCache::new(config, spec(8, 8), Capacity::new(2, 100), source).unwrap();
    let all: Vec<SampleId> = (0..8).collect();
    for epoch in 0..2 {
        spider.begin_epoch(epoch).unwrap();
        report(&spider, &all, &labels, &emb);
        spider.end_epoch(None).unwrap();
    }
    // Epoch 1 scored the triangle (two same-label neighbours each) and
    // promoted 0, the first of three equal candidates, for 1 and 2.
    let before = spider.weights();
    assert!(before[1] < 0.3 && before[0] < 0.3, "{before:?}");
    spider.begin_epoch(2).unwrap();
    let Answer::Substitute { served, .. } = spider.lookup(1, 0).unwrap() else {
        panic!("1 is served by its representative");
    };
    assert_eq!(served, 0);
    // The trainer stepped on 0's bytes; its embedding, here moved far away,
    // is 0's and scores 0 as isolated. Sample 1 keeps its own score.
    emb[1] = vec![500.0; DIM];
    report(&spider, &[1], &labels, &emb);
    spider.end_epoch(None).unwrap();
    let after = spider.weights();
    assert_eq!(after[1], before[1], "the requested sample is untouched");
    assert!(
        (after[0] - 0.527).abs() < 1e-3,
        "the served sample is rescored: {after:?}"
    );
}
