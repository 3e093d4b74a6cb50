//! Photos, predicted labels and label search.

use std::collections::HashSet;

use rusqlite::{OptionalExtension, params};

use super::truths::{attach_truths, write_ground_truth};
use super::{SqliteCatalog, sql_id};
use crate::label_terms::{label_terms, query_terms};
use crate::{
    CatalogError, OTHER_CLASS, PhotoCatalog, PhotoId, PhotoMeta, PhotoRecord, Prediction, SearchHit,
};

pub(super) const PHOTO_COLUMNS: &str = "p.id, p.sha256, p.bytes, p.width, p.height, p.content_type, \
                             p.created_ms";

pub(super) fn photo_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<PhotoRecord> {
    Ok(PhotoRecord::new(
        row.get::<_, i64>(0)?.cast_unsigned(),
        PhotoMeta {
            sha256: row.get(1)?,
            bytes: row.get::<_, i64>(2)?.cast_unsigned(),
            width: row.get(3)?,
            height: row.get(4)?,
            content_type: row.get(5)?,
            created_ms: row.get(6)?,
            ground_truth: None,
        },
    ))
}

/// Inserts one prediction and its search terms (`label_terms`); a missing photo is `NotFound`.
fn insert_prediction(
    tx: &rusqlite::Transaction<'_>,
    id: i64,
    model_version: &str,
    rank: usize,
    prediction: &Prediction,
) -> Result<(), CatalogError> {
    let (rank, score) = (rank as i64, f64::from(prediction.score));
    tx.prepare_cached(
        "INSERT INTO predictions (photo_id, model_version, rank, label, score)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut s| s.execute(params![id, model_version, rank, prediction.label, score]))
    .map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            CatalogError::NotFound {
                what: format!("photo {id}"),
            }
        }
        e => CatalogError::db("write predictions")(e),
    })?;
    let mut term_row = tx
        .prepare_cached(
            "INSERT INTO photo_labels (model_version, kind, term, score, photo_id, rank)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(CatalogError::db("index labels"))?;
    for (kind, term) in label_terms(&prediction.label) {
        term_row
            .execute(params![model_version, kind, term, score, id, rank])
            .map_err(CatalogError::db("index labels"))?;
    }
    Ok(())
}

