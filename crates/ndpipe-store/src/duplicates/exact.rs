//! Exact duplicates at upload: the same bytes as a photo the catalog already has (same
//! SHA-256), looked up before anything is decoded or stored.
//!
//! One indexed query (`photos_sha256`, every node's photos on a shared catalog) per upload.
//! The lookup is not a lock: two uploads of the same new bytes at the same moment may both be
//! stored; they are then found later as an exact-duplicate group (`GET /v1/duplicates`).

use std::sync::Arc;

use bytes::Bytes;
use ndpipe_catalog::{Catalog, CatalogError, GroundTruth, PhotoId, PhotoRecord};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::task::JoinError;

use crate::ingest::{IngestError, validate_label};

/// What an upload of bytes the catalog already has does (`exact_duplicates`).
///
/// The default is [`ExactDuplicates::Existing`]: a photo operator expects a photo store to keep
/// one copy of one photo. The same bytes come back from client retries after a timeout, from a
/// sync folder uploaded again, from a data set imported twice; storing each would take the disk
/// twice, label it twice, show it twice in every search, and, worst for training, let the same
/// image sit in both the training and the validation split, which inflates the accuracy the
/// Tuner reports. The client still gets the id it needs (the existing photo's), and 200 instead
/// of 201 with `duplicate_of` tells it nothing new was stored. `store` is for a store that must
/// keep every upload as its own photo (e.g. each with its own ground truth), still told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExactDuplicates {
    /// Answer with the existing photo (HTTP 200, `duplicate_of`); nothing new is stored, and
    /// the ground truth sent with the upload is set on the existing photo.
    #[default]
    Existing,
    /// Store the upload as a new photo (HTTP 201) and say `duplicate_of` the oldest one.
    Store,
}

impl std::str::FromStr for ExactDuplicates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "existing" => Ok(ExactDuplicates::Existing),
            "store" => Ok(ExactDuplicates::Store),
            other => Err(format!("expected existing or store, not {other:?}")),
        }
    }
}

/// What an upload came to.
#[derive(Debug, Clone)]
pub(crate) struct Uploaded {
    /// The photo the upload is now: the new one, or the existing one when nothing was stored.
    pub(crate) record: PhotoRecord,
    /// The oldest photo that already had these bytes, when one did.
    pub(crate) duplicate_of: Option<PhotoId>,
    /// Whether a new photo was stored.
    pub(crate) stored: bool,
}

/// The exact-duplicate check of the uploads of one front door (a node, or a gateway).
#[derive(Clone)]
pub(crate) struct ExactCheck {
    mode: ExactDuplicates,
    catalog: Arc<dyn Catalog>,
}

impl ExactCheck {
    /// Checks uploads against `catalog` and answers them as `mode` says.
    pub(crate) fn new(mode: ExactDuplicates, catalog: Arc<dyn Catalog>) -> Self {
        ExactCheck { mode, catalog }
    }

    /// The configured mode.
    pub(crate) fn mode(&self) -> ExactDuplicates {
        self.mode
    }

    /// Uploads `bytes` (with ground truth `truth`) with `store` unless they are a photo's
    /// already and `mode` is [`ExactDuplicates::Existing`]; then `truth` is set on that photo.
    pub(crate) async fn upload<F, Fut, E>(
        &self,
        mode: ExactDuplicates,
        bytes: Bytes,
        truth: Option<GroundTruth>,
        store: F,
    ) -> Result<Uploaded, E>
    where
        F: FnOnce(Bytes, Option<GroundTruth>) -> Fut,
        Fut: Future<Output = Result<PhotoRecord, E>>,
        E: From<CatalogError> + From<JoinError> + From<IngestError>,
    {
        if let Some(t) = &truth {
            validate_label(&t.label)?;
        }
        let existing = self.existing::<E>(bytes.clone()).await?;
        let duplicate_of = existing.as_ref().map(|p| p.id);
        match (existing, mode) {
            (Some(record), ExactDuplicates::Existing) => Ok(Uploaded {
                record: self.label_existing::<E>(record, truth).await?,
                duplicate_of,
                stored: false,
            }),
            _ => Ok(Uploaded {
                record: store(bytes, truth).await?,
                duplicate_of,
                stored: true,
            }),
        }
    }

