//! The approximate-nearest-neighbour index over sample embeddings: usearch's
//! HNSW with squared-L2 distance, updated in place (remove, then re-add under
//! the same id) as the model's embeddings drift.

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use crate::api::SampleId;
use crate::error::CacheError;

/// HNSW parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnConfig {
    /// Graph degree M.
    pub connectivity: usize,
    /// Beam width while inserting (ef_construction).
    pub expansion_add: usize,
    /// Beam width while searching; usearch searches with max(this, k).
    pub expansion_search: usize,
    /// Vectors to reserve room for up front (grown on demand).
    pub initial_capacity: usize,
}

impl Default for AnnConfig {
    fn default() -> Self {
        Self {
            connectivity: 8,
            expansion_add: 100,
            expansion_search: 10,
            initial_capacity: 1024,
        }
    }
}

/// An HNSW index keyed by sample id.
pub(crate) struct AnnIndex {
    index: Index,
    dim: usize,
}

fn index_err(e: impl std::fmt::Display) -> CacheError {
    CacheError::Index(e.to_string())
}

impl AnnIndex {
    pub(crate) fn new(dim: usize, config: AnnConfig) -> Result<Self, CacheError> {
        if dim == 0 {
            return Err(CacheError::InvalidConfig(
                "SpiderCache needs embeddings (dim > 0)".into(),
            ));
        }
        let options = IndexOptions {
            dimensions: dim,
            metric: MetricKind::L2sq,
            quantization: ScalarKind::F32,
            connectivity: config.connectivity,
            expansion_add: config.expansion_add,
            expansion_search: config.expansion_search,
            multi: false,
        };
        let index = Index::new(&options).map_err(index_err)?;
        index
            .reserve_capacity_and_threads(config.initial_capacity.max(1), 1)
            .map_err(index_err)?;
        Ok(Self { index, dim })
    }

    pub(crate) fn len(&self) -> usize {
        self.index.size()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.index.memory_usage()
    }

    /// Stores `vector` as the embedding of `id`, replacing any older one.
    pub(crate) fn upsert(&self, id: SampleId, vector: &[f32]) -> Result<(), CacheError> {
        if vector.len() != self.dim {
            return Err(CacheError::MalformedBatch(format!(
                "embedding of dim {} for an index of dim {}",
                vector.len(),
                self.dim
            )));
        }
        if self.index.contains(id) {
            self.index.remove(id).map_err(index_err)?;
        }
        if self.index.size() >= self.index.capacity() {
            let grown = (self.index.capacity() * 2).max(16);
            self.index
                .reserve_capacity_and_threads(grown, 1)
                .map_err(index_err)?;
        }
        self.index.add(id, vector).map_err(index_err)
    }

    /// Up to `k` nearest ids with their squared L2 distances, nearest first.
    pub(crate) fn search(
        &self,
        query: &[f32],
        k: usize,
    ) -> Result<Vec<(SampleId, f32)>, CacheError> {
        let found = self.index.search(query, k).map_err(index_err)?;
        Ok(found.keys.into_iter().zip(found.distances).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_replaces_the_vector_and_distances_are_squared() {
        let idx = AnnIndex::new(2, AnnConfig::default()).unwrap();
        idx.upsert(1, &[0.0, 0.0]).unwrap();
        idx.upsert(2, &[3.0, 4.0]).unwrap();
        let found = idx.search(&[0.0, 0.0], 2).unwrap();
        assert_eq!(found[0], (1, 0.0));
        assert_eq!(found[1].0, 2);
        assert!((found[1].1 - 25.0).abs() < 1e-4, "squared L2: {:?}", found);
        idx.upsert(2, &[1.0, 0.0]).unwrap();
        assert_eq!(idx.len(), 2);
        let found = idx.search(&[1.0, 0.0], 1).unwrap();
        assert_eq!(found, vec![(2, 0.0)]);
    }

    #[test]
    fn grows_past_its_initial_capacity() {
        let cfg = AnnConfig {
            initial_capacity: 2,
            ..AnnConfig::default()
        };
        let idx = AnnIndex::new(3, cfg).unwrap();
        for id in 0..50u64 {
            idx.upsert(id, &[id as f32, 0.0, 1.0]).unwrap();
        }
        for id in 0..50u64 {
            idx.upsert(id, &[id as f32, 1.0, 1.0]).unwrap();
        }
        assert_eq!(idx.len(), 50);
        assert_eq!(idx.search(&[7.0, 1.0, 1.0], 1).unwrap()[0].0, 7);
    }
}