impl PhotoCatalog for SqliteCatalog {
    fn upsert_photo(&self, photo: &PhotoRecord) -> Result<(), CatalogError> {
        let id = sql_id(photo.id)?;
        let photo = &photo.meta;
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            tx.execute(
                "INSERT INTO photos (id, sha256, bytes, width, height, content_type, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(id) DO UPDATE SET sha256 = excluded.sha256, bytes = excluded.bytes,
                   width = excluded.width, height = excluded.height,
                   content_type = excluded.content_type, created_ms = excluded.created_ms",
                params![
                    id,
                    photo.sha256,
                    photo.bytes as i64,
                    photo.width,
                    photo.height,
                    photo.content_type,
                    photo.created_ms
                ],
            )
            .map_err(CatalogError::db("upsert photo"))?;
            if let Some(truth) = &photo.ground_truth {
                write_ground_truth(&tx, id, truth)?;
            }
            tx.commit().map_err(CatalogError::db("commit photo"))
        })
    }

    fn delete_photo(&self, id: PhotoId) -> Result<bool, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            let n = conn
                .execute("DELETE FROM photos WHERE id = ?1", params![id])
                .map_err(CatalogError::db("delete photo"))?;
            Ok(n > 0)
        })
    }

    fn photo(&self, id: PhotoId) -> Result<Option<PhotoRecord>, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            let photo = conn
                .query_row(
                    &format!("SELECT {PHOTO_COLUMNS} FROM photos p WHERE p.id = ?1"),
                    params![id],
                    photo_from_row,
                )
                .optional()
                .map_err(CatalogError::db("read photo"))?;
            let mut photos: Vec<PhotoRecord> = photo.into_iter().collect();
            attach_truths(conn, &mut photos)?;
            Ok(photos.pop())
        })
    }

    fn existing_photo_ids(&self, ids: &[PhotoId]) -> Result<HashSet<PhotoId>, CatalogError> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        let ids = ids
            .iter()
            .map(|&id| sql_id(id))
            .collect::<Result<Vec<_>, _>>()?;
        let ids = serde_json::Value::from(ids).to_string();
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id FROM photos WHERE id IN (SELECT value FROM json_each(?1))",
                )
                .map_err(CatalogError::db("find photos"))?;
            let rows = stmt
                .query_map(params![ids], |row| {
                    row.get::<_, i64>(0).map(i64::cast_unsigned)
                })
                .map_err(CatalogError::db("find photos"))?;
            rows.collect::<Result<HashSet<_>, _>>()
                .map_err(CatalogError::db("find photos"))
        })
    }

    fn list_photos(
        &self,
        after: Option<PhotoId>,
        limit: usize,
    ) -> Result<Vec<PhotoRecord>, CatalogError> {
        let after = match after {
            Some(a) => sql_id(a)?,
            None => -1,
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(|conn| {
            let mut photos = {
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT {PHOTO_COLUMNS} FROM photos p \
                         WHERE p.id > ?1 ORDER BY p.id LIMIT ?2"
                    ))
                    .map_err(CatalogError::db("list photos"))?;
                let rows = stmt
                    .query_map(params![after, limit], photo_from_row)
                    .map_err(CatalogError::db("list photos"))?;
                rows.collect::<Result<Vec<_>, _>>()
                    .map_err(CatalogError::db("list photos"))?
            };
            attach_truths(conn, &mut photos)?;
            Ok(photos)
        })
    }

    fn photos_with_sha256(&self, sha256: &str) -> Result<Vec<PhotoRecord>, CatalogError> {
        self.with(|conn| super::duplicates::photos_with_sha256(conn, sha256))
    }

    fn count_photos(&self) -> Result<u64, CatalogError> {
        self.with(|conn| {
            conn.query_row("SELECT COUNT(*) FROM photos", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(CatalogError::db("count photos"))
        })
    }

    fn put_predictions(
        &self,
        id: PhotoId,
        model_version: &str,
        labels: &[Prediction],
    ) -> Result<(), CatalogError> {
        let sid = sql_id(id)?;
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            tx.execute(
                "DELETE FROM predictions WHERE photo_id = ?1 AND model_version = ?2",
                params![sid, model_version],
            )
            .map_err(CatalogError::db("clear predictions"))?;
            for (rank, p) in labels.iter().enumerate() {
                insert_prediction(&tx, sid, model_version, rank, p)?;
            }
            tx.commit().map_err(CatalogError::db("commit predictions"))
        })
    }

    fn put_predictions_many(
        &self,
        model_version: &str,
        rows: &[(PhotoId, Vec<Prediction>)],
    ) -> Result<usize, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let mut written = 0;
            {
                let mut exists = tx
                    .prepare_cached("SELECT EXISTS(SELECT 1 FROM photos WHERE id = ?1)")
                    .map_err(CatalogError::db("write predictions"))?;
                let mut clear = tx
                    .prepare_cached(
                        "DELETE FROM predictions WHERE photo_id = ?1 AND model_version = ?2",
                    )
                    .map_err(CatalogError::db("write predictions"))?;
                for (id, labels) in rows {
                    let sid = sql_id(*id)?;
                    let present: bool = exists
                        .query_row(params![sid], |r| r.get(0))
                        .map_err(CatalogError::db("write predictions"))?;
                    if !present {
                        continue;
                    }
                    clear
                        .execute(params![sid, model_version])
                        .map_err(CatalogError::db("write predictions"))?;
                    for (rank, p) in labels.iter().enumerate() {
                        insert_prediction(&tx, sid, model_version, rank, p)?;
                    }
                    written += 1;
                }
            }
            tx.commit()
                .map_err(CatalogError::db("commit predictions"))?;
            Ok(written)
        })
    }

    fn unlabelled(&self, model_version: &str) -> Result<Vec<PhotoId>, CatalogError> {
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id FROM photos WHERE id NOT IN
                       (SELECT photo_id FROM predictions WHERE model_version = ?1 AND rank = 0)
                     ORDER BY id",
                )
                .map_err(CatalogError::db("list unlabelled photos"))?;
            let rows = stmt
                .query_map(params![model_version], |r| Ok(r.get::<_, i64>(0)? as u64))
                .map_err(CatalogError::db("list unlabelled photos"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("list unlabelled photos"))
        })
    }

    fn label_counts(&self, model_version: &str) -> Result<(u64, u64), CatalogError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT COUNT(*), COALESCE(SUM(label = ?2), 0) FROM predictions
                 WHERE model_version = ?1 AND rank = 0",
                params![model_version, OTHER_CLASS],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?.cast_unsigned(),
                        r.get::<_, i64>(1)?.cast_unsigned(),
                    ))
                },
            )
            .map_err(CatalogError::db("count labels"))
        })
    }

    fn predictions(&self, id: PhotoId) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError> {
        let sid = sql_id(id)?;
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT model_version, label, score FROM predictions
                     WHERE photo_id = ?1 ORDER BY model_version, rank",
                )
                .map_err(CatalogError::db("read predictions"))?;
            let rows = stmt
                .query_map(params![sid], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, f64>(2)?,
                    ))
                })
                .map_err(CatalogError::db("read predictions"))?;
            let mut out: Vec<(String, Vec<Prediction>)> = Vec::new();
            for row in rows {
                let (version, label, score) = row.map_err(CatalogError::db("read predictions"))?;
                let prediction = Prediction {
                    label,
                    score: score as f32,
                };
                match out.last_mut() {
                    Some((v, list)) if *v == version => list.push(prediction),
                    _ => out.push((version, vec![prediction])),
                }
            }
            Ok(out)
        })
    }

    fn search(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<SearchHit>, CatalogError> {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let [(whole, exact), (name, folded)] = query_terms(label);
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(SEARCH)
                .map_err(CatalogError::db("search"))?;
            let rows = stmt
                .query_map(
                    params![model_version, whole, exact, name, folded, limit, offset],
                    |r| {
                        Ok(SearchHit {
                            id: r.get::<_, i64>(0)? as u64,
                            label: r.get(1)?,
                            score: r.get::<_, f64>(2)? as f32,
                            rank: r.get::<_, i64>(3)? as u32,
                        })
                    },
                )
                .map_err(CatalogError::db("search"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("search"))
        })
    }
}

/// A search: the page of the two index ranges (the whole label `?3`, a class name `?5`), merged
/// in score order, then each hit's label; `pub(super)` for the test of its query plan.
pub(super) const SEARCH: &str = "SELECT l.photo_id, pr.label, l.score, l.rank FROM (
       SELECT photo_id, rank, score FROM photo_labels
       WHERE model_version = ?1 AND kind = ?2 AND term = ?3
       UNION ALL
       SELECT photo_id, rank, score FROM photo_labels
       WHERE model_version = ?1 AND kind = ?4 AND term = ?5
       ORDER BY score DESC, photo_id, rank LIMIT ?6 OFFSET ?7) l
     JOIN predictions pr
       ON pr.photo_id = l.photo_id AND pr.model_version = ?1 AND pr.rank = l.rank
     ORDER BY l.score DESC, l.photo_id, l.rank";
