//! Photo ids that are unique across the cluster: each node takes its ids from blocks that the
//! shared catalog reserves for it, above every id reserved or stored before.

use std::ops::Range;

use ndpipe_util::time::now_ms;

use super::error::db;
use super::{PgCatalog, from_sql};
use crate::CatalogError;

/// Hands out blocks of photo ids that no other node of the cluster uses.
///
/// A node numbers its photos from its current block and reserves the next one when the block is
/// spent; after a restart it finds its current block among [`photo_id_blocks`](Self::photo_id_blocks).
pub trait PhotoIdBlocks: Send + Sync {
    /// Reserves `n` consecutive ids for this node, above every id reserved or stored so far.
    /// Fails with [`CatalogError::Invalid`] for `n == 0` or when ids would pass `i64::MAX`.
    fn reserve_photo_ids(&self, n: u64) -> Result<Range<u64>, CatalogError>;

    /// The blocks reserved for this node, in id order.
    fn photo_id_blocks(&self) -> Result<Vec<Range<u64>>, CatalogError>;
}

impl PhotoIdBlocks for PgCatalog {
    fn reserve_photo_ids(&self, n: u64) -> Result<Range<u64>, CatalogError> {
        let count = i64::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| CatalogError::Invalid(format!("cannot reserve {n} photo ids")))?;
        self.tx("reserve photo ids", |tx| {
            tx.batch_execute("LOCK TABLE photo_id_blocks IN EXCLUSIVE MODE")
                .map_err(db("lock photo id blocks"))?;
            let first: i64 = tx
                .query_one(
                    "SELECT GREATEST(1, (SELECT MAX(end_id) FROM photo_id_blocks),
                                        (SELECT MAX(id) FROM photos) + 1)",
                    &[],
                )
                .and_then(|r| r.try_get(0))
                .map_err(db("find free photo ids"))?;
            let end = first.checked_add(count).ok_or_else(|| {
                CatalogError::Invalid(format!("no {n} photo ids left above {first}"))
            })?;
            tx.execute(
                "INSERT INTO photo_id_blocks (node, first_id, end_id, reserved_ms)
                 VALUES ($1, $2, $3, $4)",
                &[&self.node(), &first, &end, &now_ms()],
            )
            .map_err(db("reserve photo ids"))?;
            Ok(from_sql(first, "photo id")?..from_sql(end, "photo id")?)
        })
    }

    fn photo_id_blocks(&self) -> Result<Vec<Range<u64>>, CatalogError> {
        let op = "list photo id blocks";
        self.with(|conn| {
            conn.query(
                "SELECT first_id, end_id FROM photo_id_blocks WHERE node = $1 ORDER BY first_id",
                &[&self.node()],
            )
            .map_err(db(op))?
            .iter()
            .map(|r| {
                let (first, end): (i64, i64) =
                    (r.try_get(0).map_err(db(op))?, r.try_get(1).map_err(db(op))?);
                Ok(from_sql(first, "photo id")?..from_sql(end, "photo id")?)
            })
            .collect()
        })
    }
}
