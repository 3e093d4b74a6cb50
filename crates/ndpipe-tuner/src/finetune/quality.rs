//! What a trained head is worth before it deploys: per-class precision and recall on the
//! validation photos, its rules for keeping labels (a floor, and a novelty check calibrated on
//! the validation photos from the class means of the training photos), and the quality gate: the
//! new version deploys only when its validation top-1 is not below its parent's, on the same
//! photos, by more than a margin.

use ndpipe_model::{Acceptance, Novelty};
use ndpipe_proto::Features;
use serde::{Deserialize, Serialize};

use crate::{Head, TunerError};

/// Running sums of the training features per class, as chunks arrive (the training rows may be
/// read through a cache later and never held at once).
#[derive(Debug)]
pub(super) struct ClassMeans {
    dim: usize,
    sums: Vec<f64>,
    counts: Vec<u64>,
}

impl ClassMeans {
    /// No rows yet, for `classes` classes of `dim`-d features.
    pub(super) fn new(classes: usize, dim: usize) -> Self {
        ClassMeans {
            dim,
            sums: vec![0.0; classes * dim],
            counts: vec![0; classes],
        }
    }

    /// Adds a chunk of training features (labels out of range are left out).
    pub(super) fn add(&mut self, features: &Features) {
        if features.dim != self.dim {
            return;
        }
        for (row, &label) in features.values.chunks_exact(self.dim).zip(&features.labels) {
            let label = label as usize;
            let Some(sum) = self.sums.chunks_exact_mut(self.dim).nth(label) else {
                continue;
            };
            sum.iter_mut()
                .zip(row)
                .for_each(|(s, x)| *s += f64::from(*x));
            self.counts[label] += 1;
        }
    }

    /// The head's rules: `floor`, and (unless `quantile` is 0) the novelty check calibrated on
    /// the validation rows so that a share `quantile` of them passes.
    pub(super) fn acceptance(&self, floor: f32, val: &Features, quantile: f32) -> Acceptance {
        let novelty = (quantile > 0.0)
            .then(|| Novelty::from_sums(self.dim, &self.sums, &self.counts, &val.values, quantile))
            .flatten();
        Acceptance { floor, novelty }
    }
}

/// One class's figures on the validation photos.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassMetrics {
    /// The class.
    pub class: String,
    /// Of the photos the head gives this class (top-1), the share that are of it.
    pub precision: f32,
    /// Of the photos of this class, the share the head gives it.
    pub recall: f32,
    /// Validation photos of this class.
    pub support: u64,
}

/// Per-class precision and recall of `head`'s top-1 on `val` (labels index `head`'s classes).
pub(super) fn class_metrics(head: &Head, val: &Features) -> Result<Vec<ClassMetrics>, TunerError> {
    let classes = head.classes().len();
    let (mut predicted, mut actual, mut hits) = (
        vec![0u64; classes],
        vec![0u64; classes],
        vec![0u64; classes],
    );
    let predictions = if val.is_empty() {
        Vec::new()
    } else {
        head.predict(&val.values)?
    };
    for (p, &label) in predictions.iter().zip(&val.labels) {
        let (p, label) = (p.class, label as usize);
        if p < classes && label < classes {
            predicted[p] += 1;
            actual[label] += 1;
            hits[p] += u64::from(p == label);
        }
    }
    let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f32 / of as f32 };
    Ok(head
        .classes()
        .iter()
        .enumerate()
        .map(|(c, class)| ClassMetrics {
            class: class.clone(),
            precision: share(hits[c], predicted[c]),
            recall: share(hits[c], actual[c]),
            support: actual[c],
        })
        .collect())
}

/// The top-1 of `parent` on `val`, whose labels index `classes` (the job's classes, a superset
/// of the parent's when it grew): photos of a class the parent lacks count as misses. `values`
/// are the validation features as the parent's backbone computes them (the job's own when it
/// kept the backbone). `None` without validation photos.
pub(super) fn parent_top1(
    parent: &Head,
    classes: &[String],
    values: &[f32],
    labels: &[u32],
) -> Result<Option<f32>, TunerError> {
    if labels.is_empty() {
        return Ok(None);
    }
    let predictions = parent.predict(values)?;
    let correct = predictions
        .iter()
        .zip(labels)
        .filter(|(p, label)| {
            let named = parent.classes().get(p.class);
            named.is_some() && named == classes.get(**label as usize)
        })
        .count();
    Ok(Some(correct as f32 / labels.len() as f32))
}

/// The quality gate of a new version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gate {
    /// How far below its parent's the new version's top-1 may fall.
    pub margin: f32,
    /// The parent's top-1 on the same validation photos; `None` for a task's first version.
    pub parent_val_top1: Option<f32>,
    /// The new version's.
    pub val_top1: f32,
    /// Whether it may deploy on its own figures.
    pub passed: bool,
    /// Whether it deploys although it did not pass (`force`).
    pub forced: bool,
}

impl Gate {
    /// The gate of a version of top-1 `val_top1` against its parent's `parent`.
    pub(super) fn judge(val_top1: f32, parent: Option<f32>, margin: f32, force: bool) -> Self {
        let passed = parent.is_none_or(|p| val_top1 + margin >= p);
        Gate {
            margin,
            parent_val_top1: parent,
            val_top1,
            passed,
            forced: force && !passed,
        }
    }

    /// Whether the version deploys.
    pub(crate) fn deploys(&self) -> bool {
        self.passed || self.forced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_holds_back_a_version_below_its_parent_by_more_than_the_margin() {
        assert!(
            Gate::judge(0.80, None, 0.01, false).deploys(),
            "a first version"
        );
        assert!(Gate::judge(0.795, Some(0.80), 0.01, false).deploys());
        let worse = Gate::judge(0.70, Some(0.80), 0.01, false);
        assert!(!worse.passed && !worse.deploys());
        let forced = Gate::judge(0.70, Some(0.80), 0.01, true);
        assert!(!forced.passed && forced.forced && forced.deploys());
        assert!(
            !Gate::judge(0.9, Some(0.8), 0.01, true).forced,
            "nothing to force"
        );
    }
}
