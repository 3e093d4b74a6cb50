//! Least-frequently-used replacement.

use std::collections::{BTreeSet, HashMap};

use super::uniform::{Replacement, UniformPolicy};
use crate::api::SampleId;

/// LFU bookkeeping: accesses per cached id, ties broken by the oldest access.
#[derive(Debug, Default)]
pub struct Lfu {
    clock: u64,
    order: BTreeSet<(u64, u64, SampleId)>,
    key_of: HashMap<SampleId, (u64, u64)>,
}

impl Lfu {
    fn bump(&mut self, id: SampleId) {
        let freq = match self.key_of.get(&id) {
            Some(&(f, t)) => {
                self.order.remove(&(f, t, id));
                f + 1
            }
            None => 1,
        };
        self.key_of.insert(id, (freq, self.clock));
        self.order.insert((freq, self.clock, id));
        self.clock += 1;
    }
}

impl Replacement for Lfu {
    const NAME: &'static str = "lfu";

    fn on_hit(&mut self, id: SampleId) {
        self.bump(id);
    }

    fn on_insert(&mut self, id: SampleId) {
        self.bump(id);
    }

    fn pop_victim(&mut self) -> Option<SampleId> {
        let (_, _, id) = self.order.pop_first()?;
        self.key_of.remove(&id);
        Some(id)
    }
}

/// A uniformly-sampled LFU cache.
pub type LfuCache = UniformPolicy<Lfu>;
