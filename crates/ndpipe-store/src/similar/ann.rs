//! The approximate-nearest-neighbour index over feature vectors: usearch's HNSW graph with the
//! cosine metric, keyed by photo id. usearch cannot list its keys, so the set of keys is kept
//! beside the graph (a reopened index is reconciled against the feature store by it).

use std::collections::HashSet;
use std::path::Path;

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

/// How the vectors are kept in the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// Half precision: half the memory of f32.
    F16,
    /// Single precision.
    F32,
}

impl Scalar {
    fn kind(self) -> ScalarKind {
        match self {
            Scalar::F16 => ScalarKind::F16,
            Scalar::F32 => ScalarKind::F32,
        }
    }

    /// The name a manifest records.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scalar::F16 => "f16",
            Scalar::F32 => "f32",
        }
    }
}

/// HNSW parameters of an [`AnnIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnOptions {
    /// Graph degree (M): more finds more of the true neighbours, at more memory and build time.
    pub connectivity: usize,
    /// Beam width while inserting (ef_construction).
    pub expansion_add: usize,
    /// Beam width while searching (ef); usearch searches with at least k.
    pub expansion_search: usize,
    /// How vectors are kept.
    pub scalar: Scalar,
}

impl Default for AnnOptions {
    fn default() -> Self {
        AnnOptions {
            connectivity: 16,
            expansion_add: 128,
            expansion_search: 64,
            scalar: Scalar::F32,
        }
    }
}

/// Why the index refused an operation.
#[derive(Debug, thiserror::Error)]
pub enum AnnError {
    /// A vector of another dimension than the index's.
    #[error("a {got}-d vector for a {dim}-d index")]
    Dimension {
        /// The index's dimension.
        dim: usize,
        /// The vector's.
        got: usize,
    },
    /// usearch failed (memory, a file it cannot read or write).
    #[error("usearch: {0}")]
    Usearch(String),
}

fn usearch(e: impl std::fmt::Display) -> AnnError {
    AnnError::Usearch(e.to_string())
}

/// A cosine HNSW index of photo ids, one vector each. Not synchronised: callers serialise
/// mutations (the node holds it under a lock).
pub struct AnnIndex {
    index: Index,
    dim: usize,
    keys: HashSet<u64>,
}

impl AnnIndex {
    /// An empty index of `dim`-d vectors.
    pub fn new(dim: usize, options: AnnOptions) -> Result<Self, AnnError> {
        let index = Index::new(&IndexOptions {
            dimensions: dim,
            metric: MetricKind::Cos,
            quantization: options.scalar.kind(),
            connectivity: options.connectivity,
            expansion_add: options.expansion_add,
            expansion_search: options.expansion_search,
            multi: false,
        })
        .map_err(usearch)?;
        index.reserve_capacity_and_threads(64, 1).map_err(usearch)?;
        Ok(AnnIndex {
            index,
            dim,
            keys: HashSet::new(),
        })
    }

    /// The vectors' dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Photos in the index.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the index holds no photo.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether photo `id` is in the index.
    pub fn contains(&self, id: u64) -> bool {
        self.keys.contains(&id)
    }

    /// The photo ids in the index, in no order.
    pub(crate) fn keys(&self) -> &HashSet<u64> {
        &self.keys
    }

