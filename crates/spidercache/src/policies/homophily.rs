//! SpiderCache's homophily cache: representatives whose bytes are served to
//! their same-label near neighbours.
//!
//! Every scored sample with same-label neighbours inside the radius is a
//! candidate. Representatives are chosen by greedy weighted set cover: the
//! candidate whose members (itself and its nearest same-label neighbours, at
//! most [`HomophilyConfig::max_neighbours`]) add the most expected requests
//! not yet covered and not already in the importance cache. When the cache is
//! full, a candidate replaces the representative whose own coverage is worth
//! least, and only if it is worth at least [`HomophilyConfig::min_gain`] more
//! (the read it costs). The choice is made before any read,
//! so a candidate the cache has no room for costs nothing; the read itself
//! happens outside the policy's lock, between [`HomophilyCache::plan`] and
//! [`HomophilyCache::install`].

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::api::{Capacity, Sample, SampleId};
use crate::error::CacheError;
use crate::store::Store;

/// How the homophily cache picks its representatives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HomophilyConfig {
    /// Same-label neighbours one representative stands in for at most, the
    /// nearest first (10).
    pub max_neighbours: usize,
    /// Representatives promoted per scoring round at most (8).
    pub promotions_per_round: usize,
    /// Expected requests per epoch a promotion must newly cover, and by which
    /// a replacement must beat the representative it evicts (1.0: the one
    /// read it costs).
    pub min_gain: f64,
    /// Candidates remembered between rounds; the oldest are forgotten (2048).
    pub pool: usize,
}

impl Default for HomophilyConfig {
    fn default() -> Self {
        Self {
            max_neighbours: 10,
            promotions_per_round: 8,
            min_gain: 1.0,
            pool: 2048,
        }
    }
}

impl HomophilyConfig {
    /// Checks that candidates can be kept and compared.
    pub fn validate(&self) -> Result<(), CacheError> {
        if self.max_neighbours == 0
            || self.pool == 0
            || self.min_gain.is_nan()
            || self.min_gain < 0.0
        {
            return Err(CacheError::InvalidConfig(format!(
                "bad homophily settings {self:?}"
            )));
        }
        Ok(())
    }
}

struct Representative {
    neighbours: Vec<SampleId>,
    uses: u64,
    seq: u64,
}

struct Candidate {
    neighbours: Vec<SampleId>,
    seq: u64,
}

/// A representative chosen by [`HomophilyCache::plan`]: read its bytes, then
/// [`install`](HomophilyCache::install) or [`abandon`](HomophilyCache::abandon) it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    pub(crate) rep: SampleId,
    neighbours: Vec<SampleId>,
    victim: Option<SampleId>,
}

pub(crate) struct HomophilyCache {
    store: Store,
    config: HomophilyConfig,
    reps: HashMap<SampleId, Representative>,
    served_by: HashMap<SampleId, SampleId>,
    pool: BTreeMap<SampleId, Candidate>,
    planned: HashSet<SampleId>,
    seq: u64,
    map_stale: bool,
}

impl HomophilyCache {
    pub(crate) fn new(limit: Capacity, config: HomophilyConfig) -> Self {
        Self {
            store: Store::new(limit),
            config,
            reps: HashMap::new(),
            served_by: HashMap::new(),
            pool: BTreeMap::new(),
            planned: HashSet::new(),
            seq: 0,
            map_stale: false,
        }
    }

    pub(crate) fn usage(&self) -> Capacity {
        self.store.usage()
    }

    pub(crate) fn representatives(&self) -> usize {
        self.reps.len()
    }

    /// Samples served by a representative other than themselves.
    pub(crate) fn covered(&self) -> usize {
        self.served_by.iter().filter(|(n, r)| n != r).count()
    }

    /// The representative serving `id` and its bytes; counts one use.
    pub(crate) fn lookup(&mut self, id: SampleId) -> Option<(SampleId, &Sample)> {
        let rep = *self.served_by.get(&id)?;
        self.reps.get_mut(&rep)?.uses += 1;
        Some((rep, self.store.get(rep)?))
    }

