//! Label churn: how many photos a new model version gave a different top-1 label.

use std::ops::AddAssign;

/// Top-1 labels compared with an earlier version's, and how many changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Churn {
    /// Photos that had an earlier top-1 label to compare with.
    pub compared: u64,
    /// Of those, photos whose top-1 label changed.
    pub changed: u64,
}

impl Churn {
    /// Counts one photo: `old` is its earlier top-1 label (if any), `new` its new one.
    pub fn record(&mut self, old: Option<&str>, new: Option<&str>) {
        if let (Some(old), Some(new)) = (old, new) {
            self.compared += 1;
            self.changed += u64::from(old != new);
        }
    }

    /// `changed / compared` (0 when nothing was compared).
    pub fn fraction(&self) -> f64 {
        if self.compared == 0 {
            0.0
        } else {
            self.changed as f64 / self.compared as f64
        }
    }
}

impl AddAssign for Churn {
    fn add_assign(&mut self, other: Churn) {
        self.compared += other.compared;
        self.changed += other.changed;
    }
}

#[cfg(test)]
mod tests {
    use super::Churn;

    #[test]
    fn only_photos_with_both_labels_count() {
        let mut c = Churn::default();
        c.record(Some("cat"), Some("cat"));
        c.record(Some("cat"), Some("dog"));
        c.record(None, Some("dog"));
        c.record(Some("cat"), None);
        assert_eq!(
            c,
            Churn {
                compared: 2,
                changed: 1
            }
        );
        assert_eq!(c.fraction(), 0.5);
        c += Churn {
            compared: 2,
            changed: 0,
        };
        assert_eq!(c.fraction(), 0.25);
        assert_eq!(Churn::default().fraction(), 0.0);
    }
}
