//! The catalog: what the system knows *about* photos, as opposed to their bytes.
//!
//! It records each stored photo (size, dimensions, checksum), its ground-truth label and split
//! when the uploader supplied one, the labels predicted by each model version, the model versions
//! themselves and the log of long-running jobs. The photo bytes and tensors live in
//! `ndpipe-store`; the store is the source of truth for which photos exist, and the photo part of
//! the catalog can be rebuilt from it.
//!
//! The interface is split by the role each part serves, so that a component depends only on what
//! it uses:
//! - [`PhotoCatalog`]: photos, predictions and search (a PipeStore's ingest, labelling and HTTP
//!   API);
//! - [`TruthCatalog`]: ground truth, per task;
//! - [`TaskCatalog`]: tasks, the named classifiers over one backbone (`general`, the backbone's
//!   own, and any number of custom ones), each with its classes, versions and labels;
//! - [`ModelRegistry`]: model versions and which one serves each task (PipeStores and the Tuner);
//! - [`JobLog`]: long-running jobs and their resumable state;
//! - [`Catalog`]: everything one PipeStore uses (all but the node and replica registries);
//! - [`ObjectCatalog`]: buckets and objects of the S3 API, each object a photo or a plain blob;
//! - [`AccessKeys`]: the access keys of a PipeStore's APIs, with their roles;
//! - [`DuplicateCatalog`]: perceptual hashes of photos and sets of photos with the same bytes;
//! - [`NodeRegistry`]: the PipeStores registered with a Tuner and their leases (the Tuner's
//!   registry; not part of [`Catalog`]);
//! - [`ReplicaCatalog`]: which nodes hold a copy of each photo, deleted photos' tombstones, and
//!   the nodes placement chooses from (PostgreSQL only: replication needs a shared catalog).
//!
//! [`SqliteCatalog`] is the embedded implementation used by `ndpipe serve`; [`PgCatalog`] keeps a
//! cluster's catalog in one PostgreSQL database, each handle seeing one node's photos and jobs,
//! with photo ids from [`PhotoIdBlocks`]; [`open`] picks one from a `--catalog` value. Every
//! implementation must pass the shared `test_suite` (feature `testing`), as both do in their tests.
#![deny(missing_docs)]

mod blob_copies;
mod duplicates;
mod error;
mod keys;
mod label_terms;
mod objects;
mod pg;
mod replicas;
mod sqlite;
#[cfg(any(test, feature = "testing"))]
pub mod test_postgres;
#[cfg(any(test, feature = "testing"))]
pub mod test_suite;
mod types;

use std::collections::{BTreeMap, HashSet};

pub use blob_copies::{BlobCatalog, BlobCounts, BlobHolders};
pub use duplicates::DuplicateCatalog;
pub use error::CatalogError;
pub use keys::{AccessKeyRecord, Role};
pub use label_terms::label_matches;
pub use objects::{
    Bucket, ObjectAttributes, ObjectBody, ObjectChecksum, ObjectPart, ObjectRecord, PutCondition,
    StandardHeaders,
};
pub use pg::{
    OpenedCatalog, PgCatalog, PgOptions, PhotoIdBlocks, describe, is_postgres_url, open, open_with,
};
pub use replicas::{
    FailOver, NodeOverview, PhotoCopies, PlacementNode, ReplicaCatalog, ReplicationCounts,
};
pub use sqlite::SqliteCatalog;
pub use types::{
    GroundTruth, JobRecord, ModelVersion, NodeHit, NodeRecord, NodeState, OTHER_CLASS, PhotoId,
    PhotoMeta, PhotoRecord, Prediction, SearchHit, Split, Task, TaskHit, TaskName, TaskTruth,
};

/// Photos, their ground truth and predicted labels. Implementations are thread-safe and every
/// method is one transaction.
pub trait PhotoCatalog: Send + Sync {
    /// Inserts a photo, or replaces the row of the same id (ground truth included).
    fn upsert_photo(&self, photo: &PhotoRecord) -> Result<(), CatalogError>;

    /// Removes a photo with its ground truth and predictions. Returns whether it existed.
    fn delete_photo(&self, id: PhotoId) -> Result<bool, CatalogError>;

