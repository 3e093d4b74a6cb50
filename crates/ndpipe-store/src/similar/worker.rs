//! The index's worker thread: the one writer of the graph. It applies the feature store's
//! changes (each id is looked up again in the store, so the graph ends as the store is whatever
//! the order of writes and deletes), opens and reconciles the saved index of the active
//! backbone, builds what is missing in chunks (changes are applied between chunks), follows the
//! active model to another backbone, and saves a changed index every `save_interval` and at
//! stop.

use std::collections::HashSet;
use std::sync::Arc;
#[cfg(test)]
use std::sync::mpsc::Sender;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use ndpipe_util::sync::{read, write};
use tracing::{info, warn};

use super::SimilarError;
use super::ann::AnnIndex;
use super::index::{Live, Shared};

/// How often an idle worker looks at the active backbone and the save interval.
const TICK: Duration = Duration::from_millis(500);
/// Photos added per step of a build, between which changes and queries get their turn.
const CHUNK: usize = 256;

/// What the worker is told.
pub(super) enum Event {
    /// The features of `ids` changed (`backbone`: the one written; `None`: removed under all).
    Changed {
        backbone: Option<String>,
        ids: Vec<u64>,
    },
    /// Answer once everything before is applied and no build runs.
    #[cfg(test)]
    Settle(Sender<()>),
    /// Stop without saving, as a crash would.
    #[cfg(test)]
    Crash,
    /// Save a changed index and stop.
    Stop,
}

/// The worker's state.
pub(super) struct Worker {
    shared: Arc<Shared>,
    /// Photos with features that the graph may lack, still to add (a build in progress).
    todo: Vec<u64>,
    last_save: Instant,
    #[cfg(test)]
    settling: Vec<Sender<()>>,
}

