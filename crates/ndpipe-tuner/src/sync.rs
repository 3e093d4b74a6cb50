//! Bringing nodes to the active version: the Tuner's registry records the version every node
//! should serve (set before a deploy's first commit). A node that serves another one (it missed
//! a commit, restarted from an old state, or joined later) takes part in no job until the
//! syncer has staged the head on it (when the version has one), committed it and re-labelled
//! its photos. The syncer runs in the background, woken by a heartbeat or registration that
//! reports another version and at the end of every job, and otherwise every heartbeat interval;
//! it waits while a job holds the job lock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tracing::{info, warn};

use crate::control::Core;
use crate::{TunerError, deploy};

impl Core {
    /// Starts the syncer on first use, and wakes it.
    pub(crate) fn wake_sync(self: &Arc<Self>) {
        if !self.sync_started.swap(true, Ordering::SeqCst) {
            tokio::spawn(run(Arc::downgrade(self), self.sync_wake.clone()));
        }
        self.sync_wake.notify_one();
    }

    /// One pass: every lagging node with a live lease, brought to the active version.
    async fn sync_pass(&self) -> Result<(), TunerError> {
        let Some(active) = self.registry.active()? else {
            return Ok(());
        };
        let lagging = self.nodes.lagging(&active.id)?;
        if lagging.is_empty() {
            return Ok(());
        }
        let Ok(_job) = self.try_lock() else {
            return Ok(());
        };
        let head = self.registry.head(&active.id)?;
        for node in lagging {
            match deploy::bring(&node, &active, head.as_ref()).await {
                Ok(()) => {
                    self.nodes.set_version(node.id, &active.id)?;
                    info!(node = %node.label(), version = %active.id, "brought to the active version");
                }
                Err(e) => {
                    warn!(node = %node.label(), version = %active.id, error = %e, "cannot bring the node to the active version yet");
                    self.nodes.set_sync_error(node.id, e.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The syncer: a pass at every wake-up and every heartbeat interval, until the Tuner is gone.
async fn run(core: Weak<Core>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let Some(tick) = core.upgrade().map(|c| c.nodes.heartbeat()) else {
            return;
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        if let Err(e) = core.sync_pass().await {
            warn!(error = %e, "bringing nodes to the active version");
        }
    }
}
