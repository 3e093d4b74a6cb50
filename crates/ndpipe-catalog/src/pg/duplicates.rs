//! Duplicate finding's part of the catalog for the whole cluster: perceptual hashes (each node
//! writes its own photos'), exact-duplicate sets ([`DuplicateCatalog`]), and the SHA-256 lookup
//! of [`PhotoCatalog`](crate::PhotoCatalog), across every node.

use postgres::Client;

use super::error::db;
use super::photos::{PHOTO_COLUMNS, PHOTO_FROM, photo_from_row};
use super::truths::attach_truths;
use super::{PgCatalog, from_sql, sql_id, sql_ids};
use crate::{CatalogError, DuplicateCatalog, PhotoId, PhotoMeta, PhotoRecord};

/// Every node's photos whose original has SHA-256 `sha256`, oldest first (`photos_sha256`).
pub(super) fn photos_with_sha256(
    conn: &mut Client,
    sha256: &str,
) -> Result<Vec<PhotoRecord>, CatalogError> {
    let mut photos = conn
        .query(
            &format!(
                "SELECT {PHOTO_COLUMNS} FROM {PHOTO_FROM} WHERE p.sha256 = $1 \
                 ORDER BY p.created_ms, p.id"
            ),
            &[&sha256],
        )
        .map_err(db("find photos by SHA-256"))?
        .iter()
        .map(photo_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    attach_truths(conn, &mut photos)?;
    Ok(photos)
}

/// A photo id read back from a BIGINT column.
fn id_at(row: &postgres::Row, i: usize) -> Result<PhotoId, CatalogError> {
    from_sql(
        row.try_get::<_, i64>(i).map_err(db("read photo id"))?,
        "photo id",
    )
}

impl DuplicateCatalog for PgCatalog {
    fn photos_without_near_hash(
        &self,
        algorithm: &str,
        after: Option<PhotoId>,
        window: usize,
    ) -> Result<(Vec<PhotoId>, Option<PhotoId>), CatalogError> {
        let after = after.map(sql_id).transpose()?.unwrap_or(-1);
        let window = i64::try_from(window).unwrap_or(i64::MAX);
        let node = self.node();
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT p.id, h.photo_id IS NULL
                     FROM (SELECT id FROM photos WHERE node = $2 AND id > $3
                           ORDER BY id LIMIT $4) p
                     LEFT JOIN photo_near_hashes h ON h.photo_id = p.id AND h.algorithm = $1
                     ORDER BY p.id",
                    &[&algorithm, &node, &after, &window],
                )
                .map_err(db("find photos without a hash"))?
                .iter()
                .map(|row| {
                    let unhashed: bool =
                        row.try_get(1).map_err(db("find photos without a hash"))?;
                    Ok((id_at(row, 0)?, unhashed))
                })
                .collect::<Result<Vec<_>, CatalogError>>()?;
            Ok(crate::duplicates::unhashed_of(&rows))
        })
    }

    fn count_without_near_hash(&self, algorithm: &str) -> Result<u64, CatalogError> {
        self.with(|conn| {
            let row = conn
                .query_one(
                    "SELECT COUNT(*) FROM photos p LEFT JOIN photo_near_hashes h
                       ON h.photo_id = p.id AND h.algorithm = $1
                     WHERE h.photo_id IS NULL",
                    &[&algorithm],
                )
                .map_err(db("count photos without a hash"))?;
            let [n] = super::counts::<1>(&row, "photos without a hash")?;
            Ok(n)
        })
    }

    fn put_near_hashes(
        &self,
        algorithm: &str,
        rows: &[(PhotoId, u64)],
    ) -> Result<usize, CatalogError> {
        let ids = sql_ids(&rows.iter().map(|(id, _)| *id).collect::<Vec<_>>())?;
        let hashes: Vec<i64> = rows.iter().map(|(_, h)| h.cast_signed()).collect();
        self.with(|conn| {
            let written = conn
                .execute(
                    "INSERT INTO photo_near_hashes (photo_id, algorithm, hash)
                     SELECT r.id, $1::text, r.hash
                     FROM UNNEST($2::bigint[], $3::bigint[]) AS r (id, hash)
                     JOIN photos p ON p.id = r.id
                     ON CONFLICT (photo_id) DO UPDATE
                       SET algorithm = EXCLUDED.algorithm, hash = EXCLUDED.hash",
                    &[&algorithm, &ids, &hashes],
                )
                .map_err(db("write hashes"))?;
            Ok(usize::try_from(written).unwrap_or(usize::MAX))
        })
    }

    fn near_hashes(
        &self,
        algorithm: &str,
        min_side: u32,
    ) -> Result<Vec<(PhotoId, u64)>, CatalogError> {
        let min_side = i64::from(min_side);
        self.with(|conn| {
            conn.query(
                "SELECT h.photo_id, h.hash FROM photo_near_hashes h
                 JOIN photos p ON p.id = h.photo_id
                 WHERE h.algorithm = $1 AND p.width >= $2 AND p.height >= $2
                 ORDER BY h.photo_id",
                &[&algorithm, &min_side],
            )
            .map_err(db("read hashes"))?
            .iter()
            .map(|row| {
                let hash: i64 = row.try_get(1).map_err(db("read hashes"))?;
                Ok((id_at(row, 0)?, hash.cast_unsigned()))
            })
            .collect()
        })
    }

    fn exact_duplicate_sets(&self) -> Result<Vec<Vec<PhotoId>>, CatalogError> {
        self.with(|conn| {
            conn.query(
                "SELECT array_agg(id ORDER BY id) FROM photos GROUP BY sha256
                 HAVING COUNT(*) > 1 ORDER BY MIN(id)",
                &[],
            )
            .map_err(db("find photos with the same bytes"))?
            .iter()
            .map(|row| {
                let ids: Vec<i64> = row.try_get(0).map_err(db("read duplicate sets"))?;
                ids.into_iter().map(|id| from_sql(id, "photo id")).collect()
            })
            .collect()
        })
    }

    fn photo_metas(&self, ids: &[PhotoId]) -> Result<Vec<(PhotoId, PhotoMeta)>, CatalogError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = sql_ids(ids)?;
        self.with(|conn| {
            conn.query(
                &format!(
                    "SELECT {PHOTO_COLUMNS} FROM {PHOTO_FROM} WHERE p.id = ANY($1) \
                     ORDER BY p.id"
                ),
                &[&ids],
            )
            .map_err(db("read photos"))?
            .iter()
            .map(|row| photo_from_row(row).map(|p| (p.id, p.meta)))
            .collect()
        })
    }
}
