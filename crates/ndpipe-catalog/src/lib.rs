//! The catalog: what the system knows *about* photos, as opposed to their bytes.
//!
//! It records each stored photo (size, dimensions, checksum), its ground-truth label and split
//! when the uploader supplied one, the labels predicted by each model version, and the model
//! versions themselves. The photo bytes and tensors live in `ndpipe-store`; the store is the
//! source of truth for which photos exist, and the catalog can be rebuilt from it.
//!
//! [`Catalog`] is the one interface; [`SqliteCatalog`] is the embedded implementation used by
//! `ndpipe serve`. A PostgreSQL implementation for multi-host deployments satisfies the same
//! trait and must pass the same [`test_suite`].
#![deny(missing_docs)]

mod error;
mod sqlite;
pub mod test_suite;
mod types;

pub use error::CatalogError;
pub use sqlite::SqliteCatalog;
pub use types::{
    GroundTruth, JobRecord, ModelVersion, PhotoId, PhotoRecord, Prediction, SearchHit, Split,
};

/// Storage of photo metadata, labels and model versions. Implementations are thread-safe and
/// every method is one transaction.
pub trait Catalog: Send + Sync {
    /// Inserts a photo, or replaces the row of the same id (ground truth included).
    fn upsert_photo(&self, photo: &PhotoRecord) -> Result<(), CatalogError>;

    /// Removes a photo with its ground truth and predictions. Returns whether it existed.
    fn delete_photo(&self, id: PhotoId) -> Result<bool, CatalogError>;

    /// One photo.
    fn photo(&self, id: PhotoId) -> Result<Option<PhotoRecord>, CatalogError>;

    /// Photos in id order, starting after `after`, at most `limit`.
    fn list_photos(
        &self,
        after: Option<PhotoId>,
        limit: usize,
    ) -> Result<Vec<PhotoRecord>, CatalogError>;

    /// Photos with ground truth in `split`, as (id, label), in id order.
    fn labelled(&self, split: Split) -> Result<Vec<(PhotoId, String)>, CatalogError>;

    /// Number of photos.
    fn count_photos(&self) -> Result<u64, CatalogError>;

    /// Sets or clears a photo's ground truth. Fails with [`CatalogError::NotFound`] for an
    /// unknown photo.
    fn set_ground_truth(
        &self,
        id: PhotoId,
        truth: Option<&GroundTruth>,
    ) -> Result<(), CatalogError>;

    /// Replaces the predictions of `model_version` for one photo (ranked, best first).
    fn put_predictions(
        &self,
        id: PhotoId,
        model_version: &str,
        labels: &[Prediction],
    ) -> Result<(), CatalogError>;

    /// Replaces the predictions of `model_version` for many photos in one transaction. Photos
    /// that no longer exist are skipped; returns how many were written.
    fn put_predictions_many(
        &self,
        model_version: &str,
        rows: &[(PhotoId, Vec<Prediction>)],
    ) -> Result<usize, CatalogError>;

    /// Photos that have no predictions under `model_version`, in id order.
    fn unlabelled(&self, model_version: &str) -> Result<Vec<PhotoId>, CatalogError>;

    /// The predictions of every model version for one photo, grouped by version, best first.
    fn predictions(&self, id: PhotoId) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError>;

    /// Records a model version. Fails with [`CatalogError::Conflict`] if the id exists.
    fn register_model(&self, model: &ModelVersion) -> Result<(), CatalogError>;

    /// All model versions, oldest first.
    fn models(&self) -> Result<Vec<ModelVersion>, CatalogError>;

    /// Photos whose predictions under `model_version` include `label` (exactly, or as one of the
    /// comma-separated names of a class such as "tabby, tabby cat"), best score first.
    fn search(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<SearchHit>, CatalogError>;

    /// Inserts or updates a job (status and state).
    fn put_job(&self, job: &JobRecord) -> Result<(), CatalogError>;

    /// All jobs, oldest first.
    fn jobs(&self) -> Result<Vec<JobRecord>, CatalogError>;

    /// Makes `id` the one active version. Fails with [`CatalogError::NotFound`] if unknown.
    fn set_active_model(&self, id: &str) -> Result<(), CatalogError>;
}
