//! The replication metrics, under `ndpipe_store_replication_*` on `/metrics`.

use ndpipe_catalog::{BlobCounts, ReplicationCounts};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Counters of copies made, received, damaged and repaired, and the cluster's copy counts.
#[derive(Default)]
pub(crate) struct ReplicationMetrics {
    /// Copies this node stored for other nodes' photos and for plain objects (uploads and
    /// repairs).
    pub(crate) copies_received: Counter,
    /// Copies this node made on other nodes to bring its photos and plain objects back to the
    /// wanted count.
    pub(crate) copies_made: Counter,
    /// Original bytes of those copies.
    pub(crate) copied_bytes: Counter,
    /// Damaged or unreadable local copies found (reads and scrub).
    pub(crate) damaged: Counter,
    /// Local copies replaced with an intact one.
    pub(crate) repaired: Counter,
    /// Local copies re-read by the scrub.
    pub(crate) scrubbed: Counter,
    /// Photos deleted through this node's front door.
    pub(crate) deletes: Counter,
    /// This node's photos moved to where placement puts them (a copy made, one dropped).
    pub(crate) rebalanced: Counter,
    /// Photos of the cluster at the wanted copy count.
    pub(crate) at_target: Gauge,
    /// Photos of the cluster below it, with at least one copy.
    pub(crate) under_replicated: Gauge,
    /// Photos no registered node holds.
    pub(crate) lost: Gauge,
    /// Plain objects' files of the cluster at the wanted copy count.
    pub(crate) files_at_target: Gauge,
    /// Plain objects' files below it, with at least one copy.
    pub(crate) files_under_replicated: Gauge,
    /// Plain objects' files no registered node holds.
    pub(crate) files_lost: Gauge,
}

impl ReplicationMetrics {
    /// Registers every metric in `registry` under `replication_`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("replication");
        let counters = [
            (
                "copies_received",
                "Copies stored here for photos of other nodes and for plain objects",
                &self.copies_received,
            ),
            (
                "copies_made",
                "Copies of photos and plain objects made on other nodes by repair",
                &self.copies_made,
            ),
            (
                "copied_bytes",
                "Bytes of photos and plain objects copied by repair",
                &self.copied_bytes,
            ),
            (
                "damaged",
                "Damaged or missing local copies found",
                &self.damaged,
            ),
            (
                "repaired",
                "Local copies replaced with an intact one",
                &self.repaired,
            ),
            (
                "scrubbed",
                "Local copies re-read by the scrub",
                &self.scrubbed,
            ),
            ("deletes", "Photos deleted on every holder", &self.deletes),
            (
                "rebalanced",
                "Photos moved to where placement puts them",
                &self.rebalanced,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        let gauges = [
            (
                "photos_at_target",
                "Photos at the wanted copy count",
                &self.at_target,
            ),
            (
                "photos_under_replicated",
                "Photos below the wanted copy count",
                &self.under_replicated,
            ),
            ("photos_lost", "Photos no registered node holds", &self.lost),
            (
                "plain_objects_at_target",
                "Plain objects at the wanted copy count",
                &self.files_at_target,
            ),
            (
                "plain_objects_under_replicated",
                "Plain objects below the wanted copy count",
                &self.files_under_replicated,
            ),
            (
                "plain_objects_lost",
                "Plain objects no registered node holds",
                &self.files_lost,
            ),
        ];
        for (name, help, gauge) in gauges {
            r.register(name, help, gauge.clone());
        }
    }

    /// Sets the cluster's copy counts.
    pub(crate) fn set_counts(&self, counts: &ReplicationCounts) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.at_target.set(g(counts.at_target));
        self.under_replicated.set(g(counts.under_replicated));
        self.lost.set(g(counts.lost));
    }

    /// Sets the cluster's copy counts of plain objects.
    pub(crate) fn set_file_counts(&self, counts: &BlobCounts) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.files_at_target.set(g(counts.at_target));
        self.files_under_replicated.set(g(counts.under_replicated));
        self.files_lost.set(g(counts.lost));
    }
}
