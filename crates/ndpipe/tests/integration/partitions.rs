//! Partition rounds (`faultbench`, `ndpipe-bench partition --rounds 100` is the long run): a
//! Tuner, three PipeStores with two copies of each photo and PostgreSQL, each in a network
//! namespace of its own. Each round sends uploads, reads and deletes through random front
//! doors, runs a fine-tune or a deploy, cuts a link for a random time (a node from the
//! database, a node from its peers, one direction only, the Tuner from half the nodes), heals
//! it and checks that nothing acknowledged is lost or back, that the nodes settle on one
//! version, that the job resolves and that no request goes unanswered. And a rolling upgrade:
//! the PipeStores restarted one at a time in a StatefulSet's order under uploads and reads.
//! Namespaces need root, `ip` and `nft`: elsewhere the tests say so and skip.

use std::path::PathBuf;

use faultbench::{CUTS, Deadlines, PartitionConfig, PartitionReport, RoundKind};

use crate::common::{exe, model_dir};

fn fashion_mnist_dir() -> PathBuf {
    std::env::var_os("NDPIPE_FASHION_MNIST_DIR")
        .map_or_else(|| "/usr/share/datasets/fashion-mnist".into(), PathBuf::from)
}

/// `rounds` rounds of `kinds`, or `None` (after saying why) where namespaces or PostgreSQL
/// cannot be had.
fn rounds(test: &str, rounds: usize, seed: u64, kinds: &[RoundKind]) -> Option<PartitionReport> {
    if let Some(why) = faultbench::namespaces_unavailable() {
        eprintln!("skipped {test}: {why}");
        return None;
    }
    if std::env::var("NDPIPE_SKIP_POSTGRES").as_deref() == Ok("1") {
        eprintln!("skipped {test}: NDPIPE_SKIP_POSTGRES=1, and the rounds need PostgreSQL");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig {
        rounds,
        seed,
        kinds: kinds.to_vec(),
        hold_ms: (1000, 6000),
        max_cut_delay_ms: 2000,
        workers: 3,
        photos_per_node: 40,
        deadlines: Deadlines {
            catalog_timeout_ms: 3000,
            catalog_checkout_ms: 2000,
            peer_timeout_ms: 5000,
            copy_timeout_ms: 3000,
        },
        model_dir: model_dir(),
        fashion_mnist_dir: fashion_mnist_dir(),
    };
    Some(faultbench::partition(&config, &exe(), dir.path(), |_| {}).unwrap())
}

/// The counts with a target of 0, each 0; and something acknowledged to check.
fn assert_clean(report: &PartitionReport, rounds: usize) {
    let table = serde_json::to_string_pretty(&report.rounds).unwrap();
    assert_eq!(report.aborted, None);
    assert_eq!(report.rounds.len(), rounds);
    for r in &report.rounds {
        assert_eq!(
            (r.lost, r.resurrected, r.short_of_copies),
            (0, 0, 0),
            "round {}: {:?}",
            r.round,
            r.problems
        );
        assert!(
            r.one_version,
            "round {}: split versions {:?}",
            r.round, r.versions
        );
        assert!(
            !matches!(
                r.outcome,
                faultbench::Outcome::Hang | faultbench::Outcome::Unresolved(_)
            ),
            "round {}: {:?}",
            r.round,
            r.outcome
        );
        for (kind, s) in &r.requests {
            assert_eq!(
                (s.hangs, s.wrong_bytes),
                (0, 0),
                "round {}: {kind}",
                r.round
            );
        }
    }
    assert_eq!(report.lost_at_end, 0, "{:?}", report.problems_at_end);
    let acked: usize = report.rounds.iter().map(|r| r.uploads_acked).sum();
    assert!(acked > 0, "uploads were acknowledged: {table}");
    assert!(
        report.present_at_end > 0,
        "photos were left to check: {table}"
    );
}

#[test]
fn five_partition_rounds_lose_nothing_split_nothing_and_hang_nowhere() {
    let Some(report) = rounds("five_partition_rounds", 5, 21, &CUTS) else {
        return;
    };
    assert_clean(&report, 5);
}

#[test]
fn a_rolling_upgrade_of_the_pipestores_loses_no_acknowledged_photo() {
    let Some(report) = rounds("rolling_upgrade", 1, 3, &[RoundKind::RollingUpgrade]) else {
        return;
    };
    assert_clean(&report, 1);
    assert!(report.rounds[0].detail.contains("ps-2, ps-1, ps-0"));
}
