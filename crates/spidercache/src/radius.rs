//! How near a neighbour must be to count: the artifact's absolute similarity
//! radius, or a radius relative to the embeddings' own scale (a running
//! quantile of nearest-neighbour distances in the index).

use std::collections::VecDeque;

use crate::error::CacheError;

/// The neighbourhood radius of SpiderCache's scan, as a squared L2 distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Radius {
    /// The artifact's rule: a neighbour counts while `exp(-decay * d2) >=
    /// threshold` (0.01 and 0.98: `d2 <= 2.02`), whatever the scale of the
    /// embeddings. Kept for fidelity; on embeddings with squared norms in the
    /// hundreds almost nothing is that close and every score is the same.
    Similarity {
        /// The `0.01` of `exp(-0.01 * d2)`.
        decay: f64,
        /// The `0.98` the similarity must reach.
        threshold: f64,
    },
    /// Scale-free: `d2 <= scale * quantile(q)` of the squared distances from
    /// the last `window` scored samples to their nearest other sample in the
    /// index, recomputed every round so that it follows the embeddings' drift.
    Quantile {
        /// The quantile, 0..=1 (0.5: the median nearest-neighbour distance).
        q: f64,
        /// Multiplier of the quantile.
        scale: f64,
        /// Nearest-neighbour distances remembered.
        window: usize,
    },
}

impl Default for Radius {
    /// Twice the median squared nearest-neighbour distance of the last 4096
    /// scored samples: on the harness's embeddings about the median distance
    /// to the fifth neighbour, so that most samples have a few neighbours
    /// and the score spreads.
    fn default() -> Self {
        Radius::Quantile {
            q: 0.5,
            scale: 2.0,
            window: 4096,
        }
    }
}

impl Radius {
    /// The artifact's radius: similarity `exp(-0.01 * d2) >= 0.98`.
    pub fn artifact() -> Self {
        Radius::Similarity {
            decay: 0.01,
            threshold: 0.98,
        }
    }

    /// Checks that the rule defines a radius.
    pub fn validate(&self) -> Result<(), CacheError> {
        let ok = match *self {
            Radius::Similarity { decay, threshold } => {
                decay > 0.0 && decay.is_finite() && threshold > 0.0 && threshold <= 1.0
            }
            Radius::Quantile { q, scale, window } => {
                (0.0..=1.0).contains(&q) && scale > 0.0 && scale.is_finite() && window > 0
            }
        };
        if ok {
            Ok(())
        } else {
            Err(CacheError::InvalidConfig(format!("bad radius {self:?}")))
        }
    }
}

/// The radius in force: the rule plus, for a relative rule, the recent
/// nearest-neighbour distances it is computed from.
#[derive(Debug)]
pub(crate) struct RadiusTracker {
    rule: Radius,
    recent: VecDeque<f32>,
}

impl RadiusTracker {
    pub(crate) fn new(rule: Radius) -> Self {
        Self {
            rule,
            recent: VecDeque::new(),
        }
    }

    /// Remembers one scored sample's squared distance to its nearest neighbour.
    pub(crate) fn observe(&mut self, nearest_d2: f32) {
        if let Radius::Quantile { window, .. } = self.rule {
            if self.recent.len() == window {
                self.recent.pop_front();
            }
            self.recent.push_back(nearest_d2);
        }
    }

    /// The squared radius now; 0 while a relative rule has seen no distance.
    pub(crate) fn squared(&self) -> f64 {
        match self.rule {
            Radius::Similarity { decay, threshold } => -threshold.ln() / decay,
            Radius::Quantile { q, scale, .. } => {
                if self.recent.is_empty() {
                    return 0.0;
                }
                let mut values: Vec<f32> = self.recent.iter().copied().collect();
                let at = ((values.len() - 1) as f64 * q).round() as usize;
                let (_, nth, _) = values.select_nth_unstable_by(at, f32::total_cmp);
                scale * f64::from(*nth)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_artifact_radius_is_a_squared_distance_of_about_two() {
        let r = RadiusTracker::new(Radius::artifact());
        assert!((r.squared() - 2.0203).abs() < 1e-3, "{}", r.squared());
    }

    #[test]
    fn the_quantile_follows_the_recent_window_only() {
        let mut r = RadiusTracker::new(Radius::Quantile {
            q: 0.5,
            scale: 2.0,
            window: 3,
        });
        assert_eq!(r.squared(), 0.0);
        for d in [100.0, 1.0, 3.0, 2.0] {
            r.observe(d);
        }
        // The window keeps 1, 3, 2: median 2, times 2.
        assert_eq!(r.squared(), 4.0);
    }

    #[test]
    fn rejects_rules_without_a_radius() {
        assert!(
            Radius::Quantile {
                q: 1.5,
                scale: 1.0,
                window: 8
            }
            .validate()
            .is_err()
        );
        assert!(
            Radius::Similarity {
                decay: 0.0,
                threshold: 0.9
            }
            .validate()
            .is_err()
        );
        assert!(Radius::default().validate().is_ok());
    }
}
