//! Conventional mode, for comparison with NDPipe: the PipeStores ship preprocessed tensors and the
//! Tuner runs the backbone itself.

use std::sync::Arc;

use ndpipe_model::{ImageTensor, InferenceBackend, extract_features};
use ndpipe_proto::{Features, Tensors};

use crate::TunerError;
use crate::nodes::{Node, node_error};

/// The features of tensors `node` shipped, computed by the Tuner's backbone off the runtime.
pub(crate) async fn extract_on_tuner(
    backbone: Arc<dyn InferenceBackend>,
    node: &Node,
    t: Tensors,
) -> Result<Features, TunerError> {
    let per = (t.height * t.width * 3) as usize;
    let images: Vec<ImageTensor> = t
        .data
        .chunks_exact(per)
        .map(|d| ImageTensor::new(t.height, t.width, 3, d.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| node_error(node, format!("sent unusable tensors: {e}")))?;
    let dim = backbone.info().feature_dim;
    let values = tokio::task::spawn_blocking(move || extract_features(&*backbone, &images))
        .await
        .map_err(|e| TunerError::Internal(format!("the backbone task on the Tuner: {e}")))?
        .map_err(|e| TunerError::Internal(format!("backbone on the Tuner: {e}")))?;
    Ok(Features {
        values,
        dim,
        labels: t.labels,
        photo_ids: t.photo_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tensors_become_the_backbones_features_in_order() {
        let backbone = Arc::new(ndpipe_model::FakeBackend::new(8, 3).with_max_batch(2));
        let [h, w] = backbone.info().input_size;
        let node = Node::for_test("ps-a", "http://127.0.0.1:1");
        let data: Vec<u8> = (0..3u8)
            .flat_map(|i| vec![i * 50; (h * w * 3) as usize])
            .collect();
        let t = Tensors {
            data,
            height: h,
            width: w,
            labels: vec![0, 1, 2],
            photo_ids: vec![7, 8, 9],
        };
        let f = extract_on_tuner(backbone.clone(), &node, t).await.unwrap();
        assert_eq!((f.len(), f.dim), (3, 8));
        assert_eq!(f.photo_ids, [7, 8, 9]);
        let one = ImageTensor::new(h, w, 3, vec![50; (h * w * 3) as usize]).unwrap();
        assert_eq!(&f.values[8..16], backbone.run(&[one]).unwrap().features(0));
    }
}