    /// A scored sample and its nearest same-label neighbours: a candidate, or
    /// a representative's fresh list. Call [`end_round`](Self::end_round) after a round's offers.
    pub(crate) fn offer(&mut self, id: SampleId, mut neighbours: Vec<SampleId>) {
        neighbours.truncate(self.config.max_neighbours);
        self.seq += 1;
        if let Some(rep) = self.reps.get_mut(&id) {
            if rep.neighbours != neighbours {
                rep.neighbours = neighbours;
                self.map_stale = true;
            }
        } else if neighbours.is_empty() {
            self.pool.remove(&id);
        } else {
            let seq = self.seq;
            self.pool.insert(id, Candidate { neighbours, seq });
        }
    }

    /// Forgets the oldest candidates beyond the pool size and remaps
    /// representatives whose lists changed.
    pub(crate) fn end_round(&mut self) {
        if self.pool.len() > self.config.pool {
            let mut ages: Vec<(u64, SampleId)> =
                self.pool.iter().map(|(&id, c)| (c.seq, id)).collect();
            ages.sort_unstable();
            let excess = self.pool.len() - self.config.pool;
            for &(_, id) in &ages[..excess] {
                self.pool.remove(&id);
            }
        }
        if self.map_stale {
            self.rebuild_map();
        }
    }

    /// Chooses up to `max` candidates to promote, greedily by the expected
    /// requests they newly cover. `expected(id)` is how often `id` is expected
    /// to be requested per epoch; `exact(id)` says it is served exactly anyway
    /// (it is in the importance cache). Nothing is chosen that the cache has
    /// no room for, even after its least valuable representative goes.
    pub(crate) fn plan(
        &mut self,
        max: usize,
        expected: impl Fn(SampleId) -> f64,
        exact: impl Fn(SampleId) -> bool,
    ) -> Vec<Planned> {
        let limit = self.store.limit();
        let used = self.store.usage();
        if max == 0 || limit.items == 0 || limit.bytes == 0 {
            return Vec::new();
        }
        let mut free = if used.bytes < limit.bytes {
            limit.items.saturating_sub(used.items + self.planned.len())
        } else {
            0
        };
        let worth = |id: SampleId| if exact(id) { 0.0 } else { expected(id) };
        let mut covered = self.served_by.clone();
        let mut value: HashMap<SampleId, f64> = HashMap::new();
        for (&n, &rep) in &covered {
            *value.entry(rep).or_default() += worth(n);
        }
        let mut plans = Vec::new();
        for _ in 0..max {
            let gain = |id: SampleId, c: &Candidate| -> f64 {
                std::iter::once(id)
                    .chain(c.neighbours.iter().copied())
                    .filter(|n| !covered.contains_key(n))
                    .map(worth)
                    .sum()
            };
            let best = self
                .pool
                .iter()
                .filter(|(id, _)| !self.reps.contains_key(id) && !self.planned.contains(id))
                .map(|(&id, c)| (id, gain(id, c)))
                .fold(None, |best: Option<(SampleId, f64)>, (id, g)| match best {
                    Some((_, b)) if b >= g => best,
                    _ => Some((id, g)),
                });
            let Some((id, g)) = best.filter(|&(_, g)| g >= self.config.min_gain) else {
                break;
            };
            let victim = if free > 0 {
                free -= 1;
                None
            } else {
                let weakest = value
                    .iter()
                    .filter(|(r, _)| self.reps.contains_key(r))
                    .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
                    .map(|(&r, &v)| (r, v));
                // Replacing costs a read: the newcomer must beat the weakest by `min_gain`.
                match weakest {
                    Some((r, v)) if g - v >= self.config.min_gain => {
                        covered.retain(|_, rep| *rep != r);
                        value.remove(&r);
                        Some(r)
                    }
                    _ => break,
                }
            };
            let neighbours = self.pool[&id].neighbours.clone();
            for n in std::iter::once(id).chain(neighbours.iter().copied()) {
                if let std::collections::hash_map::Entry::Vacant(e) = covered.entry(n) {
                    e.insert(id);
                    *value.entry(id).or_default() += worth(n);
                }
            }
            self.planned.insert(id);
            plans.push(Planned {
                rep: id,
                neighbours,
                victim,
            });
        }
        plans
    }

