//! Scores and tables of `ndpipe-bench duplicates`, and the inputs of its timing: real hashes
//! of Fashion-MNIST images and the full scan the pair search is measured against.

use std::path::Path;

use anyhow::Result;
use image::{GrayImage, Rgb, RgbImage};
use ndpipe::fashion_mnist;
use ndpipe_store::{NearHash, NearPair};

use crate::dup_set::Edit;

/// How well one level's pairs did on one set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Score {
    /// Pairs found.
    found: usize,
    /// Share of the pairs found that are of one family.
    precision: f64,
    /// Share of the families' pairs found.
    recall: f64,
    /// Share of each copy ([`Edit::COPIES`]) found with its original.
    per_edit: [f64; 4],
}

/// A score from `right` of `found` pairs, `truth` pairs to find, and the recall per copy.
pub(crate) fn score(right: usize, found: usize, truth: usize, per_edit: [f64; 4]) -> Score {
    Score {
        found,
        precision: if found == 0 {
            1.0
        } else {
            right as f64 / found as f64
        },
        recall: right as f64 / truth.max(1) as f64,
        per_edit,
    }
}

/// One level's scores over the seeds.
pub(crate) struct Spread {
    scores: Vec<Score>,
}

impl Spread {
    /// The spread of `scores`.
    pub(crate) fn of(scores: Vec<Score>) -> Self {
        Spread { scores }
    }

    /// Mean, min and max of `f` over the seeds.
    fn stat(&self, f: impl Fn(&Score) -> f64) -> (f64, f64, f64) {
        let values: Vec<f64> = self.scores.iter().map(f).collect();
        let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (mean, min, max)
    }
}

/// Prints `rows`: pairs found, precision and recall with their spread, recall per copy.
pub(crate) fn table(rows: &[(String, Spread)]) {
    let edits: Vec<&str> = Edit::COPIES.iter().map(|e| e.name()).collect();
    println!(
        "{:<44} {:>7}  {:<22} {:<22} recall per copy: {}",
        "level",
        "pairs",
        "precision",
        "recall",
        edits.join(" / ")
    );
    for (name, spread) in rows {
        let (found, _, _) = spread.stat(|s| s.found as f64);
        let cell = |(mean, min, max): (f64, f64, f64)| format!("{mean:.3} [{min:.3}, {max:.3}]");
        let per_edit: Vec<String> = (0..4)
            .map(|i| format!("{:.2}", spread.stat(|s| s.per_edit[i]).0))
            .collect();
        println!(
            "{name:<44} {found:>7.0}  {:<22} {:<22} {}",
            cell(spread.stat(|s| s.precision)),
            cell(spread.stat(|s| s.recall)),
            per_edit.join(" / ")
        );
    }
}

/// The `alg` hashes of up to `n` Fashion-MNIST images (training then test), each hashed from
/// its 28x28 pixels.
pub(crate) fn fashion_hashes(dir: &Path, alg: NearHash, n: usize) -> Result<Vec<u64>> {
    let hasher = alg.hasher();
    let mut out = Vec::new();
    for name in ["train", "test"] {
        let split = fashion_mnist::load(dir, name)?;
        for i in 0..split.len() {
            if out.len() == n {
                return Ok(out);
            }
            let grey = GrayImage::from_raw(28, 28, split.image(i).to_vec())
                .ok_or_else(|| anyhow::anyhow!("a Fashion-MNIST image is not 28x28"))?;
            let rgb = RgbImage::from_fn(28, 28, |x, y| {
                let v = grey.get_pixel(x, y).0[0];
                Rgb([v, v, v])
            });
            out.push(hasher.hash_rgb(&rgb));
        }
    }
    Ok(out)
}

/// How many pairs of `hashes` are within `t` bits, by comparing every pair (the reference),
/// with the same output as the store's pair search: every pair, sorted.
pub(crate) fn scan_pairs(hashes: &[u64], t: u32) -> usize {
    let mut pairs = Vec::new();
    for (i, a) in hashes.iter().enumerate() {
        for (j, b) in hashes.iter().enumerate().skip(i + 1) {
            let distance = (a ^ b).count_ones();
            if distance <= t {
                pairs.push(NearPair {
                    a: i as u64,
                    b: j as u64,
                    distance,
                });
            }
        }
    }
    pairs.sort_unstable();
    pairs.len()
}