    /// Memory the graph and vectors take, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.index.memory_usage()
    }

    /// Bytes the index takes as a file.
    pub fn serialized_bytes(&self) -> usize {
        self.index.serialized_length()
    }

    /// Stores `vector` as photo `id`'s, replacing an older one.
    pub fn upsert(&mut self, id: u64, vector: &[f32]) -> Result<(), AnnError> {
        if vector.len() != self.dim {
            return Err(AnnError::Dimension {
                dim: self.dim,
                got: vector.len(),
            });
        }
        if self.keys.contains(&id) {
            self.index.remove(id).map_err(usearch)?;
            self.keys.remove(&id);
        }
        if self.index.size() >= self.index.capacity() {
            let grown = (self.index.capacity() * 2).max(64);
            self.index
                .reserve_capacity_and_threads(grown, 1)
                .map_err(usearch)?;
        }
        self.index.add(id, vector).map_err(usearch)?;
        self.keys.insert(id);
        Ok(())
    }

    /// Removes photo `id`; whether it was there.
    pub fn remove(&mut self, id: u64) -> Result<bool, AnnError> {
        if !self.keys.remove(&id) {
            return Ok(false);
        }
        self.index.remove(id).map_err(usearch)?;
        Ok(true)
    }

    /// Up to `k` photos nearest to `query`, with their cosine similarity, most similar first.
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<(u64, f32)>, AnnError> {
        if query.len() != self.dim {
            return Err(AnnError::Dimension {
                dim: self.dim,
                got: query.len(),
            });
        }
        if k == 0 || self.keys.is_empty() {
            return Ok(Vec::new());
        }
        let found = self.index.search(query, k).map_err(usearch)?;
        Ok(found
            .keys
            .into_iter()
            .zip(found.distances)
            .map(|(id, distance)| (id, 1.0 - distance))
            .filter(|(_, score)| score.is_finite())
            .collect())
    }

    /// Writes the graph to `path` (usearch's own format).
    pub(crate) fn save(&self, path: &Path) -> Result<(), AnnError> {
        self.index.save(utf8(path)?).map_err(usearch)
    }

    /// Reads a graph that [`AnnIndex::save`] wrote, whose keys are `keys`; fails unless it is
    /// of `dim`-d vectors and holds exactly those keys.
    pub(crate) fn load(
        path: &Path,
        dim: usize,
        options: AnnOptions,
        keys: HashSet<u64>,
    ) -> Result<Self, AnnError> {
        let mut ann = AnnIndex::new(dim, options)?;
        ann.index.load(utf8(path)?).map_err(usearch)?;
        ann.index.change_expansion_add(options.expansion_add);
        ann.index.change_expansion_search(options.expansion_search);
        if ann.index.dimensions() != dim {
            return Err(AnnError::Dimension {
                dim,
                got: ann.index.dimensions(),
            });
        }
        if ann.index.size() != keys.len() || keys.iter().any(|k| !ann.index.contains(*k)) {
            return Err(AnnError::Usearch(format!(
                "the graph holds {} vectors, not the {} keys kept beside it",
                ann.index.size(),
                keys.len()
            )));
        }
        ann.keys = keys;
        Ok(ann)
    }
}

impl std::fmt::Debug for AnnIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnnIndex")
            .field("dim", &self.dim)
            .field("len", &self.keys.len())
            .finish()
    }
}

fn utf8(path: &Path) -> Result<&str, AnnError> {
    path.to_str()
        .ok_or_else(|| AnnError::Usearch(format!("{} is not a UTF-8 path", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_nearest_by_cosine_and_forgets_removed_photos() {
        let mut ann = AnnIndex::new(3, AnnOptions::default()).unwrap();
        ann.upsert(1, &[1.0, 0.0, 0.0]).unwrap();
        ann.upsert(2, &[0.0, 1.0, 0.0]).unwrap();
        ann.upsert(3, &[10.0, 1.0, 0.0]).unwrap();
        let found = ann.search(&[2.0, 0.0, 0.0], 3).unwrap();
        assert_eq!(found[0].0, 1);
        assert!((found[0].1 - 1.0).abs() < 1e-3, "{found:?}");
        assert_eq!(found[1].0, 3);
        assert!(ann.remove(1).unwrap());
        assert!(!ann.remove(1).unwrap());
        assert_eq!(ann.search(&[2.0, 0.0, 0.0], 1).unwrap()[0].0, 3);
        assert_eq!(ann.len(), 2);
        assert!(matches!(
            ann.upsert(4, &[1.0]),
            Err(AnnError::Dimension { dim: 3, got: 1 })
        ));
    }

    #[test]
    fn upsert_replaces_and_the_index_grows() {
        let mut ann = AnnIndex::new(2, AnnOptions::default()).unwrap();
        for id in 0..200u64 {
            ann.upsert(id, &[1.0, id as f32]).unwrap();
        }
        ann.upsert(7, &[-1.0, 0.0]).unwrap();
        assert_eq!(ann.len(), 200);
        assert_eq!(ann.search(&[-1.0, 0.0], 1).unwrap()[0].0, 7);
    }
}
