//! [`BlobCatalog`]: the copies of plain objects' files. As with photos, a copy counts when its
//! holder is registered; a removed node's copies are forgotten with it (`nodes.rs`).

use ndpipe_util::time::now_ms;

use super::error::db;
use super::{PgCatalog, counts};
use crate::{BlobCatalog, BlobCounts, BlobHolders, CatalogError};

impl BlobCatalog for PgCatalog {
    fn add_blob_copy(&self, name: &str) -> Result<bool, CatalogError> {
        let node = self.node();
        self.with(|conn| {
            let added = conn
                .execute(
                    "INSERT INTO blob_copies (blob, node, added_ms) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                    &[&name, &node, &now_ms()],
                )
                .map_err(db("record a plain object's copy"))?;
            Ok(added > 0)
        })
    }

    fn drop_blob_copy(&self, name: &str) -> Result<(), CatalogError> {
        let node = self.node();
        self.with(|conn| {
            conn.execute(
                "DELETE FROM blob_copies WHERE blob = $1 AND node = $2",
                &[&name, &node],
            )
            .map_err(db("forget a plain object's copy"))?;
            Ok(())
        })
    }

    fn blob_holders(&self, name: &str) -> Result<Vec<String>, CatalogError> {
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT b.node FROM blob_copies b JOIN nodes n ON n.name = b.node
                     WHERE b.blob = $1 ORDER BY b.node",
                    &[&name],
                )
                .map_err(db("find a plain object's copies"))?;
            rows.iter()
                .map(|r| r.try_get(0).map_err(db("read a plain object's copy")))
                .collect()
        })
    }

    fn referenced_blobs(&self, names: &[String]) -> Result<Vec<String>, CatalogError> {
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT DISTINCT blob FROM objects WHERE blob = ANY($1) ORDER BY blob",
                    &[&names],
                )
                .map_err(db("find the objects of files"))?;
            rows.iter()
                .map(|r| r.try_get(0).map_err(db("read an object's file")))
                .collect()
        })
    }

    fn held_blobs_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BlobHolders>, CatalogError> {
        let node = self.node();
        let (after, limit) = (after.unwrap_or(""), i64::from(limit));
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT o.blob, min(o.sha256), array_agg(DISTINCT b.node ORDER BY b.node)
                     FROM blob_copies mine
                     JOIN objects o ON o.blob = mine.blob
                     JOIN blob_copies b ON b.blob = mine.blob
                     JOIN nodes n ON n.name = b.node
                     WHERE mine.node = $1 AND mine.blob > $2
                     GROUP BY o.blob ORDER BY o.blob LIMIT $3",
                    &[&node, &after, &limit],
                )
                .map_err(db("list this node's plain objects"))?;
            rows.iter().map(holders_from_row).collect()
        })
    }

    fn blob_counts(&self, wanted: u32) -> Result<BlobCounts, CatalogError> {
        let wanted = i64::from(wanted);
        self.with(|conn| {
            let row = conn
                .query_one(
                    "SELECT count(*) FILTER (WHERE c >= $1),
                            count(*) FILTER (WHERE c > 0 AND c < $1),
                            count(*) FILTER (WHERE c = 0)
                     FROM (SELECT o.blob, count(DISTINCT b.node) AS c FROM objects o
                           LEFT JOIN blob_copies b ON b.blob = o.blob
                             AND b.node IN (SELECT name FROM nodes)
                           WHERE o.blob IS NOT NULL
                           GROUP BY o.blob) counts",
                    &[&wanted],
                )
                .map_err(db("count plain objects' copies"))?;
            let [at_target, under_replicated, lost] = counts(&row, "plain object count")?;
            Ok(BlobCounts {
                at_target,
                under_replicated,
                lost,
            })
        })
    }

    fn recorded_here(&self, names: &[String]) -> Result<Vec<String>, CatalogError> {
        let node = self.node();
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT blob FROM blob_copies WHERE node = $1 AND blob = ANY($2) ORDER BY blob",
                    &[&node, &names],
                )
                .map_err(db("find this node's recorded files"))?;
            rows.iter()
                .map(|r| r.try_get(0).map_err(db("read a recorded file")))
                .collect()
        })
    }

    fn under_replicated_blobs(
        &self,
        wanted: u32,
        limit: u32,
    ) -> Result<Vec<BlobHolders>, CatalogError> {
        let node = self.node();
        let (wanted, limit, now) = (i64::from(wanted), i64::from(limit), now_ms());
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT o.blob, min(o.sha256),
                            array_agg(DISTINCT b.node ORDER BY b.node)
                     FROM objects o
                     JOIN blob_copies b ON b.blob = o.blob
                     JOIN nodes n ON n.name = b.node
                     WHERE o.blob IS NOT NULL
                     GROUP BY o.blob
                     HAVING count(DISTINCT b.node) < $2
                        AND min(b.node) FILTER (WHERE n.lease_expires_ms > $4) = $1
                     ORDER BY o.blob LIMIT $3",
                    &[&node, &wanted, &limit, &now],
                )
                .map_err(db("find under-replicated plain objects"))?;
            rows.iter().map(holders_from_row).collect()
        })
    }
}

/// A row of (file, SHA-256, holders).
fn holders_from_row(row: &postgres::Row) -> Result<BlobHolders, CatalogError> {
    let op = "read a plain object's copies";
    Ok(BlobHolders {
        name: row.try_get(0).map_err(db(op))?,
        sha256: row.try_get(1).map_err(db(op))?,
        holders: row.try_get(2).map_err(db(op))?,
    })
}
