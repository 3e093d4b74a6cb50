//! A query photo's features: decoded and preprocessed as an upload is (`ndpipe-model`'s
//! [`Preprocessor`]), then run through the active backbone. Nothing is stored.

use ndpipe_model::Preprocessor;

use super::SimilarError;
use crate::inference::model::SharedModel;

/// Computes the features of query photos with the node's active backbone.
#[derive(Clone)]
pub(crate) struct Embedder {
    model: SharedModel,
    preprocessor: Preprocessor,
}

impl Embedder {
    /// Query photos go through `preprocessor` (the ingest settings) and `model`'s backbone.
    pub(crate) fn new(model: SharedModel, preprocessor: Preprocessor) -> Self {
        Embedder {
            model,
            preprocessor,
        }
    }

    /// The backbone version and the features of the photo `bytes`; a body that is not an
    /// acceptable image is [`SimilarError::Rejected`] as an upload would be.
    pub(crate) async fn embed(
        &self,
        bytes: bytes::Bytes,
    ) -> Result<(String, Vec<f32>), SimilarError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.embed_blocking(&bytes)).await?
    }

    fn embed_blocking(&self, bytes: &[u8]) -> Result<(String, Vec<f32>), SimilarError> {
        self.preprocessor.decode_cost(bytes)?;
        let tensor = self.preprocessor.run(bytes)?.tensor;
        let model = self.model.get();
        let outputs = model.backend.run(&[tensor]).map_err(SimilarError::Model)?;
        Ok((
            model.info().backbone_version.clone(),
            outputs.features(0).to_vec(),
        ))
    }
}
