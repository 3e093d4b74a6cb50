//! The repair job: when a node of a replicated cluster is removed, the PipeStores' replication
//! workers copy what it held again (each photo by its primary, each plain object's file by its
//! lowest live holder). The Tuner does not drive that work; this job follows it in the jobs
//! API, from the shared catalog's copy counts, so that an operator sees what is left and when
//! it is over: phase `repairing`, a progress row for photos and one for plain objects (copies
//! back at the wanted count, of those short when the node went), and at the end a report with
//! what could not be repaired (photos and files no registered node holds any more). The job
//! fails when the counts stop going down for `repair_stall_ms` (for instance, fewer live nodes
//! than copies).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ndpipe_catalog::{CatalogError, ReplicaCatalog};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::TunerError;
use crate::jobs::{Phase, Progress};

/// How often the job reads the copy counts.
const POLL: Duration = Duration::from_millis(500);

/// What a repair job found when repair was over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairReport {
    /// The node that was removed.
    pub node: String,
    /// Copies wanted of each photo and plain object.
    pub replicas: u32,
    /// Photos short of copies when the node was removed.
    pub photos_short: u64,
    /// Plain objects short of copies when the node was removed.
    pub plain_objects_short: u64,
    /// Photos at the wanted copies at the end.
    pub photos_at_target: u64,
    /// Plain objects at the wanted copies at the end.
    pub plain_objects_at_target: u64,
    /// Photos no registered node holds: lost with the node.
    pub photos_lost: u64,
    /// Plain objects no registered node holds: lost with the node.
    pub plain_objects_lost: u64,
    /// Seconds from the removal to the end of repair.
    pub seconds: f64,
}

/// Copies short, of photos and of plain objects, and the counts behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Short {
    photos: u64,
    files: u64,
    photos_at_target: u64,
    files_at_target: u64,
    photos_lost: u64,
    files_lost: u64,
}

impl Short {
    fn read(catalog: &dyn ReplicaCatalog, wanted: u32) -> Result<Short, CatalogError> {
        let (photos, files) = (
            catalog.replication_counts(wanted)?,
            catalog.blob_counts(wanted)?,
        );
        Ok(Short {
            photos: photos.under_replicated,
            files: files.under_replicated,
            photos_at_target: photos.at_target,
            files_at_target: files.at_target,
            photos_lost: photos.lost,
            files_lost: files.lost,
        })
    }

    fn left(&self) -> u64 {
        self.photos + self.files
    }
}

/// Follows repair after `node` was removed until nothing is short of `wanted` copies, reporting
/// on `progress`; fails when nothing moves for `stall`.
pub(crate) async fn follow(
    catalog: Arc<dyn ReplicaCatalog>,
    progress: &Progress,
    node: String,
    wanted: u32,
    stall: Duration,
) -> Result<RepairReport, TunerError> {
    let started = Instant::now();
    let read = || {
        let catalog = catalog.clone();
        async move {
            tokio::task::spawn_blocking(move || Short::read(catalog.as_ref(), wanted))
                .await
                .map_err(|e| TunerError::Internal(e.to_string()))?
                .map_err(TunerError::from)
        }
    };
    let first = read().await?;
    progress.phase(
        Phase::Repairing,
        &["photos".to_string(), "plain objects".to_string()],
    );
    let (mut total_photos, mut total_files) = (first.photos, first.files);
    let (mut least, mut moved_at) = (first.left(), Instant::now());
    let mut now = first;
    loop {
        // Uploads during repair can add photos short of copies: the totals grow with them.
        total_photos = total_photos.max(now.photos);
        total_files = total_files.max(now.files);
        progress.node(0, total_photos - now.photos, total_photos);
        progress.node(1, total_files - now.files, total_files);
        if now.left() == 0 {
            break;
        }
        if now.left() < least {
            (least, moved_at) = (now.left(), Instant::now());
        } else if moved_at.elapsed() >= stall {
            return Err(TunerError::RepairStalled(format!(
                "{} photos and {} plain objects are still short of {wanted} copies after {} s without progress (fewer live nodes than copies, or nodes that cannot take them?)",
                now.photos,
                now.files,
                stall.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
        now = read().await?;
    }
    let report = RepairReport {
        node,
        replicas: wanted,
        photos_short: total_photos,
        plain_objects_short: total_files,
        photos_at_target: now.photos_at_target,
        plain_objects_at_target: now.files_at_target,
        photos_lost: now.photos_lost,
        plain_objects_lost: now.files_lost,
        seconds: started.elapsed().as_secs_f64(),
    };
    info!(?report, "repair after a node's removal is over");
    Ok(report)
}
