//! SHADE's importance cache, reused by SpiderCache: a min-priority queue over
//! the cached ids keyed by (score, frequency) and a ghost table of the same
//! key over every id ever trained. A miss displaces the cache's minimum only
//! if its own ghost key is larger.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use crate::api::{Capacity, Sample, SampleId};
use crate::store::Store;

/// A (score, frequency) key, compared lexicographically.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Priority {
    pub(crate) score: f64,
    pub(crate) freq: u64,
}

impl Eq for Priority {}

impl Ord for Priority {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(self.freq.cmp(&other.freq))
    }
}

impl PartialOrd for Priority {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The cache: bytes, the priority queue over them and the ghost table.
#[derive(Debug)]
pub(crate) struct ImportanceCache {
    store: Store,
    queue: BTreeSet<(Priority, SampleId)>,
    ghost: Vec<Priority>,
}

impl ImportanceCache {
    /// A cache for ids `0..num_samples` whose unseen ids have score `initial_score`.
    pub(crate) fn new(limit: Capacity, num_samples: usize, initial_score: f64) -> Self {
        Self {
            store: Store::new(limit),
            queue: BTreeSet::new(),
            ghost: vec![
                Priority {
                    score: initial_score,
                    freq: 0
                };
                num_samples
            ],
        }
    }

    pub(crate) fn usage(&self) -> Capacity {
        self.store.usage()
    }

    pub(crate) fn contains(&self, id: SampleId) -> bool {
        self.store.contains(id)
    }

    pub(crate) fn get(&self, id: SampleId) -> Option<&Sample> {
        self.store.get(id)
    }

    /// Admits a missed sample: inserts it if it fits; otherwise evicts the
    /// lowest-priority entries needed to make room, but only if every one of
    /// them ranks below the newcomer's ghost key. Returns (inserted, evicted).
    pub(crate) fn admit(&mut self, id: SampleId, sample: Sample) -> (bool, u64) {
        let len = sample.data.len();
        if self.store.contains(id) || !self.store.could_hold(len) {
            return (false, 0);
        }
        let mine = self.ghost[id as usize];
        let mut victims = Vec::new();
        let mut freed = Capacity::default();
        for &(prio, victim) in &self.queue {
            if self.store.fits_after_freeing(len, freed) {
                break;
            }
            if prio >= mine {
                return (false, 0);
            }
            victims.push(victim);
            let f = self.store.footprint(victim);
            freed = Capacity::new(freed.items + f.items, freed.bytes + f.bytes);
        }
        if !self.store.fits_after_freeing(len, freed) {
            return (false, 0);
        }
        for &victim in &victims {
            self.remove(victim);
        }
        self.store.insert(id, sample);
        self.queue.insert((mine, id));
        (true, victims.len() as u64)
    }

    /// After a training step: every trained id gets `score = score_of(id)`
    /// and one more use, in the ghost table and, if cached, in the queue.
    pub(crate) fn record_trained(&mut self, ids: &[SampleId], score_of: impl Fn(SampleId) -> f64) {
        for &id in ids {
            let old = self.ghost[id as usize];
            let new = Priority {
                score: score_of(id),
                freq: old.freq + 1,
            };
            self.ghost[id as usize] = new;
            if self.store.contains(id) {
                self.queue.remove(&(old, id));
                self.queue.insert((new, id));
            }
        }
    }

    /// Changes the budget, evicting lowest-priority entries until within it;
    /// returns how many were evicted.
    pub(crate) fn set_limit(&mut self, limit: Capacity) -> u64 {
        self.store.set_limit(limit);
        let mut evicted = 0;
        while self.store.over_limit() {
            let Some(&(_, victim)) = self.queue.first() else {
                break;
            };
            self.remove(victim);
            evicted += 1;
        }
        evicted
    }

    fn remove(&mut self, id: SampleId) {
        if self.store.remove(id).is_some() {
            // A cached id's queue key is always its ghost key.
            self.queue.remove(&(self.ghost[id as usize], id));
        }
    }

    #[cfg(test)]
    pub(crate) fn ghost(&self, id: SampleId) -> (f64, u64) {
        let p = self.ghost[id as usize];
        (p.score, p.freq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(len: usize) -> Sample {
        Sample {
            label: 0,
            data: Bytes::from(vec![1u8; len]),
        }
    }

    #[test]
    fn admits_while_room_then_only_above_the_minimum() {
        let mut c = ImportanceCache::new(Capacity::new(2, 1000), 10, 0.1);
        assert_eq!(c.admit(1, s(10)), (true, 0));
        assert_eq!(c.admit(2, s(10)), (true, 0));
        let w = [0.0, 0.5, 0.2, 0.3, 0.9, 0.1, 0.0, 0.0, 0.0, 0.0];
        c.record_trained(&[1, 2, 3, 4, 5], |id| w[id as usize]);
        // Ghost of 5 is (0.1, 1) < min (0.2, 1) of id 2: rejected.
        assert_eq!(c.admit(5, s(10)), (false, 0));
        // Ghost of 3 is (0.3, 1) > (0.2, 1): id 2 goes.
        assert_eq!(c.admit(3, s(10)), (true, 1));
        assert!(c.contains(3) && c.contains(1) && !c.contains(2));
        // Equal score, higher frequency wins the tie.
        c.record_trained(&[3, 4], |id| if id == 3 { 0.9 } else { 0.5 });
        // Queue: 1 -> (0.5, 1), 3 -> (0.9, 2). Ghost of 4: (0.5, 2) > (0.5, 1).
        assert_eq!(c.admit(4, s(10)), (true, 1));
        assert!(!c.contains(1));
        assert_eq!(c.ghost(4), (0.5, 2));
    }

    #[test]
    fn unseen_id_uses_the_initial_key_and_does_not_evict_trained_ones() {
        let mut c = ImportanceCache::new(Capacity::new(1, 1000), 4, 0.1);
        c.admit(0, s(1));
        c.record_trained(&[0], |_| 0.1);
        assert_eq!(c.admit(1, s(1)), (false, 0), "(0.1, 0) < (0.1, 1)");
    }

    #[test]
    fn evicts_several_for_bytes_or_none() {
        let mut c = ImportanceCache::new(Capacity::new(10, 30), 10, 0.0);
        for id in 0..3 {
            c.admit(id, s(10));
        }
        c.record_trained(&[0, 1, 2, 7, 8], |id| id as f64);
        // 7 needs 25 bytes: evicting 0 and 1 and 2 (all below 7) makes room.
        assert_eq!(c.admit(7, s(25)), (true, 3));
        assert_eq!(c.usage(), Capacity::new(1, 25));
        // 8 needs 10 more: must evict 7, which ranks below 8.
        assert_eq!(c.admit(8, s(10)), (true, 1));
        // Too big for the budget at all.
        assert_eq!(c.admit(9, s(31)), (false, 0));
    }

    #[test]
    fn shrinking_evicts_the_minimum() {
        let mut c = ImportanceCache::new(Capacity::new(3, 100), 3, 0.0);
        for id in 0..3 {
            c.admit(id, s(1));
        }
        c.record_trained(&[0, 1, 2], |id| [0.5, 0.1, 0.9][id as usize]);
        assert_eq!(c.set_limit(Capacity::new(1, 100)), 2);
        assert!(c.contains(2));
    }
}
