//! Running the backbone over stored tensors to get their feature vectors.

use crate::backend::{InferenceBackend, ModelError};
use crate::tensor::ImageTensor;

/// The backbone's feature vectors of `tensors`, row-major (`tensors.len() * feature_dim`), run in
/// batches of at most the backend's `max_batch`.
pub fn extract_features(
    backend: &dyn InferenceBackend,
    tensors: &[ImageTensor],
) -> Result<Vec<f32>, ModelError> {
    let dim = backend.info().feature_dim;
    let mut values = Vec::with_capacity(tensors.len() * dim);
    for batch in tensors.chunks(backend.max_batch().max(1)) {
        values.extend_from_slice(backend.run(batch)?.all_features());
    }
    Ok(values)
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::FakeBackend;

    #[test]
    fn features_come_in_input_order_across_batches() {
        let backend = FakeBackend::new(8, 3).with_max_batch(2);
        let [h, w] = backend.info().input_size;
        let tensors: Vec<ImageTensor> = (0..5u8)
            .map(|i| ImageTensor::new(h, w, 3, vec![i * 40; (h * w * 3) as usize]).unwrap())
            .collect();
        let all = extract_features(&backend, &tensors).unwrap();
        assert_eq!(all.len(), 5 * 8);
        let one = backend.run(&tensors[3..4]).unwrap();
        assert_eq!(&all[3 * 8..4 * 8], one.features(0));
    }
}
