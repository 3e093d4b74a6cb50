//! SpiderCache's homophily cache: representatives whose bytes are served to
//! their same-label near-duplicates, evicted least-frequently-substituted first.

use std::collections::{BTreeMap, HashMap};

use rand::Rng;

use crate::api::{Capacity, Sample, SampleId, SampleSource};
use crate::error::CacheError;
use crate::store::Store;

struct Representative {
    neighbours: Vec<SampleId>,
    uses: u64,
    seq: u64,
}

/// What one promotion did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Promotion {
    pub(crate) fetched: u64,
    pub(crate) evicted: u64,
}

pub(crate) struct HomophilyCache {
    store: Store,
    reps: HashMap<SampleId, Representative>,
    served_by: HashMap<SampleId, SampleId>,
    candidates: BTreeMap<SampleId, Vec<SampleId>>,
    seq: u64,
}

impl HomophilyCache {
    pub(crate) fn new(limit: Capacity) -> Self {
        Self {
            store: Store::new(limit),
            reps: HashMap::new(),
            served_by: HashMap::new(),
            candidates: BTreeMap::new(),
            seq: 0,
        }
    }

    pub(crate) fn usage(&self) -> Capacity {
        self.store.usage()
    }

    /// The representative serving `id` and its bytes; counts one use.
    pub(crate) fn lookup(&mut self, id: SampleId) -> Option<(SampleId, &Sample)> {
        let rep = *self.served_by.get(&id)?;
        self.reps.get_mut(&rep)?.uses += 1;
        Some((rep, self.store.get(rep)?))
    }

    /// A scoring round's candidate: `rep` and its same-label neighbours.
    pub(crate) fn propose(&mut self, rep: SampleId, neighbours: Vec<SampleId>) {
        self.candidates.insert(rep, neighbours);
    }

    /// Promotes one random candidate: fetches its bytes, evicts the
    /// least-used representatives until it fits, and maps its neighbours to it.
    /// A candidate that is already a representative only refreshes its list.
    pub(crate) fn promote_one(
        &mut self,
        rng: &mut impl Rng,
        source: &dyn SampleSource,
    ) -> Result<Promotion, CacheError> {
        let mut done = Promotion::default();
        if self.candidates.is_empty() {
            return Ok(done);
        }
        let pick = rng.random_range(0..self.candidates.len());
        let rep = *self.candidates.keys().nth(pick).expect("index below len");
        let neighbours = self.candidates.remove(&rep).expect("key just read");
        self.seq += 1;
        if let Some(existing) = self.reps.get_mut(&rep) {
            existing.neighbours = neighbours;
            existing.seq = self.seq;
        } else {
            let sample = source.fetch(rep)?;
            done.fetched = 1;
            let len = sample.data.len();
            if !self.store.could_hold(len) {
                return Ok(done);
            }
            while !self.store.fits(len) {
                self.evict_least_used();
                done.evicted += 1;
            }
            self.store.insert(rep, sample);
            self.reps.insert(
                rep,
                Representative {
                    neighbours,
                    uses: 0,
                    seq: self.seq,
                },
            );
        }
        self.rebuild_map();
        Ok(done)
    }

    /// Changes the budget, evicting least-used representatives until within it.
    pub(crate) fn set_limit(&mut self, limit: Capacity) -> u64 {
        self.store.set_limit(limit);
        let mut evicted = 0;
        while self.store.over_limit() && !self.reps.is_empty() {
            self.evict_least_used();
            evicted += 1;
        }
        if evicted > 0 {
            self.rebuild_map();
        }
        evicted
    }

    fn evict_least_used(&mut self) {
        let victim = self
            .reps
            .iter()
            .min_by_key(|(_, r)| (r.uses, r.seq))
            .map(|(&id, _)| id);
        if let Some(victim) = victim {
            self.reps.remove(&victim);
            self.store.remove(victim);
        }
    }

    /// Maps every neighbour, and each representative itself, to its
    /// representative; on overlap the most recently promoted one wins.
    fn rebuild_map(&mut self) {
        let mut reps: Vec<(&SampleId, &Representative)> = self.reps.iter().collect();
        reps.sort_by_key(|(_, r)| r.seq);
        self.served_by.clear();
        for (&rep, r) in reps {
            for &n in &r.neighbours {
                self.served_by.insert(n, rep);
            }
            self.served_by.insert(rep, rep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemorySource;
    use crate::sampler::rng_for;
    use bytes::Bytes;

    fn source(n: usize) -> MemorySource {
        MemorySource::new(
            (0..n)
                .map(|i| Sample {
                    label: (i % 3) as u32,
                    data: Bytes::from(vec![i as u8; 10]),
                })
                .collect(),
        )
    }

    #[test]
    fn neighbours_are_served_by_their_representative() {
        let src = source(10);
        let mut rng = rng_for(0, 0, 0);
        let mut h = HomophilyCache::new(Capacity::new(2, 100));
        h.propose(3, vec![6, 9]);
        assert_eq!(
            h.promote_one(&mut rng, &src).unwrap(),
            Promotion {
                fetched: 1,
                evicted: 0
            }
        );
        let (rep, s) = h.lookup(6).unwrap();
        assert_eq!((rep, s.data[0]), (3, 3));
        assert_eq!(h.lookup(3).unwrap().0, 3);
        assert!(h.lookup(4).is_none());
    }

    #[test]
    fn evicts_the_least_used_representative() {
        let src = source(10);
        let mut rng = rng_for(0, 0, 0);
        let mut h = HomophilyCache::new(Capacity::new(2, 100));
        h.propose(1, vec![4]);
        h.promote_one(&mut rng, &src).unwrap();
        h.propose(2, vec![5]);
        h.promote_one(&mut rng, &src).unwrap();
        // Rep 1 is used twice, rep 2 once: rep 2 is the LFU victim.
        h.lookup(4);
        h.lookup(4);
        h.lookup(5);
        h.propose(7, vec![8]);
        assert_eq!(
            h.promote_one(&mut rng, &src).unwrap(),
            Promotion {
                fetched: 1,
                evicted: 1
            }
        );
        assert!(h.lookup(5).is_none(), "rep 2 evicted");
        assert_eq!(h.lookup(4).unwrap().0, 1);
        assert_eq!(h.lookup(8).unwrap().0, 7);
        assert_eq!(h.usage(), Capacity::new(2, 20));
    }

    #[test]
    fn shrinking_drops_representatives_and_their_mappings() {
        let src = source(10);
        let mut rng = rng_for(0, 0, 0);
        let mut h = HomophilyCache::new(Capacity::new(2, 100));
        h.propose(1, vec![4]);
        h.promote_one(&mut rng, &src).unwrap();
        assert_eq!(h.set_limit(Capacity::new(0, 0)), 1);
        assert!(h.lookup(4).is_none());
        assert_eq!(h.usage(), Capacity::default());
    }
}