    /// Installs a planned representative with its bytes, evicting its planned
    /// victim (and, if the bytes still do not fit, the least used) first.
    /// Returns how many representatives were evicted, and whether it went in.
    pub(crate) fn install(&mut self, plan: Planned, sample: Sample) -> (u64, bool) {
        self.planned.remove(&plan.rep);
        self.pool.remove(&plan.rep);
        let len = sample.data.len();
        if self.reps.contains_key(&plan.rep) || !self.store.could_hold(len) {
            return (0, false);
        }
        let mut evicted = 0;
        if let Some(victim) = plan.victim.filter(|v| self.reps.contains_key(v))
            && !self.store.fits(len)
        {
            self.evict(victim);
            evicted += 1;
        }
        while !self.store.fits(len) && !self.reps.is_empty() {
            self.evict_least_used();
            evicted += 1;
        }
        self.seq += 1;
        self.store.insert(plan.rep, sample);
        self.reps.insert(
            plan.rep,
            Representative {
                neighbours: plan.neighbours,
                uses: 0,
                seq: self.seq,
            },
        );
        self.rebuild_map();
        (evicted, true)
    }

    /// Drops a planned representative whose bytes could not be read.
    pub(crate) fn abandon(&mut self, plan: &Planned) {
        self.planned.remove(&plan.rep);
    }

    /// Changes the budget, evicting least-used representatives until within it.
    pub(crate) fn set_limit(&mut self, limit: Capacity) -> u64 {
        self.store.set_limit(limit);
        let mut evicted = 0;
        while self.store.over_limit() && !self.reps.is_empty() {
            self.evict_least_used();
            evicted += 1;
        }
        evicted
    }

    fn evict(&mut self, victim: SampleId) {
        self.reps.remove(&victim);
        self.store.remove(victim);
        self.rebuild_map();
    }

    fn evict_least_used(&mut self) {
        let victim = self
            .reps
            .iter()
            .min_by_key(|&(&id, r)| (r.uses, r.seq, id))
            .map(|(&id, _)| id);
        if let Some(victim) = victim {
            self.evict(victim);
        }
    }

