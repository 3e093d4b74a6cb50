//! SpiderCache end to end: scoring cadence and formula, label-preserving
//! substitution, the split, propagation, and inline vs background scoring.

use std::sync::Arc;

use crate::common::Dataset;
use bytes::Bytes;
use spidercache::score::ScoreVariant;
use spidercache::{
    Answer, BatchReport, CachePolicy, Capacity, LabelSource, MemorySource, Sample, SampleId,
    ScoringMode, SpiderCache, SpiderConfig, SplitPolicy, TrainingSpec,
};

const DIM: usize = 8;

/// id 0 at the origin; 1..=3 (label 0) at squared distance 0.5; 4, 5
/// (label 1) at squared distance 1.0; 6, 7 far away.
fn star() -> (Vec<u32>, Vec<Vec<f32>>) {
    let labels = vec![0, 0, 0, 0, 1, 1, 0, 1];
    let mut emb = vec![vec![0.0f32; DIM]; 8];
    for (id, axis) in [(1, 0), (2, 1), (3, 2)] {
        emb[id][axis] = 0.5f32.sqrt();
    }
    emb[4][3] = 1.0;
    emb[5][4] = 1.0;
    emb[6][5] = 10.0;
    emb[7][6] = 10.0;
    (labels, emb)
}

fn source(labels: &[u32]) -> Arc<MemorySource> {
    Arc::new(MemorySource::new(
        labels
            .iter()
            .enumerate()
            .map(|(i, &label)| Sample {
                label,
                data: Bytes::from(vec![i as u8; 16]),
            })
            .collect(),
    ))
}

