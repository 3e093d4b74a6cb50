//! The online labeller's backlog: photos that arrived while its queue was full, held as ids up
//! to a bound. Past the bound an id is not kept: the photo is stored and stays unlabelled in the
//! catalog, and once the backlog has worked off what it holds it refills from the catalog's
//! unlabelled photos. Memory stays bounded however far labelling falls behind, and no photo is
//! forgotten.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use ndpipe_util::sync::lock;

/// Ids waiting for the model thread, with when each was queued.
pub(crate) struct Backlog {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    ids: VecDeque<(u64, Instant)>,
    /// Ids were left out since the last refill.
    overflowed: bool,
}

impl Backlog {
    /// An empty backlog holding at most `cap` ids.
    pub(crate) fn new(cap: usize) -> Self {
        Backlog {
            cap,
            inner: Mutex::default(),
        }
    }

    /// Queues `ids`; those past the bound are left to the catalog.
    pub(crate) fn extend(&self, ids: impl IntoIterator<Item = u64>, at: Instant) {
        let mut inner = lock(&self.inner);
        for id in ids {
            if inner.ids.len() < self.cap {
                inner.ids.push_back((id, at));
            } else {
                inner.overflowed = true;
            }
        }
    }

    /// Takes up to `n` ids, oldest first.
    pub(crate) fn take(&self, n: usize) -> Vec<(u64, Instant)> {
        let mut inner = lock(&self.inner);
        let n = inner.ids.len().min(n);
        inner.ids.drain(..n).collect()
    }

    /// Whether the backlog is empty but left ids out since the last refill: then it is time to
    /// ask the catalog for the unlabelled photos. Answers true once per overflow.
    pub(crate) fn needs_refill(&self) -> bool {
        let mut inner = lock(&self.inner);
        let refill = inner.ids.is_empty() && inner.overflowed;
        if refill {
            inner.overflowed = false;
        }
        refill
    }

    /// Ids held now.
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_past_the_bound_are_left_out_and_ask_for_one_refill_once_the_rest_is_done() {
        let backlog = Backlog::new(3);
        let now = Instant::now();
        backlog.extend(1..=5, now);
        assert_eq!(backlog.len(), 3);
        assert!(!backlog.needs_refill(), "ids are still held");
        let taken: Vec<u64> = backlog.take(2).into_iter().map(|(id, _)| id).collect();
        assert_eq!(taken, [1, 2]);
        assert_eq!(backlog.take(10).len(), 1);
        assert!(backlog.needs_refill());
        assert!(!backlog.needs_refill(), "one refill per overflow");
        backlog.extend([6], now);
        assert!(backlog.take(1).len() == 1 && !backlog.needs_refill());
    }
}
