//! The flags that override a policy's settings: SpiderCache's
//! ([`SpiderKnobs`]) and its peers' ([`PeerKnobs`]). `None` keeps the
//! setting [`policy_specs`](crate::bench::policy_specs) gives.

use serde::{Deserialize, Serialize};
use spidercache::{PolicyKind, Radius, SplitPolicy};

/// Overrides of the SpiderCache variants (`None` keeps the crate's
/// default): the radius of those with a relative one, the homophily cache,
/// the scan, and the split of those with a measured one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpiderKnobs {
    /// The quantile of nearest-neighbour distances the radius is.
    pub radius_quantile: Option<f64>,
    /// The multiplier of that quantile.
    pub radius_scale: Option<f64>,
    /// Neighbours one homophily representative stands in for at most.
    pub max_neighbours: Option<usize>,
    /// A fixed importance share in place of the measured split (an ablation).
    pub importance_share: Option<f64>,
    /// The measured split's ceiling on the importance share.
    pub max_importance_share: Option<f64>,
    /// Homophily representatives promoted per scoring round at most.
    pub promotions_per_round: Option<usize>,
    /// Expected requests a promotion must newly cover (and a replacement gain).
    pub min_gain: Option<f64>,
    /// Neighbours fetched per query.
    pub k: Option<usize>,
    /// A scoring round on every this-many reported batches.
    pub scoring_interval: Option<usize>,
}

impl SpiderKnobs {
    /// `kind` with these overrides, if it is a SpiderCache.
    pub fn apply(&self, kind: PolicyKind) -> PolicyKind {
        match kind {
            PolicyKind::Spider(mut c) => {
                if let Radius::Quantile { q, scale, .. } = &mut c.radius {
                    *q = self.radius_quantile.unwrap_or(*q);
                    *scale = self.radius_scale.unwrap_or(*scale);
                }
                let h = &mut c.homophily;
                h.max_neighbours = self.max_neighbours.unwrap_or(h.max_neighbours);
                h.promotions_per_round =
                    self.promotions_per_round.unwrap_or(h.promotions_per_round);
                h.min_gain = self.min_gain.unwrap_or(h.min_gain);
                c.k = self.k.unwrap_or(c.k);
                c.scoring_interval = self.scoring_interval.unwrap_or(c.scoring_interval);
                if let SplitPolicy::Measured(m) = &mut c.split {
                    m.max = self.max_importance_share.unwrap_or(m.max);
                }
                if let (SplitPolicy::Measured(_), Some(importance)) =
                    (&c.split, self.importance_share)
                {
                    c.split = SplitPolicy::Fixed { importance };
                }
                PolicyKind::Spider(c)
            }
            other => other,
        }
    }
}

/// Overrides of the peers' and the shared sampler's settings (`None` keeps
/// [`policy_specs`](crate::bench::policy_specs)'s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerKnobs {
    /// iCache's warm-up epochs (default: its artifact's 5 of 90, scaled to the budget).
    pub icache_warm_up: Option<u32>,
    /// iCache's beta (default 0.33, its artifact's command line).
    pub icache_beta: Option<f64>,
    /// How many times SHADE's and SpiderCache's samplers repeat a cached draw (3.0).
    pub rep_factor: Option<f64>,
}

impl PeerKnobs {
    /// `kind` with these overrides.
    pub fn apply(&self, kind: PolicyKind) -> PolicyKind {
        let rep = |r: &mut f64| *r = self.rep_factor.unwrap_or(*r);
        match kind {
            PolicyKind::ICache(mut c) => {
                c.warm_up = self.icache_warm_up.unwrap_or(c.warm_up);
                c.beta = self.icache_beta.unwrap_or(c.beta);
                PolicyKind::ICache(c)
            }
            PolicyKind::Shade(mut c) => {
                rep(&mut c.sampler.rep_factor);
                PolicyKind::Shade(c)
            }
            PolicyKind::Spider(mut c) => {
                rep(&mut c.sampler.rep_factor);
                PolicyKind::Spider(c)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::policy_specs;

    fn spec(label: &str) -> PolicyKind {
        policy_specs(6)
            .into_iter()
            .find(|p| p.label == label)
            .unwrap()
            .kind
    }

    #[test]
    fn icache_runs_at_its_artifact_settings_unless_told_otherwise() {
        let PolicyKind::ICache(c) = spec("icache") else {
            panic!("icache is iCache")
        };
        // 5 of 90 epochs, scaled to 6 and rounded up; the artifact's beta.
        assert_eq!((c.warm_up, c.beta), (1, 0.33));
        let knobs = PeerKnobs {
            icache_warm_up: Some(2),
            icache_beta: Some(1.0),
            rep_factor: Some(2.0),
        };
        let PolicyKind::ICache(c) = knobs.apply(spec("icache")) else {
            panic!("still iCache")
        };
        assert_eq!((c.warm_up, c.beta), (2, 1.0));
        let PolicyKind::Shade(s) = knobs.apply(spec("shade")) else {
            panic!("still SHADE")
        };
        assert_eq!(s.sampler.rep_factor, 2.0);
        assert_eq!(knobs.apply(PolicyKind::Lru), PolicyKind::Lru);
    }

    #[test]
    fn spider_knobs_reach_the_measured_split_and_leave_the_artifact_radius_alone() {
        let knobs = SpiderKnobs {
            radius_scale: Some(3.0),
            max_importance_share: Some(0.8),
            k: Some(50),
            ..SpiderKnobs::default()
        };
        let PolicyKind::Spider(c) = knobs.apply(spec("spidercache+homophily")) else {
            panic!("SpiderCache")
        };
        assert!(matches!(c.split, SplitPolicy::Measured(m) if m.max == 0.8));
        assert!(matches!(c.radius, Radius::Quantile { scale, .. } if scale == 3.0));
        assert_eq!(c.k, 50);
        let PolicyKind::Spider(a) = knobs.apply(spec("spidercache-artifact")) else {
            panic!("SpiderCache")
        };
        assert_eq!(a.radius, Radius::artifact());
        let fixed = SpiderKnobs {
            importance_share: Some(0.8),
            ..SpiderKnobs::default()
        };
        let PolicyKind::Spider(f) = fixed.apply(spec("spidercache+homophily")) else {
            panic!("SpiderCache")
        };
        assert_eq!(f.split, SplitPolicy::Fixed { importance: 0.8 });
    }
}
