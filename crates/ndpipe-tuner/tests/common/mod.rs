//! Synthetic features for the head tests.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Labelled rows drawn around one random centre per class.
pub(crate) struct Clusters {
    /// Row-major features, `labels.len() × dim`.
    pub(crate) features: Vec<f32>,
    /// Class of each row.
    pub(crate) labels: Vec<u32>,
    /// Feature dimension.
    pub(crate) dim: usize,
}

impl Clusters {
    /// `rows` rows in `dim` dimensions, `classes` clusters with centres uniform in ±1 and noise
    /// uniform in ±`noise`; the same `seed` gives the same centres.
    pub(crate) fn new(classes: u32, dim: usize, rows: usize, noise: f32, seed: u64) -> Self {
        Self::with_rows_seed(classes, dim, rows, noise, seed, seed)
    }

    /// Like [`Clusters::new`], with the rows (labels and noise) drawn from `rows_seed`, so that
    /// several draws share the centres of `seed`.
    pub(crate) fn with_rows_seed(
        classes: u32,
        dim: usize,
        rows: usize,
        noise: f32,
        seed: u64,
        rows_seed: u64,
    ) -> Self {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let centres: Vec<f32> = (0..classes as usize * dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut rng = Pcg64Mcg::seed_from_u64(rows_seed.wrapping_add(1 << 32));
        let labels: Vec<u32> = (0..rows).map(|_| rng.random_range(0..classes)).collect();
        let features = labels
            .iter()
            .flat_map(|&l| {
                let centre = &centres[l as usize * dim..(l as usize + 1) * dim];
                centre
                    .iter()
                    .map(|c| c + rng.random_range(-noise..noise))
                    .collect::<Vec<_>>()
            })
            .collect();
        Self {
            features,
            labels,
            dim,
        }
    }

    /// Rows `range` as (features, labels).
    pub(crate) fn rows(&self, range: std::ops::Range<usize>) -> (&[f32], &[u32]) {
        (
            &self.features[range.start * self.dim..range.end * self.dim],
            &self.labels[range],
        )
    }
}

/// Class names `c0`, `c1`, ...
pub(crate) fn class_names(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("c{i}")).collect()
}