    /// One photo.
    fn photo(&self, id: PhotoId) -> Result<Option<PhotoRecord>, CatalogError>;

    /// Which of `ids` have a photo row, this node's or (in a catalog that nodes share) any other
    /// node's: one query for the whole batch. Ids without a row are left out.
    fn existing_photo_ids(&self, ids: &[PhotoId]) -> Result<HashSet<PhotoId>, CatalogError>;

    /// Photos in id order, starting after `after`, at most `limit`.
    fn list_photos(
        &self,
        after: Option<PhotoId>,
        limit: usize,
    ) -> Result<Vec<PhotoRecord>, CatalogError>;

    /// Number of photos.
    fn count_photos(&self) -> Result<u64, CatalogError>;

    /// Photos whose original has the hex SHA-256 `sha256`, oldest first: every node's in a
    /// catalog that nodes share. One lookup of the `photos_sha256` index.
    fn photos_with_sha256(&self, sha256: &str) -> Result<Vec<PhotoRecord>, CatalogError>;

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

    /// How many photos have labels under `model_version`, and how many of them are labelled
    /// [`OTHER_CLASS`] (their top-1).
    fn label_counts(&self, model_version: &str) -> Result<(u64, u64), CatalogError>;

    /// The predictions of every model version for one photo, grouped by version, best first.
    fn predictions(&self, id: PhotoId) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError>;

