//! CoorDL/MinIO's static cache: fill until full, then never evict. Under
//! per-epoch random permutations no non-substituting policy beats it.

use super::uniform::{Replacement, UniformPolicy};
use crate::api::SampleId;

/// Static fill: no bookkeeping, no victims.
#[derive(Debug, Default)]
pub struct StaticFill;

impl Replacement for StaticFill {
    const NAME: &'static str = "static";

    fn on_hit(&mut self, _id: SampleId) {}

    fn on_insert(&mut self, _id: SampleId) {}

    fn pop_victim(&mut self) -> Option<SampleId> {
        None
    }
}

/// A uniformly-sampled cache that fills once and never evicts.
pub type StaticCache = UniformPolicy<StaticFill>;