fn report(p: &dyn CachePolicy, ids: &[SampleId], labels: &[u32], emb: &[Vec<f32>]) {
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

fn inline(config: SpiderConfig) -> SpiderConfig {
    SpiderConfig {
        scoring: ScoringMode::Inline,
        ..config
    }
}

fn spec(n: usize, batch: usize) -> TrainingSpec {
    TrainingSpec {
        num_samples: n,
        batch_size: batch,
        seed: 11,
    }
}

#[test]
fn scores_follow_the_neighbour_counts_from_epoch_one() {
    let (labels, emb) = star();
    let config = inline(SpiderConfig {
        scoring_interval: 1,
        k: 8,
        ..SpiderConfig::artifact()
    });
    let spider =
        SpiderCache::new(config, spec(8, 8), Capacity::new(2, 100), source(&labels)).unwrap();
    let all: Vec<SampleId> = (0..8).collect();
    spider.begin_epoch(0).unwrap();
    report(&spider, &all, &labels, &emb);
    spider.end_epoch(None).unwrap();
    assert!(
        spider.weights().iter().all(|&w| w == 0.1),
        "epoch 0 only indexes"
    );

    spider.begin_epoch(1).unwrap();
    report(&spider, &all, &labels, &emb);
    let stats = spider.end_epoch(None).unwrap();
    let w = spider.weights();
    let expect = ScoreVariant::LogLog.score(3, 2, 500.0);
    assert!((w[0] - expect).abs() < 1e-9, "w0 {} vs {expect}", w[0]);
    assert!((w[6] - 0.5266).abs() < 1e-3, "isolated: {}", w[6]);
    // id 4 (label 1): 0 at 1.0 and 1..=3 at 1.5 are other-label; 5 (label 1)
    // at 2.0 still counts (similarity 0.9802 >= 0.98).
    assert!(
        (w[4] - ScoreVariant::LogLog.score(1, 4, 500.0)).abs() < 1e-9,
        "w4 {}",
        w[4]
    );
    assert_eq!((stats.scoring_rounds, stats.index_len), (1, 8));
    assert!(stats.index_memory_bytes > 0);
}

#[test]
fn scoring_runs_on_every_second_batch_only() {
    let (labels, emb) = star();
    let config = inline(SpiderConfig {
        k: 8,
        ..SpiderConfig::artifact()
    });
    let spider =
        SpiderCache::new(config, spec(8, 4), Capacity::new(2, 100), source(&labels)).unwrap();
    let (first, second) = ([6u64, 7, 0, 1], [2u64, 3, 4, 5]);
    for epoch in 0..2 {
        spider.begin_epoch(epoch).unwrap();
        report(&spider, &first, &labels, &emb);
        report(&spider, &second, &labels, &emb);
        let stats = spider.end_epoch(None).unwrap();
        assert_eq!(stats.index_len, 4, "the second batch is never indexed");
        assert_eq!(stats.scoring_rounds, u64::from(epoch));
    }
    let w = spider.weights();
    assert!(first.iter().all(|&id| w[id as usize] != 0.1));
    assert!(second.iter().all(|&id| w[id as usize] == 0.1));
}

#[test]
fn propagation_ablation_moves_neighbour_weights() {
    let (labels, emb) = star();
    let run = |propagate| {
        let config = inline(SpiderConfig {
            scoring_interval: 1,
            k: 8,
            propagate,
            ..SpiderConfig::artifact()
        });
        let spider =
            SpiderCache::new(config, spec(8, 8), Capacity::new(2, 100), source(&labels)).unwrap();
        spider.begin_epoch(0).unwrap();
        report(&spider, &(0..8).collect::<Vec<_>>(), &labels, &emb);
        spider.end_epoch(None).unwrap();
        spider.begin_epoch(1).unwrap();
        report(&spider, &[0], &labels, &emb);
        spider.end_epoch(None).unwrap();
        spider.weights()
    };
    let off = run(None);
    let on = run(Some(1.0));
    assert_eq!(off[1], 0.1);
    assert_eq!(on[1], on[0], "neighbour takes the queried sample's score");
    assert_eq!(on[4], on[0]);
    assert_eq!(on[6], 0.1, "outside the radius");
}

#[test]
fn substitutes_keep_the_requested_label() {
    let data = Dataset::clustered(120, 3, 21);
    let config = inline(SpiderConfig {
        split: SplitPolicy::Fixed { importance: 0.0 },
        k: 50,
        ..SpiderConfig::default()
    });
    let spider = SpiderCache::new(
        config,
        spec(120, 20),
        Capacity::new(12, 12 * 200),
        data.source(),
    )
    .unwrap();
    let mut substitutes = 0;
    for epoch in 0..4 {
        let (stats, _) = data.run_epoch(&spider, epoch, 0.5 + f64::from(epoch) / 10.0);
        substitutes += stats.substitutes;
        assert_eq!(stats.importance_share, Some(0.0));
    }
    assert!(
        substitutes > 0,
        "clusters of near-duplicates must produce substitutes"
    );
    // A sample relabelled by the trainer never receives another class's data.
    for id in 0..120u64 {
        let true_label = data.samples[id as usize].label;
        if let Answer::Substitute {
            label,
            label_source,
            ..
        } = spider.lookup(id, true_label + 1).unwrap()
        {
            panic!("served {id} under label {label} ({label_source:?}) despite a label mismatch");
        }
        if let Answer::Substitute {
            served,
            label,
            label_source,
            ..
        } = spider.lookup(id, true_label).unwrap()
        {
            assert_eq!((label, label_source), (true_label, LabelSource::Requested));
            assert_eq!(data.samples[served as usize].label, true_label);
        }
    }
}

#[test]
fn split_caps_the_importance_cache() {
    let data = Dataset::clustered(40, 2, 5);
    let config = inline(SpiderConfig {
        split: SplitPolicy::Fixed { importance: 0.5 },
        ..SpiderConfig::default()
    });
    let spider = SpiderCache::new(
        config,
        spec(40, 10),
        Capacity::new(10, 100_000),
        data.source(),
    )
    .unwrap();
    spider.begin_epoch(0).unwrap();
    let admitted = (0..40u64)
        .filter(|&id| spider.admit(id, data.samples[id as usize].clone()).unwrap())
        .count();
    assert_eq!(admitted, 5);
}

#[test]
fn background_scoring_matches_inline() {
    let data = Dataset::clustered(200, 4, 8);
    let run = |scoring| {
        let config = SpiderConfig {
            scoring,
            k: 40,
            split: SplitPolicy::Fixed { importance: 0.7 },
            ..SpiderConfig::default()
        };
        let spider = SpiderCache::new(
            config,
            spec(200, 25),
            Capacity::new(20, 20 * 200),
            data.source(),
        )
        .unwrap();
        let mut rounds = 0;
        for epoch in 0..3 {
            let ids: Vec<SampleId> = (0..200).collect();
            spider.begin_epoch(epoch).unwrap();
            for batch in ids.chunks(25) {
                data.report(&spider, batch, |id| id as f32);
            }
            rounds += spider.end_epoch(None).unwrap().scoring_rounds;
        }
        (spider.weights(), rounds)
    };
    let (w_inline, r_inline) = run(ScoringMode::Inline);
    let (w_bg, r_bg) = run(ScoringMode::Background { max_lag: 2 });
    assert_eq!(r_inline, 8);
    assert_eq!(r_inline, r_bg);
    assert_eq!(w_inline, w_bg);
}

#[test]
fn rejects_a_bad_config() {
    let config = SpiderConfig {
        scoring_interval: 0,
        ..SpiderConfig::default()
    };
    let src: Arc<MemorySource> = Arc::new(MemorySource::default());
    assert!(SpiderCache::new(config, spec(4, 2), Capacity::new(1, 1), src).is_err());
}
