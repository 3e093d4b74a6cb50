//! Five rounds of fault injection on a real cluster (a Tuner and three PipeStores on one
//! PostgreSQL catalog; the control-plane tests in `cluster` run on SQLite): in each,
//! kill -9, SIGSTOP or a restart of a random process, the Tuner included, at a random moment of
//! a fine-tune or deploy. No job may hang, every job ends done or failed with a message, and
//! the nodes always settle on one version. `ndpipe-bench faults --rounds 100` is the long run.
//! And crash cycles: `ndpipe serve` killed with SIGKILL during concurrent uploads with
//! deletes and compactions, with re-labelling jobs, or with fine-tunes that deploy, loses no
//! acknowledged write and leaves no acknowledged photo without labels
//! (`ndpipe-bench crash --cycles 100 --mode ...`); and a random node of three PipeStores with two
//! copies of each photo killed during uploads through their front doors loses no acknowledged
//! photo and leaves every one at two copies (`--mode replicated`).

use std::path::PathBuf;

use faultbench::{CrashMode, CrashModel, FaultConfig, FaultReport};

use crate::common::{exe, model_dir};

fn fashion_mnist_dir() -> PathBuf {
    std::env::var_os("NDPIPE_FASHION_MNIST_DIR")
        .map_or_else(|| "/usr/share/datasets/fashion-mnist".into(), PathBuf::from)
}

fn five_rounds(seed: u64, catalog: Option<String>) -> FaultReport {
    let dir = tempfile::tempdir().unwrap();
    let config = FaultConfig {
        rounds: 5,
        seed,
        nodes: 3,
        photos_per_node: 70,
        node_timeout_ms: 3000,
        node_lease_ms: 3000,
        max_fault_delay_ms: 2000,
        throttle_images_per_second: 40.0,
        catalog,
        model_dir: model_dir(),
        fashion_mnist_dir: fashion_mnist_dir(),
    };
    faultbench::run(&config, &exe(), dir.path(), |_| {}).unwrap()
}

#[test]
fn five_random_faults_leave_no_hang_no_split_version_and_no_unresolved_job() {
    let Some(db) = ndpipe_catalog::test_postgres::database("faults") else {
        return;
    };
    let report = five_rounds(11, Some(db.url.clone()));
    let table = serde_json::to_string_pretty(&report.rounds).unwrap();
    assert_eq!(report.rounds.len(), 5);
    assert_eq!(
        (report.hangs, report.split_versions, report.unresolved),
        (0, 0, 0),
        "{table}"
    );
    assert_eq!(report.done + report.failed, 5, "{table}");
    assert!(
        report.during_job >= 1,
        "at least one fault hits a running job: {table}"
    );
}

/// `cycles` crash cycles of `mode`; the report's counts with a target of 0 must be 0.
fn crash_cycles(mode: CrashMode, cycles: usize, max_kill_ms: u64) -> faultbench::CrashReport {
    let dir = tempfile::tempdir().unwrap();
    let config = faultbench::CrashConfig {
        cycles,
        seed: 5,
        uploaders: 3,
        max_kill_ms,
        mode,
        model: Some(CrashModel {
            model_dir: model_dir(),
            fashion_mnist_dir: fashion_mnist_dir(),
            photos: 200,
        }),
        catalog: None,
    };
    let report = faultbench::crash(&config, &exe(), dir.path(), |_| {}).unwrap();
    assert_eq!(report.cycles.len(), cycles);
    assert!(
        report.acknowledged > 0,
        "uploads were acknowledged before the kills"
    );
    assert_eq!(
        (report.lost, report.resurrected, report.unlabelled),
        (0, 0, 0),
        "{:?}",
        report.problems
    );
    report
}

#[test]
fn three_kills_during_uploads_deletes_and_compactions_lose_no_acknowledged_write() {
    let report = crash_cycles(CrashMode::Compaction, 3, 1200);
    assert!(
        report.deleted > 0,
        "deletes were acknowledged before the kills"
    );
}

#[test]
fn kills_during_relabelling_and_fine_tunes_that_deploy_lose_nothing_and_leave_labels() {
    for mode in [CrashMode::Relabel, CrashMode::Finetune] {
        let report = crash_cycles(mode, 2, 2500);
        assert!(
            report.kills_during_job >= 1,
            "{mode:?}: no kill came while a job ran: {:?}",
            report.cycles
        );
    }
}

#[test]
fn kills_of_a_replicated_node_lose_no_acknowledged_photo_and_leave_two_copies() {
    let Some(db) = ndpipe_catalog::test_postgres::database("crash_replicated") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = faultbench::CrashConfig {
        cycles: 2,
        seed: 7,
        uploaders: 3,
        max_kill_ms: 2000,
        mode: CrashMode::Replicated,
        model: Some(CrashModel {
            model_dir: model_dir(),
            fashion_mnist_dir: fashion_mnist_dir(),
            photos: 0,
        }),
        catalog: Some(db.url.clone()),
    };
    let report = faultbench::crash(&config, &exe(), dir.path(), |_| {}).unwrap();
    assert_eq!(report.cycles.len(), 2);
    assert!(
        report.acknowledged > 0,
        "uploads were acknowledged: {:?}",
        report.cycles
    );
    assert_eq!(
        (report.lost, report.short_of_copies),
        (0, 0),
        "{:?}",
        report.problems
    );
}
