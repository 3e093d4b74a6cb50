//! A map of cached samples that accounts for items and bytes against a budget.

use std::collections::HashMap;

use crate::api::{Capacity, Sample, SampleId};

/// Cached samples plus their running item/byte totals. Callers must check
/// [`fits`](Store::fits) before [`insert`](Store::insert); the store refuses
/// (returns `false`) rather than exceed its budget.
#[derive(Debug, Default)]
pub(crate) struct Store {
    limit: Capacity,
    bytes: u64,
    samples: HashMap<SampleId, Sample>,
}

impl Store {
    pub(crate) fn new(limit: Capacity) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Changes the budget; the caller evicts until [`over_limit`](Self::over_limit) is false.
    pub(crate) fn set_limit(&mut self, limit: Capacity) {
        self.limit = limit;
    }

    pub(crate) fn limit(&self) -> Capacity {
        self.limit
    }

    pub(crate) fn usage(&self) -> Capacity {
        Capacity::new(self.samples.len(), self.bytes)
    }

    pub(crate) fn over_limit(&self) -> bool {
        !self.usage().within(self.limit)
    }

    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    pub(crate) fn contains(&self, id: SampleId) -> bool {
        self.samples.contains_key(&id)
    }

    pub(crate) fn get(&self, id: SampleId) -> Option<&Sample> {
        self.samples.get(&id)
    }

    /// Whether a sample of `len` bytes could ever be held (with the store empty).
    pub(crate) fn could_hold(&self, len: usize) -> bool {
        self.limit.items > 0 && len as u64 <= self.limit.bytes
    }

    /// Whether a new sample of `len` bytes fits now.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.samples.len() < self.limit.items && self.bytes + len as u64 <= self.limit.bytes
    }

    /// Whether a new sample of `len` bytes would fit once `freed` is removed.
    pub(crate) fn fits_after_freeing(&self, len: usize, freed: Capacity) -> bool {
        self.samples.len() - freed.items < self.limit.items
            && self.bytes - freed.bytes + len as u64 <= self.limit.bytes
    }

    /// Inserts if it fits (replacing an entry under the same id first).
    pub(crate) fn insert(&mut self, id: SampleId, sample: Sample) -> bool {
        self.remove(id);
        if !self.fits(sample.data.len()) {
            return false;
        }
        self.bytes += sample.data.len() as u64;
        self.samples.insert(id, sample);
        true
    }

    pub(crate) fn remove(&mut self, id: SampleId) -> Option<Sample> {
        let sample = self.samples.remove(&id)?;
        self.bytes -= sample.data.len() as u64;
        Some(sample)
    }

    /// The size of the entry under `id`, as a one-item budget.
    pub(crate) fn footprint(&self, id: SampleId) -> Capacity {
        self.samples.get(&id).map_or(Capacity::default(), |s| {
            Capacity::new(1, s.data.len() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn sample(len: usize) -> Sample {
        Sample {
            label: 0,
            data: Bytes::from(vec![0u8; len]),
        }
    }

    #[test]
    fn refuses_past_items_and_bytes() {
        let mut s = Store::new(Capacity::new(2, 10));
        assert!(s.insert(1, sample(4)));
        assert!(!s.insert(2, sample(7)), "bytes would exceed 10");
        assert!(s.insert(2, sample(6)));
        assert!(!s.insert(3, sample(0)), "items would exceed 2");
        assert_eq!(s.usage(), Capacity::new(2, 10));
        s.remove(1);
        assert_eq!(s.usage(), Capacity::new(1, 6));
        assert!(s.fits_after_freeing(10, Capacity::new(1, 6)));
    }
}
