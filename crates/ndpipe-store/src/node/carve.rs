//! Keeping duplicates on one side of the validation line: copies of one photo (the same bytes,
//! or a near copy by perceptual hash) must not train a head that is then validated on another
//! of them, or the accuracy a fine-tune reports (and its deploy gate) is inflated.
//!
//! A plan reads the duplicate groups of the exact and near levels (the settings of
//! `GET /v1/duplicates`) and gives every labelled photo of a group one carve key: the least
//! SHA-256 of the group's labelled photos, so that the whole group is carved or not together.
//! A training photo whose group holds a photo with the `val` or `test` split is left out of
//! training. The semantic level is not used: alike features are often different photos of one
//! kind (`docs/benchmarks.md`).

use std::collections::{BTreeSet, HashMap};

use ndpipe_catalog::{Catalog, CatalogError, PhotoId, Split, TaskTruth};

use crate::duplicates::DuplicateSettings;
use crate::duplicates::find::find;
use crate::duplicates::groups::Level;

/// Each labelled photo's place among its duplicates.
#[derive(Debug, Default)]
pub(super) struct CarveGroups {
    /// A grouped photo's carve key: the least SHA-256 of its group's labelled photos.
    key: HashMap<PhotoId, String>,
    /// Grouped photos whose group holds a labelled photo that is not for training.
    held_out: BTreeSet<PhotoId>,
}

impl CarveGroups {
    /// The groups of `truths` (one task's ground truth) among the exact and near duplicates
    /// of `catalog`.
    pub(super) fn of(
        catalog: &dyn Catalog,
        settings: &DuplicateSettings,
        truths: &[TaskTruth],
    ) -> Result<Self, CatalogError> {
        let levels = BTreeSet::from([Level::Exact, Level::Near]);
        let found = find(catalog, settings, &levels, &[], None)?;
        let by_id: HashMap<PhotoId, &TaskTruth> = truths.iter().map(|t| (t.id, t)).collect();
        let mut out = CarveGroups::default();
        for group in &found.groups {
            let labelled: Vec<&TaskTruth> = group
                .members
                .iter()
                .filter_map(|m| by_id.get(&m.id).copied())
                .collect();
            let Some(key) = labelled.iter().map(|t| t.sha256.as_str()).min() else {
                continue;
            };
            let holds_out = labelled.iter().any(|t| t.split != Split::Train);
            for t in &labelled {
                out.key.insert(t.id, key.to_string());
                if holds_out {
                    out.held_out.insert(t.id);
                }
            }
        }
        Ok(out)
    }

    /// The key `truth` is carved by: its group's, or its own SHA-256.
    pub(super) fn key<'a>(&'a self, truth: &'a TaskTruth) -> &'a str {
        self.key
            .get(&truth.id)
            .map_or(truth.sha256.as_str(), String::as_str)
    }

    /// Whether training photo `id` has a duplicate that validates or tests.
    pub(super) fn held_out(&self, id: PhotoId) -> bool {
        self.held_out.contains(&id)
    }
}
