//! The seam of the semantic level: pairs of photos whose features are close come from outside
//! duplicate finding, from a [`SemanticPairs`] source (the cluster's feature index).
//!
//! A PipeStore's and a gateway's `GET /v1/duplicates` take the source given at start
//! (`AppState::with_semantic_pairs`, `GatewayState::with_semantic_pairs`); without one,
//! `level=semantic` is refused with 400 `level_unavailable`, never answered without its pairs.
//! The source is asked for the pairs at the configured `semantic_min_cosine`; duplicate finding
//! groups them with the exact and near pairs ([`super::find::find`]), leaving out any under the
//! threshold.

use ndpipe_catalog::PhotoId;

/// Two photos whose features' cosine similarity is `cosine`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SemanticPair {
    /// One photo.
    pub(crate) a: PhotoId,
    /// The other.
    pub(crate) b: PhotoId,
    /// The cosine similarity of their features (under the serving backbone).
    pub(crate) cosine: f64,
}

/// Why a source could not give its pairs.
#[derive(Debug, thiserror::Error)]
#[error("the semantic pairs are unavailable: {reason}")]
pub(crate) struct SemanticUnavailable {
    /// What went wrong, for the client (answered as 503 `semantic_unavailable`).
    pub(crate) reason: String,
}

/// Where the semantic level's pairs come from: every pair of photos (every node's in a
/// cluster) whose features' cosine similarity reaches a threshold.
///
/// The feature index (nearest neighbours of each photo's features under the active backbone)
/// implements it; each pair once, in either order.
#[async_trait::async_trait]
pub(crate) trait SemanticPairs: Send + Sync {
    /// Every pair of photos whose features' cosine similarity is at least `min_cosine`.
    async fn pairs(&self, min_cosine: f64) -> Result<Vec<SemanticPair>, SemanticUnavailable>;
}
