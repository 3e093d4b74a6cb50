//! Stored tensors and the feature vectors of stored photos.
//!
//! Features are kept per backbone in the [`FeatureStore`]; a photo without features for the
//! running backbone gets them by running the backbone over its stored tensor (and they are then
//! stored). Extraction for the Tuner and head-only re-labelling both read features this way.

use ndpipe_model::{ImageTensor, InferenceBackend, TensorBlob, extract_features};

use super::InferenceError;
use crate::storage::{FeatureStore, PhotoStore};

/// A stored photo's compressed tensor.
pub(crate) fn stored_blob(store: &PhotoStore, id: u64) -> Result<Vec<u8>, InferenceError> {
    store
        .tensor(id)?
        .map(|(_, blob)| blob)
        .ok_or(InferenceError::NoTensor { id })
}

/// A compressed tensor of photo `id`, decoded.
pub(crate) fn decode_tensor(id: u64, blob: &[u8]) -> Result<ImageTensor, InferenceError> {
    TensorBlob::decode(blob).map_err(|source| InferenceError::CorruptTensor { id, source })
}

/// A stored photo's decoded tensor.
pub(crate) fn stored_tensor(store: &PhotoStore, id: u64) -> Result<ImageTensor, InferenceError> {
    decode_tensor(id, &stored_blob(store, id)?)
}

/// Where feature vectors of stored photos come from: the feature store, else the backbone over
/// the stored tensors.
pub(crate) struct FeatureSource<'a> {
    /// The stored tensors.
    pub(crate) store: &'a PhotoStore,
    /// The stored features.
    pub(crate) features: &'a FeatureStore,
    /// The backbone.
    pub(crate) backend: &'a dyn InferenceBackend,
}

impl FeatureSource<'_> {
    /// The features of photos `ids`, row-major (`ids.len() * feature_dim`): stored ones when
    /// `use_stored`, the rest computed by the backbone in batches and stored. Returns the values
    /// and how many rows the backbone computed.
    pub(crate) fn features(
        &self,
        ids: &[u64],
        use_stored: bool,
    ) -> Result<(Vec<f32>, usize), InferenceError> {
        let info = self.backend.info();
        let dim = info.feature_dim;
        let backbone = &info.backbone_version;
        let mut values = vec![0f32; ids.len() * dim];
        let mut missing = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let stored = if use_stored {
                self.features.get(backbone, *id)?
            } else {
                None
            };
            match stored {
                Some(f) if f.len() == dim => values[i * dim..(i + 1) * dim].copy_from_slice(&f),
                _ => missing.push(i),
            }
        }
        for batch in missing.chunks(self.backend.max_batch().max(1)) {
            let tensors = batch
                .iter()
                .map(|&i| stored_tensor(self.store, ids[i]))
                .collect::<Result<Vec<_>, _>>()?;
            let computed = extract_features(self.backend, &tensors)?;
            let rows: Vec<(u64, &[f32])> = batch
                .iter()
                .zip(computed.chunks_exact(dim))
                .map(|(&i, f)| (ids[i], f))
                .collect();
            for (&i, f) in batch.iter().zip(computed.chunks_exact(dim)) {
                values[i * dim..(i + 1) * dim].copy_from_slice(f);
            }
            self.features.put_many(backbone, &rows)?;
        }
        Ok((values, missing.len()))
    }
}