impl Worker {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Worker {
            shared,
            todo: Vec::new(),
            last_save: Instant::now(),
            #[cfg(test)]
            settling: Vec::new(),
        }
    }

    /// Runs until [`Event::Stop`].
    pub(super) fn run(mut self, rx: Receiver<Event>) {
        loop {
            self.follow_backbone();
            let wait = if self.todo.is_empty() {
                TICK
            } else {
                Duration::ZERO
            };
            match rx.recv_timeout(wait) {
                Ok(Event::Changed { backbone, ids }) => self.apply(backbone.as_deref(), &ids),
                #[cfg(test)]
                Ok(Event::Settle(tx)) => self.settling.push(tx),
                #[cfg(test)]
                Ok(Event::Crash) => return,
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    self.save(true);
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.build_step();
            self.save(false);
            // A settle request is answered once the events sent before it (received first)
            // are applied and no build runs.
            #[cfg(test)]
            if self.todo.is_empty() {
                for tx in self.settling.drain(..) {
                    let _ = tx.send(());
                }
            }
        }
    }

    /// Opens the active backbone's index when the graph is of another one (or none yet).
    fn follow_backbone(&mut self) {
        let model = self.shared.model.get();
        let info = model.info();
        let current = read(&self.shared.live).as_ref().map(|l| l.backbone.clone());
        if current.as_deref() == Some(info.backbone_version.as_str()) {
            return;
        }
        match self.open(&info.backbone_version, info.feature_dim) {
            Ok(()) => {}
            Err(e) => {
                warn!(backbone = %info.backbone_version, error = %e, "cannot open the similarity index; trying again");
                std::thread::sleep(TICK);
            }
        }
    }

    /// Makes backbone `backbone`'s saved index (or a new one) the live graph, reconciled with
    /// the feature store: extra photos removed at once, missing ones queued for the build.
    fn open(&mut self, backbone: &str, dim: usize) -> Result<(), SimilarError> {
        let options = self.shared.settings.options;
        let stored: HashSet<u64> = self.shared.features.ids(backbone)?.into_iter().collect();
        let (mut ann, dirty) = match self.shared.dir.open(backbone, dim, options) {
            Ok(ann) => (ann, false),
            Err(reason) => {
                info!(%backbone, %reason, photos = stored.len(), "building the similarity index from the feature store");
                (new_index(backbone, dim, options)?, true)
            }
        };
        let extras: Vec<u64> = ann
            .keys()
            .iter()
            .filter(|id| !stored.contains(id))
            .copied()
            .collect();
        for id in &extras {
            ann.remove(*id).map_err(|source| SimilarError::Index {
                backbone: backbone.into(),
                source,
            })?;
        }
        self.todo = stored.into_iter().filter(|id| !ann.contains(*id)).collect();
        self.todo.sort_unstable();
        info!(%backbone, indexed = ann.len(), removed = extras.len(), missing = self.todo.len(), "similarity index open");
        let building = !self.todo.is_empty();
        *write(&self.shared.live) = Some(Live {
            backbone: backbone.into(),
            ann,
            building,
            dirty: dirty || !extras.is_empty(),
        });
        self.shared.metrics.set_building(building);
        self.publish_size();
        Ok(())
    }

    /// Adds the next chunk of the build; ends the build when nothing is left.
    fn build_step(&mut self) {
        if self.todo.is_empty() {
            return;
        }
        let at = self.todo.len().saturating_sub(CHUNK);
        let chunk = self.todo.split_off(at);
        let Some(backbone) = self.backbone() else {
            return;
        };
        for (id, features) in self.read(&backbone, &chunk) {
            let Some(f) = features else { continue };
            let current = self.with_live(&backbone, |live| {
                if !live.ann.contains(id) {
                    upsert(live, id, &f);
                }
            });
            if !current {
                return;
            }
        }
        if self.todo.is_empty() {
            self.with_live(&backbone, |live| {
                live.building = false;
                info!(backbone = %live.backbone, indexed = live.ann.len(), "similarity index built");
            });
            self.shared.metrics.set_building(false);
            self.save(true);
        }
        self.publish_size();
    }

    /// Applies a change: every id takes what the store now holds under the graph's backbone.
    fn apply(&mut self, backbone: Option<&str>, ids: &[u64]) {
        let Some(current) = self.backbone() else {
            return;
        };
        if backbone.is_some_and(|b| b != current) {
            return;
        }
        for (id, features) in self.read(&current, ids) {
            let applied = self.with_live(&current, |live| match features {
                Some(f) => upsert(live, id, &f),
                None => {
                    if let Err(e) = live.ann.remove(id) {
                        warn!(photo = id, error = %e, "cannot remove a photo from the similarity index");
                    }
                    live.dirty = true;
                }
            });
            if !applied {
                return;
            }
        }
        self.publish_size();
    }

    /// The backbone of the live graph, if there is one.
    fn backbone(&self) -> Option<String> {
        read(&self.shared.live).as_ref().map(|l| l.backbone.clone())
    }

    /// Runs `change` on the live graph under the write lock, if it is still of `backbone`;
    /// whether it was.
    fn with_live(&self, backbone: &str, change: impl FnOnce(&mut Live)) -> bool {
        let mut live = write(&self.shared.live);
        match live.as_mut().filter(|l| l.backbone == backbone) {
            Some(live) => {
                change(live);
                true
            }
            None => false,
        }
    }

    /// The stored features of `ids` under `backbone` (`None`: none, or unreadable).
    fn read(&self, backbone: &str, ids: &[u64]) -> Vec<(u64, Option<Vec<f32>>)> {
        ids.iter()
            .map(|&id| match self.shared.features.get(backbone, id) {
                Ok(f) => (id, f),
                Err(e) => {
                    warn!(photo = id, error = %e, "cannot read features for the similarity index");
                    (id, None)
                }
            })
            .collect()
    }

    /// Saves a changed graph when `now`, or when the save interval has passed.
    fn save(&mut self, now: bool) {
        if !now && self.last_save.elapsed() < self.shared.settings.save_interval {
            return;
        }
        let live = read(&self.shared.live);
        let Some(l) = live.as_ref().filter(|l| l.dirty) else {
            return;
        };
        let saved = self
            .shared
            .dir
            .save(&l.backbone, &l.ann, self.shared.settings.options);
        let backbone = l.backbone.clone();
        drop(live);
        self.last_save = Instant::now();
        match saved {
            Ok(bytes) => {
                if let Some(l) = write(&self.shared.live)
                    .as_mut()
                    .filter(|l| l.backbone == backbone)
                {
                    l.dirty = false;
                }
                self.shared.metrics.set_bytes(bytes);
            }
            Err(e) => {
                warn!(%backbone, error = %e, "cannot save the similarity index; it is rebuilt or reconciled at the next start")
            }
        }
    }

    /// Shows the graph's size in the metrics.
    fn publish_size(&self) {
        if let Some(l) = read(&self.shared.live).as_ref() {
            self.shared.metrics.set_photos(l.ann.len());
        }
    }
}

fn new_index(
    backbone: &str,
    dim: usize,
    options: super::ann::AnnOptions,
) -> Result<AnnIndex, SimilarError> {
    AnnIndex::new(dim, options).map_err(|source| SimilarError::Index {
        backbone: backbone.into(),
        source,
    })
}

/// Adds or replaces photo `id` in the live graph; a failure is logged (the next start's
/// reconcile adds it).
fn upsert(live: &mut Live, id: u64, features: &[f32]) {
    live.dirty = true;
    if let Err(e) = live.ann.upsert(id, features) {
        warn!(photo = id, error = %e, "cannot add a photo to the similarity index");
    }
}
