//! SpiderCache's neighbourhood importance: the similarity scan over a
//! sample's nearest neighbours and the score formula with its variants.

use crate::api::{Label, SampleId};

/// The importance formula, given a sample's same-label and other-label
/// neighbour counts inside the similarity radius. `norm` is the `500` of the
/// formulas (the neighbour budget k of the artifact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScoreVariant {
    /// `ln(1 + ln(1 + 1/(same+1)) + other/norm)`: the artifact's final formula.
    #[default]
    LogLog,
    /// `0.7/(same+1) + 0.3*other/(same+other+1)`.
    Weighted,
    /// `1/(same+1) + other/norm`.
    InversePlusOther,
    /// `1/(same+1)`.
    Inverse,
    /// `1/(same+1) + ln(other/norm + 1)`.
    InversePlusLogOther,
}

impl ScoreVariant {
    /// The score of a sample with `same` same-label and `other` other-label neighbours.
    pub fn score(self, same: usize, other: usize, norm: f64) -> f64 {
        let inv = 1.0 / (same as f64 + 1.0);
        let other_f = other as f64;
        match self {
            ScoreVariant::LogLog => (1.0 + (1.0 + inv).ln() + other_f / norm).ln(),
            ScoreVariant::Weighted => 0.7 * inv + 0.3 * other_f / (same as f64 + other_f + 1.0),
            ScoreVariant::InversePlusOther => inv + other_f / norm,
            ScoreVariant::Inverse => inv,
            ScoreVariant::InversePlusLogOther => inv + (other_f / norm + 1.0).ln(),
        }
    }
}

/// What the scan of one sample's neighbours found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbourhood {
    /// Neighbours inside the radius with the sample's label.
    pub same: Vec<SampleId>,
    /// Neighbours inside the radius with another label.
    pub other: Vec<SampleId>,
}

/// Scans `neighbours` (ascending squared distance) of sample `me`, skipping
/// `me` by id, and stops at the first one farther than the squared radius
/// `radius_d2`. Neighbours with no known label are skipped.
pub fn scan_neighbours(
    me: SampleId,
    my_label: Label,
    neighbours: &[(SampleId, f32)],
    label_of: impl Fn(SampleId) -> Option<Label>,
    radius_d2: f64,
) -> Neighbourhood {
    let mut hood = Neighbourhood::default();
    for &(id, d2) in neighbours {
        if id == me {
            continue;
        }
        if f64::from(d2) > radius_d2 {
            break;
        }
        match label_of(id) {
            Some(l) if l == my_label => hood.same.push(id),
            Some(_) => hood.other.push(id),
            None => {}
        }
    }
    hood
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn loglog_matches_the_digest_anchors() {
        let s = |same, other| ScoreVariant::LogLog.score(same, other, 500.0);
        assert!(close(s(0, 0), 0.527), "isolated: {}", s(0, 0));
        assert!(close(s(1, 0), 0.340), "one twin: {}", s(1, 0));
        assert!(close(s(9, 0), 0.091), "nine twins: {}", s(9, 0));
        assert!(close(s(499, 0), 0.002), "499 twins: {}", s(499, 0));
        assert!(close(s(0, 499), 0.990), "499 others: {}", s(0, 499));
        assert!(
            s(3, 10) > s(3, 0),
            "other-label neighbours raise importance"
        );
        assert!(s(4, 0) < s(3, 0), "same-label neighbours lower it");
    }

    #[test]
    fn variants_on_known_counts() {
        assert!(close(ScoreVariant::Inverse.score(3, 7, 500.0), 0.25));
        assert!(close(
            ScoreVariant::InversePlusOther.score(1, 250, 500.0),
            1.0
        ));
        assert!(close(
            ScoreVariant::Weighted.score(1, 2, 500.0),
            0.35 + 0.15
        ));
        assert!(close(
            ScoreVariant::InversePlusLogOther.score(0, 500, 500.0),
            1.0 + 2f64.ln()
        ));
    }

    #[test]
    fn scan_stops_at_first_distant_neighbour_and_skips_self() {
        let labels = |id: SampleId| Some(if id.is_multiple_of(2) { 0 } else { 1 });
        let hood = scan_neighbours(
            4,
            0,
            &[(2, 0.0), (4, 0.5), (6, 1.0), (3, 2.0), (8, 2.1), (10, 0.1)],
            labels,
            2.02,
        );
        assert_eq!(hood.same, vec![2, 6]);
        assert_eq!(hood.other, vec![3]);
    }
}