    /// Sets `truth` (if any) on the existing photo an upload was answered with, so that a
    /// labelled upload of bytes already stored still labels them.
    async fn label_existing<E>(
        &self,
        mut record: PhotoRecord,
        truth: Option<GroundTruth>,
    ) -> Result<PhotoRecord, E>
    where
        E: From<CatalogError> + From<JoinError>,
    {
        let Some(truth) = truth else {
            return Ok(record);
        };
        let catalog = self.catalog.clone();
        let (id, written) = (record.id, truth.clone());
        crate::catalog_deadline::catalog::<_, E>(move || catalog.set_ground_truth(id, &written))
            .await?;
        record.ground_truths.retain(|t| t.task != truth.task);
        record.ground_truths.push(truth);
        Ok(record)
    }

    /// The oldest photo whose original is `bytes`.
    async fn existing<E>(&self, bytes: Bytes) -> Result<Option<PhotoRecord>, E>
    where
        E: From<CatalogError> + From<JoinError>,
    {
        let catalog = self.catalog.clone();
        let found = crate::catalog_deadline::catalog::<_, E>(move || {
            catalog.photos_with_sha256(&hex::encode(Sha256::digest(&bytes)))
        })
        .await?;
        Ok(found.into_iter().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndpipe_catalog::test_suite::photo;
    use ndpipe_catalog::{PhotoCatalog, Split, SqliteCatalog, TaskName, TruthCatalog};

    async fn upload(check: &ExactCheck, bytes: &'static [u8]) -> Uploaded {
        check
            .upload(
                check.mode(),
                Bytes::from_static(bytes),
                None,
                |b, _| async move {
                    let mut p = photo(77, None);
                    p.meta.sha256 = hex::encode(Sha256::digest(&b));
                    Ok::<_, crate::ingest::IngestError>(p)
                },
            )
            .await
            .unwrap()
    }

    fn catalog_with(bytes: &[u8]) -> Arc<SqliteCatalog> {
        let catalog = Arc::new(SqliteCatalog::in_memory().unwrap());
        let mut p = photo(5, None);
        p.meta.sha256 = hex::encode(Sha256::digest(bytes));
        catalog.upsert_photo(&p).unwrap();
        catalog
    }

    #[tokio::test]
    async fn existing_answers_the_stored_photo_and_stores_nothing() {
        let check = ExactCheck::new(ExactDuplicates::Existing, catalog_with(b"same"));
        let same = upload(&check, b"same").await;
        assert_eq!(
            (same.record.id, same.duplicate_of, same.stored),
            (5, Some(5), false)
        );
        let other = upload(&check, b"other").await;
        assert_eq!(
            (other.record.id, other.duplicate_of, other.stored),
            (77, None, true)
        );
    }

    #[tokio::test]
    async fn a_labelled_upload_of_stored_bytes_labels_the_stored_photo() {
        let catalog = catalog_with(b"same");
        let check = ExactCheck::new(ExactDuplicates::Existing, catalog.clone());
        let truth = GroundTruth::new("Trouser", Split::Val);
        let same = check
            .upload(
                check.mode(),
                Bytes::from_static(b"same"),
                Some(truth.clone()),
                |_, _| async {
                    Err::<PhotoRecord, _>(IngestError::InvalidLabel("never stored".into()))
                },
            )
            .await
            .unwrap();
        assert_eq!((same.record.id, same.stored), (5, false));
        assert_eq!(same.record.ground_truths, vec![truth.clone()]);
        let task = TaskName::default_task();
        let stored = catalog.ground_truths(&task).unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!((stored[0].id, stored[0].label.as_str()), (5, "Trouser"));
        let bad = GroundTruth::new("\u{7}", Split::Val);
        let refused = check
            .upload(
                check.mode(),
                Bytes::from_static(b"same"),
                Some(bad),
                |_, _| async {
                    Err::<PhotoRecord, _>(IngestError::InvalidLabel("never stored".into()))
                },
            )
            .await;
        assert!(matches!(refused, Err(IngestError::InvalidLabel(_))));
    }

    #[tokio::test]
    async fn store_stores_and_says_which_photo_it_duplicates() {
        let check = ExactCheck::new(ExactDuplicates::Store, catalog_with(b"same"));
        let same = upload(&check, b"same").await;
        assert_eq!(
            (same.record.id, same.duplicate_of, same.stored),
            (77, Some(5), true)
        );
    }

    #[test]
    fn the_mode_parses_from_its_config_names() {
        assert_eq!("existing".parse(), Ok(ExactDuplicates::Existing));
        assert_eq!("store".parse(), Ok(ExactDuplicates::Store));
        assert!("keep".parse::<ExactDuplicates>().is_err());
    }
}
