//! Least-recently-used replacement.

use std::collections::{BTreeMap, HashMap};

use super::uniform::{Replacement, UniformPolicy};
use crate::api::SampleId;

/// LRU bookkeeping: a logical clock per access.
#[derive(Debug, Default)]
pub struct Lru {
    clock: u64,
    by_time: BTreeMap<u64, SampleId>,
    time_of: HashMap<SampleId, u64>,
}

impl Lru {
    fn touch(&mut self, id: SampleId) {
        if let Some(old) = self.time_of.insert(id, self.clock) {
            self.by_time.remove(&old);
        }
        self.by_time.insert(self.clock, id);
        self.clock += 1;
    }
}

impl Replacement for Lru {
    const NAME: &'static str = "lru";

    fn on_hit(&mut self, id: SampleId) {
        self.touch(id);
    }

    fn on_insert(&mut self, id: SampleId) {
        self.touch(id);
    }

    fn pop_victim(&mut self) -> Option<SampleId> {
        let (_, id) = self.by_time.pop_first()?;
        self.time_of.remove(&id);
        Some(id)
    }
}

/// A uniformly-sampled LRU cache (PyTorch's default page cache behaviour).
pub type LruCache = UniformPolicy<Lru>;
