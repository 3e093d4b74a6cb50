//! The photos a full re-labelling has yet to read, shared with another thread: a rollout gives
//! photos off the end of the queue to a faster node while the pass reads from its front, so a
//! photo is either read here or given away, never both. Photos left to another node (copies of
//! photos whose primary is elsewhere) are never queued.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use ndpipe_util::sync::lock;

/// The queue of a re-labelling's photos not read yet, and the photos given away.
#[derive(Debug, Default)]
pub struct Pending(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<u64>,
    given: BTreeSet<u64>,
    given_now: u64,
    /// Photos another node answers for: not this pass's work.
    others: BTreeSet<u64>,
}

impl Pending {
    /// A queue that skips `given` (photos given away before, e.g. before a restart).
    pub fn with_given(given: BTreeSet<u64>) -> Self {
        Pending(Mutex::new(State {
            given,
            ..State::default()
        }))
    }

    /// This queue, leaving out `others` (copies of photos another node answers for).
    pub(crate) fn leaving_out(self, others: BTreeSet<u64>) -> Self {
        let Pending(state) = self;
        let mut s = state
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.others = others;
        Pending(Mutex::new(s))
    }

    /// The photos left out as another node's.
    pub(crate) fn left_out(&self) -> BTreeSet<u64> {
        lock(&self.0).others.clone()
    }

    /// Fills the queue with `ids` (ascending), less those given away and those left out.
    pub(crate) fn fill(&self, ids: Vec<u64>) {
        let mut s = lock(&self.0);
        let kept = ids
            .into_iter()
            .filter(|id| !s.given.contains(id) && !s.others.contains(id))
            .collect();
        s.queue = kept;
        s.given_now = 0;
    }

    /// Photos in the queue.
    pub(crate) fn len(&self) -> usize {
        lock(&self.0).queue.len()
    }

    /// The next photo to read.
    pub(crate) fn next(&self) -> Option<u64> {
        lock(&self.0).queue.pop_front()
    }

    /// Gives up to `n` photos off the end of the queue away, ascending; `keep` must record the
    /// whole given set durably first (it runs under the queue's lock, so the reader cannot take
    /// them meanwhile); when it fails, nothing is given.
    pub fn give<E>(
        &self,
        n: usize,
        keep: impl FnOnce(&BTreeSet<u64>) -> Result<(), E>,
    ) -> Result<Vec<u64>, E> {
        let mut s = lock(&self.0);
        let from = s.queue.len().saturating_sub(n);
        let ids: Vec<u64> = s.queue.range(from..).copied().collect();
        if ids.is_empty() {
            return Ok(ids);
        }
        let mut given = s.given.clone();
        given.extend(&ids);
        keep(&given)?;
        s.queue.truncate(from);
        s.given = given;
        s.given_now += ids.len() as u64;
        Ok(ids)
    }

    /// Every photo given away.
    pub fn given(&self) -> BTreeSet<u64> {
        lock(&self.0).given.clone()
    }

    /// Photos given away since the queue was last filled.
    pub fn given_now(&self) -> u64 {
        lock(&self.0).given_now
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::Pending;

    #[test]
    fn photos_go_either_to_the_reader_or_away() {
        let p = Pending::with_given(BTreeSet::from([3]));
        p.fill((1..=10).collect());
        assert_eq!(p.next(), Some(1));
        let given = p.give(3, |_| Ok::<_, ()>(())).unwrap();
        assert_eq!(given, [8, 9, 10]);
        assert_eq!(p.give(2, |_| Err("disk full")), Err("disk full"));
        let read: Vec<u64> = std::iter::from_fn(|| p.next()).collect();
        assert_eq!(read, [2, 4, 5, 6, 7], "3 was given before; 8..10 now");
        assert_eq!(p.given(), BTreeSet::from([3, 8, 9, 10]));
        assert_eq!(p.given_now(), 3);
        assert!(p.give(5, |_| Ok::<_, ()>(())).unwrap().is_empty());
    }

    #[test]
    fn photos_of_other_nodes_are_never_queued_nor_given() {
        let p = Pending::with_given(BTreeSet::from([2])).leaving_out(BTreeSet::from([4, 6]));
        p.fill((1..=7).collect());
        assert_eq!(p.len(), 4);
        assert_eq!(p.left_out(), BTreeSet::from([4, 6]));
        assert_eq!(p.give(1, |_| Ok::<_, ()>(())).unwrap(), [7]);
        let read: Vec<u64> = std::iter::from_fn(|| p.next()).collect();
        assert_eq!(read, [1, 3, 5]);
    }
}
