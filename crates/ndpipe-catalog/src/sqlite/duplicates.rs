//! Duplicate finding's part of the catalog: perceptual hashes and exact-duplicate sets
//! ([`DuplicateCatalog`]), and the SHA-256 lookup of [`PhotoCatalog`](crate::PhotoCatalog).

use rusqlite::{Connection, params};

use super::photos::{PHOTO_COLUMNS, photo_from_row};
use super::truths::attach_truths;
use super::{SqliteCatalog, sql_id};
use crate::{CatalogError, DuplicateCatalog, PhotoId, PhotoMeta, PhotoRecord};

/// The photos whose original has SHA-256 `sha256`, oldest first (the `photos_sha256` index).
pub(super) fn photos_with_sha256(
    conn: &Connection,
    sha256: &str,
) -> Result<Vec<PhotoRecord>, CatalogError> {
    let op = "find photos by SHA-256";
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {PHOTO_COLUMNS} FROM photos p WHERE p.sha256 = ?1 \
             ORDER BY p.created_ms, p.id"
        ))
        .map_err(CatalogError::db(op))?;
    let mut photos = stmt
        .query_map(params![sha256], photo_from_row)
        .map_err(CatalogError::db(op))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(CatalogError::db(op))?;
    attach_truths(conn, &mut photos)?;
    Ok(photos)
}

/// `ids` as the JSON array `json_each` reads.
fn json_ids(ids: &[PhotoId]) -> Result<String, CatalogError> {
    let ids = ids
        .iter()
        .map(|&id| sql_id(id))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(serde_json::Value::from(ids).to_string())
}

impl DuplicateCatalog for SqliteCatalog {
    fn photos_without_near_hash(
        &self,
        algorithm: &str,
        after: Option<PhotoId>,
        window: usize,
    ) -> Result<(Vec<PhotoId>, Option<PhotoId>), CatalogError> {
        let op = "find photos without a hash";
        let after = after.map(sql_id).transpose()?.unwrap_or(-1);
        let window = i64::try_from(window).unwrap_or(i64::MAX);
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT p.id, h.photo_id IS NULL
                     FROM (SELECT id FROM photos WHERE id > ?2 ORDER BY id LIMIT ?3) p
                     LEFT JOIN photo_near_hashes h ON h.photo_id = p.id AND h.algorithm = ?1
                     ORDER BY p.id",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map(params![algorithm, after, window], |r| {
                    Ok((r.get::<_, i64>(0)?.cast_unsigned(), r.get::<_, bool>(1)?))
                })
                .map_err(CatalogError::db(op))?;
            let rows: Vec<(PhotoId, bool)> = rows
                .collect::<Result<_, _>>()
                .map_err(CatalogError::db(op))?;
            Ok(crate::duplicates::unhashed_of(&rows))
        })
    }

    fn count_without_near_hash(&self, algorithm: &str) -> Result<u64, CatalogError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM photos p LEFT JOIN photo_near_hashes h
                   ON h.photo_id = p.id AND h.algorithm = ?1
                 WHERE h.photo_id IS NULL",
                params![algorithm],
                |r| r.get::<_, i64>(0).map(i64::cast_unsigned),
            )
            .map_err(CatalogError::db("count photos without a hash"))
        })
    }

    fn put_near_hashes(
        &self,
        algorithm: &str,
        rows: &[(PhotoId, u64)],
    ) -> Result<usize, CatalogError> {
        let op = "write hashes";
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db(op))?;
            let mut written = 0;
            {
                let mut stmt = tx
                    .prepare_cached(
                        "INSERT INTO photo_near_hashes (photo_id, algorithm, hash)
                         SELECT id, ?2, ?3 FROM photos WHERE id = ?1
                         ON CONFLICT (photo_id) DO UPDATE
                           SET algorithm = excluded.algorithm, hash = excluded.hash",
                    )
                    .map_err(CatalogError::db(op))?;
                for &(id, hash) in rows {
                    written += stmt
                        .execute(params![sql_id(id)?, algorithm, hash.cast_signed()])
                        .map_err(CatalogError::db(op))?;
                }
            }
            tx.commit().map_err(CatalogError::db(op))?;
            Ok(written)
        })
    }

    fn near_hashes(
        &self,
        algorithm: &str,
        min_side: u32,
    ) -> Result<Vec<(PhotoId, u64)>, CatalogError> {
        let op = "read hashes";
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT h.photo_id, h.hash FROM photo_near_hashes h
                     JOIN photos p ON p.id = h.photo_id
                     WHERE h.algorithm = ?1 AND p.width >= ?2 AND p.height >= ?2
                     ORDER BY h.photo_id",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map(params![algorithm, min_side], |r| {
                    Ok((
                        r.get::<_, i64>(0)?.cast_unsigned(),
                        r.get::<_, i64>(1)?.cast_unsigned(),
                    ))
                })
                .map_err(CatalogError::db(op))?;
            rows.collect::<Result<_, _>>().map_err(CatalogError::db(op))
        })
    }

    fn exact_duplicate_sets(&self) -> Result<Vec<Vec<PhotoId>>, CatalogError> {
        let op = "find photos with the same bytes";
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT p.sha256, p.id FROM photos p JOIN (
                       SELECT sha256 FROM photos GROUP BY sha256 HAVING COUNT(*) > 1
                     ) d ON d.sha256 = p.sha256 ORDER BY p.sha256, p.id",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.cast_unsigned()))
                })
                .map_err(CatalogError::db(op))?;
            let mut sets: Vec<(String, Vec<PhotoId>)> = Vec::new();
            for row in rows {
                let (sha, id) = row.map_err(CatalogError::db(op))?;
                match sets.last_mut() {
                    Some((last, ids)) if *last == sha => ids.push(id),
                    _ => sets.push((sha, vec![id])),
                }
            }
            Ok(sets.into_iter().map(|(_, ids)| ids).collect())
        })
    }

    fn photo_metas(&self, ids: &[PhotoId]) -> Result<Vec<(PhotoId, PhotoMeta)>, CatalogError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let op = "read photos";
        let ids = json_ids(ids)?;
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {PHOTO_COLUMNS} FROM photos p \
                     WHERE p.id IN (SELECT value FROM json_each(?1)) ORDER BY p.id"
                ))
                .map_err(CatalogError::db(op))?;
            stmt.query_map(params![ids], |r| photo_from_row(r).map(|p| (p.id, p.meta)))
                .map_err(CatalogError::db(op))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db(op))
        })
    }
}
