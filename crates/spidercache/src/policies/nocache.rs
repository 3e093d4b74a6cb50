//! No cache: uniform random sampling, every request a miss. The baseline
//! whose accuracy the others must match.

use super::uniform::{Replacement, UniformPolicy};
use crate::api::SampleId;

/// Holds nothing.
#[derive(Debug, Default)]
pub struct Nothing;

impl Replacement for Nothing {
    const NAME: &'static str = "nocache";
    const ADMITS: bool = false;

    fn on_hit(&mut self, _id: SampleId) {}

    fn on_insert(&mut self, _id: SampleId) {}

    fn pop_victim(&mut self) -> Option<SampleId> {
        None
    }
}

/// Uniform sampling with no cache.
pub type NoCache = UniformPolicy<Nothing>;
