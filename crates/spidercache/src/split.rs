//! How SpiderCache divides its capacity between the importance cache and the
//! homophily cache.

use crate::error::CacheError;

/// The rule that sets the importance cache's share of the capacity (the
/// homophily cache gets the rest). Re-evaluated at every epoch start.
#[derive(Debug, Clone, PartialEq)]
pub enum SplitPolicy {
    /// A constant share. The artifact runs `1.0` (homophily cache off).
    Fixed {
        /// Importance share, 0..=1.
        importance: f64,
    },
    /// A share that changes at given epochs (tried in the artifact: 0.8 from
    /// epoch 5, 0.6 from epoch 10).
    Scheduled {
        /// Share before the first step.
        initial: f64,
        /// `(epoch, share)` steps, in ascending epoch order.
        steps: Vec<(u32, f64)>,
    },
    /// INFERRED, not in the artifact: `base + span * s / s_max`, where `s` is
    /// the Savitzky-Golay-smoothed standard deviation of the importance
    /// weights over the scoring rounds so far and `s_max` its largest value.
    /// As scores concentrate late in training, space shifts to homophily.
    Adaptive(AdaptiveSplit),
}

/// Parameters of [`SplitPolicy::Adaptive`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSplit {
    /// Share when the weights have no spread left.
    pub base: f64,
    /// Extra share at the largest spread seen.
    pub span: f64,
    /// Savitzky-Golay window (points).
    pub window: usize,
    /// Savitzky-Golay polynomial order (below `window`).
    pub order: usize,
}

impl Default for AdaptiveSplit {
    fn default() -> Self {
        Self {
            base: 0.70,
            span: 0.25,
            window: 5,
            order: 2,
        }
    }
}

impl Default for SplitPolicy {
    fn default() -> Self {
        SplitPolicy::Fixed { importance: 1.0 }
    }
}

impl SplitPolicy {
    /// Checks that shares are within 0..=1 and the smoothing is well posed.
    pub fn validate(&self) -> Result<(), CacheError> {
        let bad = |x: f64| !(0.0..=1.0).contains(&x);
        let invalid = match self {
            SplitPolicy::Fixed { importance } => bad(*importance),
            SplitPolicy::Scheduled { initial, steps } => {
                bad(*initial)
                    || steps.iter().any(|&(_, s)| bad(s))
                    || steps.windows(2).any(|w| w[0].0 >= w[1].0)
            }
            SplitPolicy::Adaptive(a) => {
                bad(a.base) || bad(a.base + a.span) || a.span < 0.0 || a.order >= a.window
            }
        };
        if invalid {
            return Err(CacheError::InvalidConfig(format!(
                "bad split policy {self:?}"
            )));
        }
        Ok(())
    }

    /// The importance share for `epoch`, given the history of weight
    /// standard deviations (one per scoring round).
    pub fn importance_share(&self, epoch: u32, std_history: &[f64]) -> f64 {
        match self {
            SplitPolicy::Fixed { importance } => *importance,
            SplitPolicy::Scheduled { initial, steps } => steps
                .iter()
                .rev()
                .find(|&&(e, _)| e <= epoch)
                .map_or(*initial, |&(_, s)| s),
            SplitPolicy::Adaptive(a) => {
                let max = std_history.iter().copied().fold(0.0, f64::max);
                let now = savitzky_golay_last(std_history, a.window, a.order);
                match now {
                    Some(s) if max > 0.0 => {
                        (a.base + a.span * (s / max).clamp(0.0, 1.0)).clamp(0.0, 1.0)
                    }
                    _ => (a.base + a.span).clamp(0.0, 1.0),
                }
            }
        }
    }
}

/// The causal Savitzky-Golay estimate at the last point of `values`: a
/// least-squares polynomial of degree `order` fitted to the last `window`
/// points, evaluated at the last one. With fewer points than needed for the
/// fit, the last value itself; `None` for an empty series.
pub fn savitzky_golay_last(values: &[f64], window: usize, order: usize) -> Option<f64> {
    let last = *values.last()?;
    let tail = &values[values.len().saturating_sub(window)..];
    if tail.len() <= order {
        return Some(last);
    }
    // x runs from -(len-1) to 0, so the fitted value at the last point is the
    // constant coefficient. Solve the normal equations (A^T A) c = A^T y.
    let m = order + 1;
    let mut ata = vec![vec![0.0; m]; m];
    let mut aty = vec![0.0; m];
    for (i, &y) in tail.iter().enumerate() {
        let x = i as f64 - (tail.len() - 1) as f64;
        let powers: Vec<f64> = (0..m).map(|p| x.powi(p as i32)).collect();
        for r in 0..m {
            aty[r] += powers[r] * y;
            for c in 0..m {
                ata[r][c] += powers[r] * powers[c];
            }
        }
    }
    solve(ata, aty).map(|c| c[0]).or(Some(last))
}

/// Gaussian elimination with partial pivoting; `None` if singular.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (upper, lower) = a.split_at_mut(col + 1);
        let pivot_row = &upper[col];
        for (offset, row) in lower.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + offset] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let tail: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - tail) / a[row][row];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savitzky_golay_reproduces_a_polynomial_of_its_order() {
        let quad: Vec<f64> = (0..8)
            .map(|x| 2.0 + 0.5 * x as f64 - 0.25 * (x * x) as f64)
            .collect();
        let got = savitzky_golay_last(&quad, 5, 2).unwrap();
        assert!((got - quad[7]).abs() < 1e-9, "{got} vs {}", quad[7]);
        // Order 0 over a window is the window's mean.
        let got = savitzky_golay_last(&[1.0, 2.0, 3.0, 10.0, 20.0], 3, 0).unwrap();
        assert!((got - 11.0).abs() < 1e-9);
        assert_eq!(savitzky_golay_last(&[4.0], 5, 2), Some(4.0));
        assert_eq!(savitzky_golay_last(&[], 5, 2), None);
    }

    #[test]
    fn schedule_steps_at_its_epochs() {
        let s = SplitPolicy::Scheduled {
            initial: 1.0,
            steps: vec![(5, 0.8), (10, 0.6)],
        };
        s.validate().unwrap();
        assert_eq!(s.importance_share(0, &[]), 1.0);
        assert_eq!(s.importance_share(5, &[]), 0.8);
        assert_eq!(s.importance_share(9, &[]), 0.8);
        assert_eq!(s.importance_share(12, &[]), 0.6);
    }

    #[test]
    fn adaptive_shrinks_as_spread_falls() {
        let a = SplitPolicy::Adaptive(AdaptiveSplit::default());
        a.validate().unwrap();
        assert!((a.importance_share(0, &[]) - 0.95).abs() < 1e-9);
        let falling: Vec<f64> = (0..10).map(|i| 1.0 - 0.1 * i as f64).collect();
        let share = a.importance_share(3, &falling);
        assert!((share - (0.70 + 0.25 * 0.1)).abs() < 1e-6, "{share}");
    }

    #[test]
    fn rejects_out_of_range_shares() {
        assert!(SplitPolicy::Fixed { importance: 1.2 }.validate().is_err());
        let a = AdaptiveSplit {
            order: 5,
            ..AdaptiveSplit::default()
        };
        assert!(SplitPolicy::Adaptive(a).validate().is_err());
    }
}
