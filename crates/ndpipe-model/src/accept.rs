//! Labels people can trust: which of a task head's classes a photo gets, or [`OTHER`].
//!
//! A head trained on ten kinds of clothing scores every photo over those ten classes, a cat
//! included. Two rules turn its scores into labels that mean something:
//! - a **floor**: a class is kept only with at least this probability;
//! - **novelty** (calibrated rejection): the photo's features must lie near what the head was
//!   trained on. The head keeps the mean feature vector of each class (centred on the mean of
//!   all training features, unit length); a photo whose centred features are further from every
//!   class mean than almost all validation photos were (cosine below `min_cosine`, the
//!   `quantile` of the validation photos' cosines) is [`OTHER`].
//!
//! A photo that passes neither is labelled [`OTHER`] alone. A head trained with `other` as a
//! class of its own (photos labelled `other` as ground truth) gives that label like any other.

/// The label of a photo that is none of a task's classes.
pub const OTHER: &str = "other";

/// A head's rules for keeping labels.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Acceptance {
    /// The least probability of a kept class label (0: every top-k label is kept).
    pub floor: f32,
    /// The novelty check; `None` keeps every photo in the task.
    pub novelty: Option<Novelty>,
}

/// The class means of a head's training features, and how far from them a photo may lie.
#[derive(Debug, Clone, PartialEq)]
pub struct Novelty {
    /// The mean of all training features, `[dim]`: features are centred on it.
    pub center: Vec<f32>,
    /// The centred, unit-length mean of each class's training features, `[classes x dim]`.
    pub centroids: Vec<f32>,
    /// The least cosine between a photo's centred features and the nearest class mean.
    pub min_cosine: f32,
}

impl Novelty {
    /// Fits the class means to training `rows` (row-major `[n x dim]`, class `labels[i]` of
    /// `classes`), then calibrates `min_cosine` so that a share `1 - quantile` of the
    /// `validation` rows (row-major) fall below it; with no validation rows, the training rows
    /// calibrate. `None` without rows.
    pub fn fit(
        classes: usize,
        dim: usize,
        rows: &[f32],
        labels: &[u32],
        validation: &[f32],
        quantile: f32,
    ) -> Option<Self> {
        let n = labels.len();
        if n == 0 || dim == 0 || rows.len() != n * dim {
            return None;
        }
        let mut sums = vec![0f64; classes * dim];
        let mut counts = vec![0u64; classes];
        for (row, &label) in rows.chunks_exact(dim).zip(labels) {
            let Some(sum) = sums.chunks_exact_mut(dim).nth(label as usize) else {
                continue;
            };
            sum.iter_mut()
                .zip(row)
                .for_each(|(s, x)| *s += f64::from(*x));
            counts[label as usize] += 1;
        }
        let calibration = if validation.len() >= dim {
            validation
        } else {
            rows
        };
        Self::from_sums(dim, &sums, &counts, calibration, quantile)
    }

    /// The check from each class's sum of training features (`sums`, `[classes x dim]`) and
    /// count, calibrated on `calibration` rows (row-major) so that a share `quantile` of them
    /// passes; `None` without training rows.
    pub fn from_sums(
        dim: usize,
        sums: &[f64],
        counts: &[u64],
        calibration: &[f32],
        quantile: f32,
    ) -> Option<Self> {
        let n: u64 = counts.iter().sum();
        if n == 0 || dim == 0 || sums.len() != counts.len() * dim {
            return None;
        }
        let mut center = vec![0f64; dim];
        for sum in sums.chunks_exact(dim) {
            center.iter_mut().zip(sum).for_each(|(c, s)| *c += s);
        }
        let center: Vec<f32> = center.iter().map(|c| (c / n as f64) as f32).collect();
        let mut centroids = Vec::with_capacity(sums.len());
        for (sum, &count) in sums.chunks_exact(dim).zip(counts) {
            let mut mean: Vec<f32> = sum
                .iter()
                .zip(&center)
                .map(|(s, c)| {
                    if count == 0 {
                        0.0
                    } else {
                        (s / count as f64) as f32 - c
                    }
                })
                .collect();
            normalize(&mut mean);
            centroids.extend(mean);
        }
        let mut novelty = Novelty {
            center,
            centroids,
            min_cosine: -1.0,
        };
        let mut cosines: Vec<f32> = calibration
            .chunks_exact(dim)
            .map(|row| novelty.nearest(row))
            .collect();
        cosines.sort_by(f32::total_cmp);
        let q = quantile.clamp(0.0, 1.0);
        let at = ((cosines.len() as f32 - 1.0) * (1.0 - q)).round() as usize;
        novelty.min_cosine = cosines.get(at).copied().unwrap_or(-1.0);
        Some(novelty)
    }

    /// The cosine between `features`' centred vector and the nearest class mean.
    pub fn nearest(&self, features: &[f32]) -> f32 {
        let mut x: Vec<f32> = features
            .iter()
            .zip(&self.center)
            .map(|(f, c)| f - c)
            .collect();
        normalize(&mut x);
        self.centroids
            .chunks_exact(self.center.len().max(1))
            .map(|c| c.iter().zip(&x).map(|(a, b)| a * b).sum::<f32>())
            .fold(-1.0, f32::max)
    }

    /// Whether `features` lie outside what the head was trained on.
    pub fn is_novel(&self, features: &[f32]) -> bool {
        self.nearest(features) < self.min_cosine
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photos_far_from_every_class_are_novel() {
        // Two classes around (1, 0, 0) and (0, 1, 0), a little noise.
        let rows = [
            1.0, 0.1, 0.0, 0.9, 0.0, 0.1, 1.1, 0.0, 0.0, //
            0.0, 1.0, 0.1, 0.1, 0.9, 0.0, 0.0, 1.1, 0.0,
        ];
        let labels = [0, 0, 0, 1, 1, 1];
        let n = Novelty::fit(2, 3, &rows, &labels, &[], 1.0).unwrap();
        assert!(!n.is_novel(&[1.0, 0.05, 0.0]));
        assert!(!n.is_novel(&[0.0, 1.0, 0.0]));
        assert!(n.is_novel(&[0.0, 0.0, 3.0]), "{n:?}");
        assert!(Novelty::fit(2, 3, &[], &[], &[], 0.99).is_none());
    }

    #[test]
    fn the_quantile_sets_how_many_validation_photos_pass() {
        let rows = [1.0, 0.0, 0.0, 1.0];
        let labels = [0, 1];
        let validation: Vec<f32> = (0..100).flat_map(|i| [1.0, i as f32 / 100.0]).collect();
        let n = Novelty::fit(2, 2, &rows, &labels, &validation, 0.9).unwrap();
        let passed = validation
            .chunks_exact(2)
            .filter(|v| !n.is_novel(v))
            .count();
        assert!((88..=92).contains(&passed), "{passed} of 100 pass");
    }
}
