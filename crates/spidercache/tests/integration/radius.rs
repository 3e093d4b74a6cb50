//! The neighbourhood radius on embeddings of a known scale: the relative
//! radius finds the same neighbours at any scale, the artifact's absolute one
//! only while the embeddings happen to be small.

use crate::common::Dataset;
use spidercache::{
    Capacity, NeighbourhoodStats, Radius, ScoringMode, SpiderCache, SpiderConfig, SplitPolicy,
    TrainingSpec,
};

/// Clusters of near-duplicates (squared within-cluster distances about 0.2),
/// every coordinate multiplied by `scale`.
fn clustered(scale: f32) -> Dataset {
    let mut data = Dataset::clustered(240, 4, 31);
    for e in &mut data.embeddings {
        e.iter_mut().for_each(|v| *v *= scale);
    }
    data
}

/// The scan's statistics of the third epoch (the second that scores).
fn scan(radius: Radius, scale: f32) -> NeighbourhoodStats {
    let data = clustered(scale);
    let config = SpiderConfig {
        radius,
        k: 60,
        scoring: ScoringMode::Inline,
        split: SplitPolicy::Fixed { importance: 1.0 },
        ..SpiderConfig::default()
    };
    let spec = TrainingSpec {
        num_samples: 240,
        batch_size: 24,
        seed: 5,
    };
    let spider =
        SpiderCache::new(config, spec, Capacity::new(24, 24 * 200), data.source()).unwrap();
    let mut last = None;
    for epoch in 0..3 {
        let (stats, _) = data.run_epoch(&spider, epoch, 0.5);
        assert_eq!(
            stats.neighbourhood.is_some(),
            epoch > 0,
            "epoch 0 only indexes"
        );
        last = stats.neighbourhood;
    }
    last.unwrap()
}

#[test]
fn the_relative_radius_finds_neighbours_at_any_scale() {
    let small = scan(Radius::default(), 1.0);
    let large = scan(Radius::default(), 30.0);
    for (what, s) in [("scale 1", &small), ("scale 30", &large)] {
        assert!(s.with_same > 0.3, "{what}: {s:?}");
        assert!(s.same.mean > 0.5, "{what}: {s:?}");
        assert!(
            s.scores.p10 < s.scores.p90,
            "{what}: the score must spread: {s:?}"
        );
    }
    assert_eq!(
        small.with_same, large.with_same,
        "the same neighbours at both scales"
    );
    assert_eq!(small.scores, large.scores);
    // The radius is measured in the embeddings' own units: 30x the
    // coordinates is 900x the squared radius.
    let ratio = large.radius.p50 / small.radius.p50;
    assert!((500.0..1500.0).contains(&ratio), "radius ratio {ratio}");
}

#[test]
fn the_absolute_radius_collapses_on_large_embeddings() {
    let small = scan(Radius::artifact(), 1.0);
    assert!(small.with_same > 0.4, "{small:?}");
    let large = scan(Radius::artifact(), 30.0);
    assert_eq!(large.with_same, 0.0, "{large:?}");
    assert_eq!(
        large.scores.min, large.scores.max,
        "one score for all: {large:?}"
    );
    assert!(
        (large.scores.p50 - 0.527).abs() < 1e-3,
        "the isolated score: {large:?}"
    );
    assert!((large.radius.p50 - 2.02).abs() < 0.01);
}