    /// Maps each representative to itself and its neighbours to it; a sample
    /// in several lists stays with the representative promoted first.
    fn rebuild_map(&mut self) {
        let mut reps: Vec<(&SampleId, &Representative)> = self.reps.iter().collect();
        reps.sort_by_key(|(_, r)| r.seq);
        self.served_by.clear();
        for &(&rep, _) in &reps {
            self.served_by.insert(rep, rep);
        }
        for (&rep, r) in reps {
            for &n in &r.neighbours {
                self.served_by.entry(n).or_insert(rep);
            }
        }
        self.map_stale = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn sample(id: SampleId) -> Sample {
        Sample {
            label: 0,
            data: Bytes::from(vec![id as u8; 10]),
        }
    }

    fn cache(items: usize, max_neighbours: usize) -> HomophilyCache {
        let config = HomophilyConfig {
            max_neighbours,
            ..HomophilyConfig::default()
        };
        HomophilyCache::new(Capacity::new(items, items as u64 * 10), config)
    }

    /// Plans with every sample expected once per epoch and none cached exactly.
    fn plan(h: &mut HomophilyCache, max: usize) -> Vec<Planned> {
        h.plan(max, |_| 1.0, |_| false)
    }

    fn promote(h: &mut HomophilyCache, max: usize) -> Vec<SampleId> {
        plan(h, max)
            .into_iter()
            .map(|p| {
                let rep = p.rep;
                assert!(h.install(p, sample(rep)).1);
                rep
            })
            .collect()
    }

    #[test]
    fn set_cover_picks_the_widest_uncovered_lists_first() {
        let mut h = cache(2, 10);
        h.offer(1, vec![10, 11, 12]);
        h.offer(2, vec![10, 11, 12, 13]);
        h.offer(3, vec![20, 21, 22]);
        h.end_round();
        // 2 covers five, then 3 adds four; 1 would only add itself.
        assert_eq!(promote(&mut h, 3), vec![2, 3]);
        assert_eq!(h.lookup(12).unwrap().0, 2);
        assert_eq!(h.lookup(21).unwrap().0, 3);
        assert_eq!(h.lookup(3).unwrap().0, 3);
        assert!(h.lookup(1).is_none());
        assert_eq!((h.representatives(), h.covered()), (2, 7));
    }

    #[test]
    fn the_cap_bounds_each_representative_list() {
        let mut h = cache(4, 3);
        h.offer(0, (1..50).collect());
        h.end_round();
        assert_eq!(promote(&mut h, 1), vec![0]);
        assert_eq!(h.covered(), 3, "only the 3 nearest neighbours are served");
        assert!(h.lookup(3).is_some() && h.lookup(4).is_none());
    }

    #[test]
    fn no_plan_without_room_or_worth() {
        let mut h = cache(0, 10);
        h.offer(0, vec![1, 2, 3]);
        h.end_round();
        assert!(plan(&mut h, 4).is_empty(), "no slot at all");

        let mut h = cache(1, 10);
        h.offer(0, vec![1, 2, 3, 4]);
        h.end_round();
        promote(&mut h, 1);
        h.offer(5, vec![6]);
        h.end_round();
        assert!(plan(&mut h, 4).is_empty(), "full, and 5 covers less than 0");
        // Samples in the importance cache are worth nothing to cover.
        let plans = h.plan(4, |_| 1.0, |id| (1..=4).contains(&id));
        assert_eq!(plans.iter().map(|p| p.rep).collect::<Vec<_>>(), vec![5]);
        assert_eq!(plans[0].victim, Some(0));
    }

    #[test]
    fn a_replacement_must_be_worth_its_read() {
        let mut h = cache(1, 10);
        h.offer(0, vec![1]);
        h.end_round();
        promote(&mut h, 1);
        // 3 covers three samples against 0's two: at 0.4 expected requests
        // each, better by less than the read a replacement costs.
        h.offer(3, vec![4, 5]);
        h.end_round();
        assert!(h.plan(4, |_| 0.4, |_| false).is_empty());
        let plans = h.plan(4, |_| 1.0, |_| false);
        assert_eq!(plans.len(), 1, "better by one read at 1.0 each");
        assert_eq!(plans[0].victim, Some(0));
    }

    #[test]
    fn a_better_candidate_replaces_the_weakest_representative() {
        let mut h = cache(1, 10);
        h.offer(0, vec![1]);
        h.end_round();
        promote(&mut h, 1);
        h.offer(5, vec![6, 7, 8]);
        h.end_round();
        let plans = plan(&mut h, 4);
        assert_eq!(plans.len(), 1, "one slot, one replacement");
        let p = plans.into_iter().next().unwrap();
        assert_eq!((p.rep, p.victim), (5, Some(0)));
        assert_eq!(h.install(p, sample(5)), (1, true));
        assert!(h.lookup(1).is_none());
        assert_eq!(h.lookup(7).unwrap().0, 5);
        assert_eq!(h.usage(), Capacity::new(1, 10));
    }

    #[test]
    fn planned_slots_are_reserved_until_installed_or_abandoned() {
        let mut h = cache(1, 10);
        h.offer(0, vec![1, 2]);
        h.offer(3, vec![4]);
        h.end_round();
        let first = plan(&mut h, 1);
        assert_eq!(first.len(), 1);
        assert!(plan(&mut h, 1).is_empty(), "the one slot is planned");
        h.abandon(&first[0]);
        assert_eq!(plan(&mut h, 1).len(), 1);
    }

    #[test]
    fn shrinking_drops_representatives_and_their_mappings() {
        let mut h = cache(2, 10);
        h.offer(1, vec![4]);
        h.end_round();
        promote(&mut h, 1);
        assert_eq!(h.set_limit(Capacity::new(0, 0)), 1);
        assert!(h.lookup(4).is_none());
        assert_eq!(h.usage(), Capacity::default());
    }
}