    /// Photos whose predictions under `model_version` include `label` (the whole label exactly,
    /// or one of the comma-separated names of a class such as "tabby, tabby cat" ignoring ASCII
    /// case), best score first: one lookup of the label index, whatever the catalog's size.
    fn search(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<SearchHit>, CatalogError>;

    /// [`search`](Self::search) over the photos of every node that shares this catalog, each
    /// hit with the node that holds it and whether that node is available (registered, with a
    /// live lease). A catalog only one node uses answers its own photos, all available.
    fn search_cluster(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<NodeHit>, CatalogError> {
        Ok(self
            .search(label, model_version, offset, limit)?
            .into_iter()
            .map(|hit| NodeHit {
                node: None,
                available: true,
                hit,
            })
            .collect())
    }

    /// [`search_cluster`](Self::search_cluster) under several versions (one per task, say),
    /// merged best score first, each hit with the task and version that gave the label: the
    /// page from `offset`, at most `limit`.
    fn search_versions(
        &self,
        label: &str,
        versions: &[ModelVersion],
        offset: usize,
        limit: usize,
    ) -> Result<Vec<TaskHit>, CatalogError> {
        let end = offset.saturating_add(limit);
        let mut hits = Vec::new();
        for version in versions {
            for hit in self.search_cluster(label, &version.id, 0, end)? {
                hits.push(TaskHit {
                    task: version.task.clone(),
                    model_version: version.id.clone(),
                    hit,
                });
            }
        }
        hits.sort_by(|a, b| {
            b.hit
                .hit
                .score
                .total_cmp(&a.hit.hit.score)
                .then(a.hit.hit.id.cmp(&b.hit.hit.id))
        });
        Ok(hits.into_iter().skip(offset).take(limit).collect())
    }
}

/// Ground truth, per task: what people and data sets say a photo is. Every method is one
/// transaction; a label for a task that does not exist is [`CatalogError::NotFound`].
pub trait TruthCatalog: Send + Sync {
    /// Photos with ground truth of `task` in `split`, as (id, label), in id order.
    fn labelled(
        &self,
        task: &TaskName,
        split: Split,
    ) -> Result<Vec<(PhotoId, String)>, CatalogError>;

    /// Every photo with ground truth of `task`, in id order: one read, so that a job's training
    /// and validation sets come from the same moment of the catalog.
    fn ground_truths(&self, task: &TaskName) -> Result<Vec<TaskTruth>, CatalogError>;

    /// Sets a photo's ground truth in its task. Fails with [`CatalogError::NotFound`] for an
    /// unknown photo or task.
    fn set_ground_truth(&self, id: PhotoId, truth: &GroundTruth) -> Result<(), CatalogError>;

    /// Sets the ground truth of many photos in one transaction; photos that do not exist are
    /// skipped. Returns the ids written.
    fn set_ground_truths(
        &self,
        rows: &[(PhotoId, GroundTruth)],
    ) -> Result<Vec<PhotoId>, CatalogError>;

    /// Clears a photo's ground truth in `task`; returns whether it had one.
    fn clear_ground_truth(&self, id: PhotoId, task: &TaskName) -> Result<bool, CatalogError>;
}

/// Tasks: named classifiers over the backbone's features, each with its own classes,
/// versions and labels. `general` and `default` always exist.
pub trait TaskCatalog: Send + Sync {
    /// Records a task. Fails with [`CatalogError::Conflict`] if it exists.
    fn create_task(&self, task: &Task) -> Result<(), CatalogError>;

    /// Every task, in name order.
    fn tasks(&self) -> Result<Vec<Task>, CatalogError>;

    /// One task.
    fn task(&self, name: &TaskName) -> Result<Option<Task>, CatalogError>;

    /// Sets (or with `None` clears) a task's own score floor. Fails with
    /// [`CatalogError::NotFound`] for an unknown task.
    fn set_task_floor(&self, name: &TaskName, floor: Option<f32>) -> Result<(), CatalogError>;
}

/// Model versions: their lineage, metrics, and the one that serves each task.
pub trait ModelRegistry: Send + Sync {
    /// Records a model version. Fails with [`CatalogError::Conflict`] if the id exists.
    fn register_model(&self, model: &ModelVersion) -> Result<(), CatalogError>;

    /// All model versions, oldest first.
    fn models(&self) -> Result<Vec<ModelVersion>, CatalogError>;

    /// One model version.
    fn model(&self, id: &str) -> Result<Option<ModelVersion>, CatalogError>;

    /// The version that serves `task` now, if any.
    fn active_model(&self, task: &TaskName) -> Result<Option<ModelVersion>, CatalogError>;

    /// The versions that serve now, one per task that has one, in task order.
    fn active_models(&self) -> Result<Vec<ModelVersion>, CatalogError>;

    /// Makes `id` the active version of its task. Fails with [`CatalogError::NotFound`] if
    /// unknown.
    fn set_active_model(&self, id: &str) -> Result<(), CatalogError>;

    /// Leaves `task` without an active version; returns whether it had one.
    fn deactivate_task(&self, task: &TaskName) -> Result<bool, CatalogError>;
}

/// Long-running jobs (e.g. re-labelling) with their resumable state.
pub trait JobLog: Send + Sync {
    /// Inserts or updates a job (status and state).
    fn put_job(&self, job: &JobRecord) -> Result<(), CatalogError>;

    /// All jobs, oldest first.
    fn jobs(&self) -> Result<Vec<JobRecord>, CatalogError>;
}

/// The PipeStores registered with a Tuner, with their leases. Times are given by the caller (ms
/// since the Unix epoch), so implementations keep no clock of their own.
pub trait NodeRegistry: Send + Sync {
    /// Registers `name` at `url`, or re-registers a known name: it keeps its id, state and
    /// registration time, and takes the new url, version and lease. Returns the record.
    fn register_node(
        &self,
        name: &str,
        url: &str,
        version: Option<&str>,
        lease_expires_ms: i64,
        now_ms: i64,
    ) -> Result<NodeRecord, CatalogError>;

    /// Renews the lease of node `id`, which must be registered as `name`, and records the version
    /// it reports. Fails with [`CatalogError::NotFound`] for a node that is not registered (it
    /// was removed, or never was).
    fn renew_node_lease(
        &self,
        id: u32,
        name: &str,
        version: Option<&str>,
        lease_expires_ms: i64,
        now_ms: i64,
    ) -> Result<NodeRecord, CatalogError>;

    /// Every registered node, in id order.
    fn nodes(&self) -> Result<Vec<NodeRecord>, CatalogError>;

    /// Sets whether node `name` takes new work. Fails with [`CatalogError::NotFound`] if unknown.
    fn set_node_state(&self, name: &str, state: NodeState) -> Result<NodeRecord, CatalogError>;

    /// Records the version node `id` serves (after the Tuner committed one on it). Fails with
    /// [`CatalogError::NotFound`] if unknown.
    fn set_node_version(&self, id: u32, version: &str) -> Result<(), CatalogError>;

    /// Forgets node `name` (it must register again to come back, under a new id). Returns
    /// whether it was registered.
    fn remove_node(&self, name: &str) -> Result<bool, CatalogError>;
}

/// Buckets and objects of the S3 API. Keys are compared as bytes (UTF-8 order). Every method is
/// one transaction.
pub trait ObjectCatalog: Send + Sync {
    /// Creates a bucket. Fails with [`CatalogError::Conflict`] if it exists.
    fn create_bucket(&self, bucket: &Bucket) -> Result<(), CatalogError>;

    /// One bucket.
    fn bucket(&self, name: &str) -> Result<Option<Bucket>, CatalogError>;

    /// Every bucket, in name order.
    fn buckets(&self) -> Result<Vec<Bucket>, CatalogError>;

    /// Removes an empty bucket. Fails with [`CatalogError::NotFound`] if unknown and
    /// [`CatalogError::NotEmpty`] if it holds objects.
    fn delete_bucket(&self, name: &str) -> Result<(), CatalogError>;

    /// Records an object, replacing the one of the same bucket and key, when `condition` holds
    /// for the object there (checked and written in one step); returns the replaced one (whose
    /// bytes the caller then removes). Fails with [`CatalogError::NotFound`] if the bucket does
    /// not exist, and as [`PutCondition`] says when the condition does not hold: then nothing
    /// changes.
    fn put_object(
        &self,
        object: &ObjectRecord,
        condition: &PutCondition,
    ) -> Result<Option<ObjectRecord>, CatalogError>;

    /// One object.
    fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError>;

    /// The object that is photo `id`, if any.
    fn object_of_photo(&self, id: PhotoId) -> Result<Option<ObjectRecord>, CatalogError>;

    /// Replaces the user tags of an object, nothing else of it; returns whether it exists.
    fn set_object_tags(
        &self,
        bucket: &str,
        key: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<bool, CatalogError>;

    /// Removes an object; returns it when it existed.
    fn delete_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError>;

    /// Objects of `bucket` whose key starts with `prefix` and comes after `after` (all of them
    /// when `None`), in key order, at most `limit`.
    fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ObjectRecord>, CatalogError>;
}

/// The access keys of a PipeStore's APIs. Every method is one transaction.
pub trait AccessKeys: Send + Sync {
    /// Records a key. Fails with [`CatalogError::Conflict`] if its name or access key exists.
    fn create_key(&self, key: &AccessKeyRecord) -> Result<(), CatalogError>;

    /// The key with this access key id.
    fn key(&self, access_key: &str) -> Result<Option<AccessKeyRecord>, CatalogError>;

    /// The key whose secret has this hex SHA-256.
    fn key_by_secret(&self, secret_sha256: &str) -> Result<Option<AccessKeyRecord>, CatalogError>;

    /// Every key, in name order.
    fn keys(&self) -> Result<Vec<AccessKeyRecord>, CatalogError>;

    /// Removes the key named `name`; returns whether it existed.
    fn delete_key(&self, name: &str) -> Result<bool, CatalogError>;

    /// How many keys there are (none: the APIs are open, as before keys existed).
    fn count_keys(&self) -> Result<u64, CatalogError>;
}

/// Everything a PipeStore keeps in its catalog: photos, ground truth, tasks, the model
/// registry, the job log, the S3 objects, the access keys and what duplicate finding keeps.
pub trait Catalog:
    PhotoCatalog
    + TruthCatalog
    + TaskCatalog
    + ModelRegistry
    + JobLog
    + ObjectCatalog
    + AccessKeys
    + DuplicateCatalog
{
}

impl<
    T: PhotoCatalog
        + TruthCatalog
        + TaskCatalog
        + ModelRegistry
        + JobLog
        + ObjectCatalog
        + AccessKeys
        + DuplicateCatalog,
> Catalog for T
{
}
