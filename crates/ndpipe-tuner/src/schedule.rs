//! NDPipe's pipelined-run plan and step learning-rate schedule.
//!
//! A fine-tuning job is split into `r` runs: each PipeStore cuts its training photos into `r`
//! contiguous chunks, and the Tuner trains run `k` on chunk `k` only, warm-started from run `k-1`,
//! while the PipeStores extract chunk `k+1`. Later runs use a smaller learning rate.

/// NDPipe's step learning rates, one per fifth of a run's epochs.
pub(crate) const BASE_LEARNING_RATES: [f64; 5] = [0.015, 0.012, 0.0075, 0.0045, 0.0015];

/// Learning rate for `epoch` (from 0) of a run of `epochs` epochs, before the per-run scale.
///
/// The rate steps down when `epoch` reaches 20, 40, 60 and 80 % of `epochs`
/// (for 30 epochs: at epochs 6, 12, 18 and 24).
pub(crate) fn base_learning_rate(epoch: usize, epochs: usize) -> f64 {
    // Number of thresholds i/5 * epochs (i = 1..=4) that `epoch` has reached, in integers.
    let step = (1..BASE_LEARNING_RATES.len())
        .filter(|&i| 5 * epoch >= i * epochs)
        .count();
    BASE_LEARNING_RATES[step]
}

/// Per-run scale `(r - k/2) / r` for run `k` (from 0) of `runs`: with two runs, ×1.0 then ×0.75.
pub(crate) fn run_scale(run: usize, runs: usize) -> f64 {
    (runs as f64 - run as f64 / 2.0) / runs as f64
}

/// Learning rate for `epoch` of run `run` out of `runs`: the base step rate times the run scale.
pub(crate) fn learning_rate(epoch: usize, epochs: usize, run: usize, runs: usize) -> f64 {
    base_learning_rate(epoch, epochs) * run_scale(run, runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunPlan;

    #[test]
    fn thirty_epochs_step_at_6_12_18_24() {
        let rates: Vec<f64> = (0..30).map(|e| base_learning_rate(e, 30)).collect();
        for (e, &lr) in rates.iter().enumerate() {
            let expected = BASE_LEARNING_RATES[e / 6];
            assert_eq!(lr, expected, "epoch {e}");
        }
    }

    #[test]
    fn switch_points_for_other_epoch_counts() {
        let steps = |epochs: usize| -> Vec<usize> {
            (1..epochs)
                .filter(|&e| base_learning_rate(e, epochs) != base_learning_rate(e - 1, epochs))
                .collect()
        };
        assert_eq!(steps(10), [2, 4, 6, 8]);
        assert_eq!(steps(5), [1, 2, 3, 4]);
        // 12 epochs: thresholds 2.4, 4.8, 7.2, 9.6 are reached at 3, 5, 8, 10.
        assert_eq!(steps(12), [3, 5, 8, 10]);
        assert_eq!(base_learning_rate(0, 1), 0.015);
        assert_eq!(base_learning_rate(2, 3), 0.0045);
    }

    #[test]
    fn run_scale_follows_r_minus_half_k_over_r() {
        assert_eq!(run_scale(0, 1), 1.0);
        assert_eq!([run_scale(0, 2), run_scale(1, 2)], [1.0, 0.75]);
        let four: Vec<f64> = (0..4).map(|k| run_scale(k, 4)).collect();
        assert_eq!(four, [1.0, 0.875, 0.75, 0.625]);
        assert_eq!(learning_rate(6, 30, 1, 2), 0.012 * 0.75);
    }

    #[test]
    fn plan_aligns_chunks_and_gives_remainder_to_last() {
        let plan = RunPlan::new(50_000, 2, 128).unwrap();
        // 25,000 - 25,000 mod 128 = 24,960.
        assert_eq!(plan.chunks(), [0..24_960, 24_960..50_000]);

        let plan = RunPlan::new(1_000, 3, 128).unwrap();
        assert_eq!(plan.chunks(), [0..256, 256..512, 512..1_000]);

        assert_eq!(
            RunPlan::new(1_000, 1, 128).unwrap().chunk(0),
            Some(0..1_000)
        );
        assert_eq!(RunPlan::new(1_000, 4, 1).unwrap().chunks()[3], 750..1_000);
        assert_eq!(RunPlan::new(0, 2, 8).unwrap().chunks(), [0..0, 0..0]);
    }

    #[test]
    fn plan_with_fewer_rows_per_run_than_alignment_puts_all_in_last() {
        let plan = RunPlan::new(100, 4, 128).unwrap();
        assert_eq!(plan.chunks(), [0..0, 0..0, 0..0, 0..100]);
        assert_eq!(plan.chunk(3), Some(0..100));
        assert_eq!(plan.chunk(4), None);
    }

    #[test]
    fn plan_covers_every_sample_once() {
        for total in [0, 1, 127, 128, 129, 1_000, 4_097] {
            for runs in 1..=5 {
                for align in [1, 7, 128] {
                    let plan = RunPlan::new(total, runs, align).unwrap();
                    assert_eq!(plan.runs(), runs);
                    let mut next = 0;
                    for (k, chunk) in plan.chunks().iter().enumerate() {
                        assert_eq!(chunk.start, next);
                        if k + 1 < runs {
                            assert_eq!(chunk.len() % align, 0);
                        }
                        next = chunk.end;
                    }
                    assert_eq!(next, total);
                }
            }
        }
    }

    #[test]
    fn plan_rejects_zero_runs_or_alignment() {
        assert!(matches!(
            RunPlan::new(10, 0, 1),
            Err(ndpipe_proto::ProtoError::InvalidPlan(_))
        ));
        assert!(matches!(
            RunPlan::new(10, 1, 0),
            Err(ndpipe_proto::ProtoError::InvalidPlan(_))
        ));
    }
}
