//! SpiderCache and its peers on a real (small) training run reading a PipeStore process through
//! each cache: the quick mode of `ndpipe-bench cache run` (both models), on one seed.

use cachebench::bench::{self, BenchConfig, policy_specs};
use cachebench::model::ModelKind;
use cachebench::replay::{Trace, replay};

#[test]
fn quick_mode_runs_every_policy_through_a_real_pipestore() {
    let bin = crate::common::exe();
    let out = tempfile::tempdir().unwrap();
    let config = BenchConfig {
        ndpipe_bin: bin,
        out_dir: out.path().to_owned(),
        json: Some(out.path().join("summary.json")),
        seeds: 1,
        progress: false,
        ..BenchConfig::quick()
    };
    let results = bench::run(&config).unwrap();

    for spec in policy_specs(config.epochs) {
        let runs: Vec<_> = results
            .runs
            .iter()
            .filter(|r| r.policy == spec.label)
            .collect();
        let expected = config.models.len()
            * if spec.label == "nocache" {
                1
            } else {
                config.cache_fractions.len()
            };
        assert_eq!(runs.len(), expected, "runs of {}", spec.label);
    }
    let chance = 1.0 / results.classes.len() as f64;
    for run in &results.runs {
        assert_eq!(run.epochs.len(), config.epochs as usize, "{}", run.policy);
        for e in &run.epochs {
            assert_eq!(
                e.exact_hits + e.substitutes + e.misses,
                e.requests,
                "{} epoch {}: the policy's counts must add up to the loop's requests",
                run.policy,
                e.epoch
            );
            assert!(e.requests > 0, "{}", run.policy);
            assert!((0.0..=1.0).contains(&e.hit_ratio()), "{}", run.policy);
            assert!(e.data_stall_s <= e.epoch_time_s, "{}", run.policy);
            assert!(
                e.distinct_trained > 0 && e.distinct_trained <= results.runs[0].num_samples as u64,
                "{}",
                run.policy
            );
        }
        assert!(
            run.final_accuracy() > 2.0 * chance,
            "{} trained to only {:.3}",
            run.policy,
            run.final_accuracy()
        );
    }
    assert_eq!(config.models, [ModelKind::Mlp, ModelKind::Cnn]);
    let nocache = results.runs.iter().find(|r| r.policy == "nocache").unwrap();
    assert!(
        nocache
            .epochs
            .iter()
            .all(|e| e.exact_hits + e.substitutes == 0)
    );
    // Quiver "hits" everything but reads every sample itself: reads per request stay near 1.
    let quiver = results.runs.iter().find(|r| r.policy == "quiver").unwrap();
    assert!(
        quiver.reads_per_request() > 0.9,
        "{}",
        quiver.reads_per_request()
    );
    for file in [
        "results.json",
        "results.md",
        "summary.json",
        "mlp_reads_10.png",
        "mlp_hit_ratio_10.png",
        "mlp_accuracy_10.png",
        "cnn_reads_10.png",
        "cnn_accuracy_10.png",
    ] {
        assert!(out.path().join(file).is_file(), "{file} written");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    for row in summary.as_array().unwrap() {
        for key in [
            "reads_per_request",
            "exact_ratio",
            "substitute_ratio",
            "distinct_per_epoch",
            "top1_mean",
            "top1_sd",
        ] {
            assert!(row[key].is_number(), "{key} in {row}");
        }
    }

    // The recorded no-cache run replays exactly for a non-steering policy:
    // the request stream of nocache itself is the trace's.
    let trace = Trace::read(&out.path().join("trace.bin")).unwrap();
    assert_eq!(trace.epochs.len(), config.epochs as usize);
    let lru = policy_specs(config.epochs)
        .into_iter()
        .find(|p| p.label == "lru")
        .unwrap();
    let replayed = replay(&trace, &lru, 0.1).unwrap();
    let real = results
        .runs
        .iter()
        .find(|r| r.policy == "lru" && r.model == ModelKind::Mlp && r.cache_fraction == 0.1)
        .unwrap();
    let real_hits: Vec<u64> = real.epochs.iter().map(|e| e.exact_hits).collect();
    let replay_hits: Vec<u64> = replayed.epochs.iter().map(|e| e.exact_hits).collect();
    assert_eq!(replay_hits, real_hits, "LRU replay equals the real run");
}
