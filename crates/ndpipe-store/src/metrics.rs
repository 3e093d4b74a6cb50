//! Prometheus metrics of the PipeStore, served on `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::replication::ReplicationMetrics;
use crate::similar::metrics::SimilarMetrics;

/// Label set of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    /// The error kind, as in the JSON error body.
    pub(crate) kind: String,
}

/// Label set of the per-task label counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TaskOutcome {
    /// The task.
    pub(crate) task: String,
    /// `class` when the photo got one of the task's classes, `other` when none reached the floor.
    pub(crate) outcome: String,
}

/// All store metrics, registered under the `ndpipe_store` prefix.
pub(crate) struct StoreMetrics {
    registry: Registry,
    /// Accepted uploads.
    pub(crate) uploads: Counter,
    /// Bytes of accepted uploads.
    pub(crate) upload_bytes: Counter,
    /// Photos read back.
    pub(crate) reads: Counter,
    /// Photos deleted.
    pub(crate) deletes: Counter,
    /// Failed requests, by error kind.
    pub(crate) errors: Family<ErrorLabels, Counter>,
    /// Seconds from request to acknowledgement of an upload.
    pub(crate) ingest_seconds: Histogram,
    /// Live photos.
    pub(crate) photos: Gauge,
    /// Photos labelled by online inference.
    pub(crate) labelled: Counter,
    /// Labels given at ingest, by task and outcome.
    pub(crate) task_labels: Family<TaskOutcome, Counter>,
    /// Seconds from the durable write (the 201) to the labels being in the catalog.
    pub(crate) label_seconds: Histogram,
    /// Photo ids waiting in the online-labelling backlog.
    pub(crate) label_backlog: Gauge,
    /// Replication's copies, repairs and the cluster's copy counts.
    pub(crate) replication: ReplicationMetrics,
    /// Similarity queries and this node's index.
    pub(crate) similar: SimilarMetrics,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ndpipe_store");
        let uploads = Counter::default();
        let upload_bytes = Counter::default();
        let reads = Counter::default();
        let deletes = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let ingest_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let photos = Gauge::default();
        let labelled = Counter::default();
        let task_labels = Family::<TaskOutcome, Counter>::default();
        let label_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let label_backlog = Gauge::default();
        registry.register("uploads", "Photos accepted", uploads.clone());
        registry.register(
            "upload_bytes",
            "Bytes of photos accepted",
            upload_bytes.clone(),
        );
        registry.register("reads", "Photos read back", reads.clone());
        registry.register("deletes", "Photos deleted", deletes.clone());
        registry.register("errors", "Failed requests by error kind", errors.clone());
        registry.register(
            "ingest_duration_seconds",
            "Upload latency from request to durable acknowledgement",
            ingest_seconds.clone(),
        );
        registry.register("photos", "Live photos in the store", photos.clone());
        registry.register("labelled", "Photos labelled at ingest", labelled.clone());
        registry.register(
            "task_labels",
            "Labels given at ingest by task, and whether the photo was a class of it or other",
            task_labels.clone(),
        );
        registry.register(
            "label_latency_seconds",
            "Seconds from the durable write of a photo to its labels",
            label_seconds.clone(),
        );
        registry.register(
            "label_backlog",
            "Photo ids waiting for online labelling (more wait in the catalog as unlabelled)",
            label_backlog.clone(),
        );
        let replication = ReplicationMetrics::default();
        replication.register(&mut registry);
        let similar = SimilarMetrics::default();
        similar.register(&mut registry);
        StoreMetrics {
            similar,
            registry,
            replication,
            uploads,
            upload_bytes,
            reads,
            deletes,
            errors,
            ingest_seconds,
            photos,
            labelled,
            task_labels,
            label_seconds,
            label_backlog,
        }
    }
}

impl StoreMetrics {
    /// Counts one failed request of `kind`.
    pub(crate) fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels { kind: kind.into() })
            .inc();
    }

    /// Counts one label of `task`: a class of it, or `other`.
    pub(crate) fn task_label(&self, task: &str, other: bool) {
        let outcome = if other { "other" } else { "class" };
        self.task_labels
            .get_or_create(&TaskOutcome {
                task: task.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
