//! How SpiderCache divides its capacity between the importance cache and the
//! homophily cache.

use crate::error::CacheError;

/// The rule that sets the importance cache's share of the capacity (the
/// homophily cache gets the rest). Re-evaluated at every epoch start.
#[derive(Debug, Clone, PartialEq)]
pub enum SplitPolicy {
    /// Not in the artifact: the share moves by a step toward whichever part
    /// saved more storage reads per slot it held in the last epoch.
    Measured(MeasuredSplit),
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

/// Parameters of [`SplitPolicy::Measured`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredSplit {
    /// Importance share of the first epochs, before both parts are measured.
    pub initial: f64,
    /// Smallest importance share.
    pub min: f64,
    /// Largest importance share; below 1 so that the homophily cache always
    /// holds something to measure.
    pub max: f64,
    /// Change of the share per epoch.
    pub step: f64,
    /// Relative lead one part's gain needs before the share moves.
    pub margin: f64,
}

impl Default for MeasuredSplit {
    fn default() -> Self {
        Self {
            initial: 0.8,
            min: 0.5,
            max: 0.95,
            step: 0.1,
            margin: 0.1,
        }
    }
}

/// Storage reads each part of the capacity saved in one epoch per slot it
/// held on average (for the homophily cache, net of the reads its promotions
/// made); `None` for a part that held nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartGains {
    /// Exact hits of the importance cache per slot held.
    pub importance: Option<f64>,
    /// Substitutes and own hits of the homophily cache, less its reads, per slot held.
    pub homophily: Option<f64>,
}

/// What a split rule sees at an epoch start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SplitSignals<'a> {
    /// The share in force during the last epoch; `None` before the first.
    pub previous: Option<f64>,
    /// Standard deviation of the importance weights after each scoring round so far.
    pub std_history: &'a [f64],
    /// What each part earned in the last epoch.
    pub gains: PartGains,
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
            SplitPolicy::Measured(m) => {
                bad(m.min)
                    || bad(m.max)
                    || !(m.min <= m.initial && m.initial <= m.max)
                    || !(m.step >= 0.0 && m.margin >= 0.0)
            }
        };
        if invalid {
            return Err(CacheError::InvalidConfig(format!(
                "bad split policy {self:?}"
            )));
        }
        Ok(())
    }

    /// The importance share for `epoch`.
    pub fn importance_share(&self, epoch: u32, signals: &SplitSignals<'_>) -> f64 {
        let std_history = signals.std_history;
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
            SplitPolicy::Measured(m) => {
                let previous = signals.previous.unwrap_or(m.initial);
                let next = match (signals.gains.importance, signals.gains.homophily) {
                    (Some(i), Some(h)) if h > i + m.margin * i.abs() => previous - m.step,
                    (Some(i), Some(h)) if i > h + m.margin * h.abs() => previous + m.step,
                    _ => previous,
                };
                next.clamp(m.min, m.max)
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
        let none = SplitSignals::default();
        assert_eq!(s.importance_share(0, &none), 1.0);
        assert_eq!(s.importance_share(5, &none), 0.8);
        assert_eq!(s.importance_share(9, &none), 0.8);
        assert_eq!(s.importance_share(12, &none), 0.6);
    }

    #[test]
    fn adaptive_shrinks_as_spread_falls() {
        let a = SplitPolicy::Adaptive(AdaptiveSplit::default());
        a.validate().unwrap();
        assert!((a.importance_share(0, &SplitSignals::default()) - 0.95).abs() < 1e-9);
        let falling: Vec<f64> = (0..10).map(|i| 1.0 - 0.1 * i as f64).collect();
        let signals = SplitSignals {
            std_history: &falling,
            ..SplitSignals::default()
        };
        let share = a.importance_share(3, &signals);
        assert!((share - (0.70 + 0.25 * 0.1)).abs() < 1e-6, "{share}");
    }

    #[test]
    fn measured_moves_toward_the_part_that_saves_more_reads() {
        let m = SplitPolicy::Measured(MeasuredSplit::default());
        m.validate().unwrap();
        let at = |previous, importance, homophily| {
            m.importance_share(
                2,
                &SplitSignals {
                    previous,
                    std_history: &[],
                    gains: PartGains {
                        importance,
                        homophily,
                    },
                },
            )
        };
        assert!((at(None, None, None) - 0.8).abs() < 1e-9, "initial");
        assert!((at(Some(0.8), Some(2.0), Some(5.0)) - 0.7).abs() < 1e-9);
        assert!((at(Some(0.8), Some(5.0), Some(-1.0)) - 0.9).abs() < 1e-9);
        assert!(
            (at(Some(0.8), Some(5.0), Some(5.2)) - 0.8).abs() < 1e-9,
            "within the margin"
        );
        assert!(
            (at(Some(0.8), Some(5.0), None) - 0.8).abs() < 1e-9,
            "unmeasured"
        );
        assert!(
            (at(Some(0.9), Some(9.0), Some(1.0)) - 0.95).abs() < 1e-9,
            "capped"
        );
        assert!(
            (at(Some(0.5), Some(1.0), Some(9.0)) - 0.5).abs() < 1e-9,
            "floored"
        );
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
