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

    /// One pass: every lagging node with a live lease, brought to every task's active version.
    async fn sync_pass(&self) -> Result<(), TunerError> {
        let active = self.registry.active_all()?;
        if active.is_empty() {
            return Ok(());
        }
        let intent = self.registry.intent()?.to_string();
        let lagging = self.nodes.lagging(&intent)?;
        if lagging.is_empty() {
            return Ok(());
        }
        let Ok(_job) = self.try_lock() else {
            return Ok(());
        };
        let intended = active
            .into_iter()
            .map(|v| Ok((self.registry.head(&v.id)?, v)))
            .map(|r: Result<_, TunerError>| r.map(|(h, v)| (v, h)))
            .collect::<Result<Vec<_>, _>>()?;
        for node in lagging {
            match deploy::bring(&node, &intended).await {
                Ok(()) => {
                    self.nodes.set_version(node.id, &intent)?;
                    info!(node = %node.label(), serving = %intent, "brought to the active versions");
                }
                Err(e) => {
                    warn!(node = %node.label(), serving = %intent, error = %e, "cannot bring the node to the active versions yet");
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
