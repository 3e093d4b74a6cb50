//! Where the writer takes new photo ids from: the store's own counter, or, when many nodes share
//! one catalog, blocks of ids that the catalog reserves for this node alone.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use ndpipe_catalog::PhotoIdBlocks;

use crate::storage::StoreError;

/// Ids reserved at once from a shared catalog: a node asks again after this many uploads.
pub(crate) const ID_BLOCK: u64 = 1 << 16;

/// How a store numbers its photos.
#[derive(Clone, Default)]
pub enum PhotoIds {
    /// From its own counter (one node, its own catalog).
    #[default]
    Own,
    /// From blocks that a catalog shared with other nodes reserves for this node, so that ids
    /// are unique across the cluster.
    Blocks(Arc<dyn PhotoIdBlocks>),
}

impl fmt::Debug for PhotoIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PhotoIds::Own => "Own",
            PhotoIds::Blocks(_) => "Blocks",
        })
    }
}

/// The next id to give and, with blocks, where the current block ends.
#[derive(Clone)]
pub(super) struct IdAllocator {
    next: u64,
    /// End of the current block (`None`: unbounded, the store's own counter).
    end: Option<u64>,
    blocks: Option<Arc<dyn PhotoIdBlocks>>,
}

impl IdAllocator {
    /// Continues from `next` (the store's recovered counter): on its own, or within this node's
    /// block that holds `next`. With no such block, the first id taken reserves a new one.
    pub(super) fn new(next: u64, ids: PhotoIds) -> Result<Self, StoreError> {
        let PhotoIds::Blocks(blocks) = ids else {
            return Ok(IdAllocator {
                next,
                end: None,
                blocks: None,
            });
        };
        let current = blocks
            .photo_id_blocks()
            .map_err(catalog_failed)?
            .into_iter()
            .find(|b| b.contains(&next));
        Ok(IdAllocator {
            next,
            end: Some(current.map_or(next, |b| b.end)),
            blocks: Some(blocks),
        })
    }

    /// The id the next put takes (or passes, when its block is spent): what the index keeps.
    pub(super) fn peek(&self) -> u64 {
        self.next
    }

    /// A new id, reserving a block first when the current one is spent.
    pub(super) fn take(&mut self) -> Result<u64, StoreError> {
        if let (Some(end), Some(blocks)) = (self.end, &self.blocks)
            && self.next >= end
        {
            let block = blocks.reserve_photo_ids(ID_BLOCK).map_err(catalog_failed)?;
            self.enter(block)?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }

    fn enter(&mut self, block: Range<u64>) -> Result<(), StoreError> {
        if block.start < self.next {
            return Err(StoreError::NoPhotoId {
                reason: format!(
                    "the catalog reserved photo ids {}..{} below this store's next id {}; \
                     were photos stored here before the store joined the shared catalog?",
                    block.start, block.end, self.next
                ),
            });
        }
        self.next = block.start;
        self.end = Some(block.end);
        Ok(())
    }
}

fn catalog_failed(e: ndpipe_catalog::CatalogError) -> StoreError {
    StoreError::NoPhotoId {
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ndpipe_catalog::CatalogError;

    use super::*;

    /// Blocks of 3 ids from `first`, then above each other.
    struct FakeBlocks {
        reserved: Mutex<Vec<Range<u64>>>,
        fail: bool,
    }

    impl PhotoIdBlocks for FakeBlocks {
        fn reserve_photo_ids(&self, _n: u64) -> Result<Range<u64>, CatalogError> {
            if self.fail {
                return Err(CatalogError::Invalid("down".into()));
            }
            let mut reserved = self.reserved.lock().unwrap();
            let start = reserved.last().map_or(100, |b| b.end + 10);
            reserved.push(start..start + 3);
            Ok(start..start + 3)
        }

        fn photo_id_blocks(&self) -> Result<Vec<Range<u64>>, CatalogError> {
            Ok(self.reserved.lock().unwrap().clone())
        }
    }

    fn blocks(reserved: Vec<Range<u64>>, fail: bool) -> Arc<FakeBlocks> {
        Arc::new(FakeBlocks {
            reserved: Mutex::new(reserved),
            fail,
        })
    }

    #[test]
    fn own_ids_count_up() {
        let mut ids = IdAllocator::new(7, PhotoIds::Own).unwrap();
        assert_eq!((ids.take().unwrap(), ids.take().unwrap()), (7, 8));
        assert_eq!(ids.peek(), 9);
    }

    #[test]
    fn blocks_are_reserved_when_spent_and_resumed_after_a_restart() {
        let source = blocks(vec![], false);
        let mut ids = IdAllocator::new(1, PhotoIds::Blocks(source.clone())).unwrap();
        let taken: Vec<u64> = (0..5).map(|_| ids.take().unwrap()).collect();
        assert_eq!(taken, [100, 101, 102, 113, 114]);
        let mut again = IdAllocator::new(ids.peek(), PhotoIds::Blocks(source)).unwrap();
        assert_eq!(again.take().unwrap(), 115);
        assert_eq!(again.take().unwrap(), 126, "the block ends at 116");
    }

    #[test]
    fn a_block_below_the_stores_ids_and_a_catalog_that_is_down_are_errors() {
        let mut ids = IdAllocator::new(500, PhotoIds::Blocks(blocks(vec![], false))).unwrap();
        assert!(
            matches!(ids.take(), Err(StoreError::NoPhotoId { reason }) if reason.contains("below"))
        );
        let mut down = IdAllocator::new(1, PhotoIds::Blocks(blocks(vec![], true))).unwrap();
        assert!(
            matches!(down.take(), Err(StoreError::NoPhotoId { reason }) if reason.contains("down"))
        );
        assert_eq!(down.peek(), 1, "a failed take gives no id away");
    }
}
