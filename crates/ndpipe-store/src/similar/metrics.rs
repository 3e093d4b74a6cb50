//! The similarity search's metrics, registered beside the store's (`ndpipe_store_similar_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set of the query counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueryLabels {
    /// `photo` (a stored photo's features), `upload` (a posted photo), `neighbours` (a batch
    /// of this node's photos, for semantic duplicates) or `node` (a batch from a front door).
    pub(crate) kind: String,
}

/// Queries answered, their latency and the node's index. Clones share the values.
#[derive(Clone)]
pub(crate) struct SimilarMetrics {
    queries: Family<QueryLabels, Counter>,
    seconds: Histogram,
    photos: Gauge,
    bytes: Gauge,
    building: Gauge,
}

impl Default for SimilarMetrics {
    fn default() -> Self {
        SimilarMetrics {
            queries: Family::default(),
            seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            photos: Gauge::default(),
            bytes: Gauge::default(),
            building: Gauge::default(),
        }
    }
}

impl SimilarMetrics {
    /// Registers every metric in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "similar_queries",
            "Similarity queries answered, by kind",
            self.queries.clone(),
        );
        registry.register(
            "similar_query_duration_seconds",
            "Similarity query latency, the fan-out to the cluster's nodes included",
            self.seconds.clone(),
        );
        registry.register(
            "similar_index_photos",
            "Photos in this node's similarity index",
            self.photos.clone(),
        );
        registry.register(
            "similar_index_bytes",
            "Bytes of this node's similarity index as last saved",
            self.bytes.clone(),
        );
        registry.register(
            "similar_index_building",
            "1 while this node's similarity index is being built",
            self.building.clone(),
        );
    }

    /// Counts one query of `kind` that took `seconds`.
    pub(crate) fn query(&self, kind: &str, seconds: f64) {
        self.queries
            .get_or_create(&QueryLabels { kind: kind.into() })
            .inc();
        self.seconds.observe(seconds);
    }

    pub(crate) fn set_photos(&self, photos: usize) {
        self.photos.set(i64::try_from(photos).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_bytes(&self, bytes: u64) {
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_building(&self, building: bool) {
        self.building.set(i64::from(building));
    }
}
