//! Ground truth, per task.

use rusqlite::{Connection, Transaction, params};

use super::{SqliteCatalog, sql_id};
use crate::{
    CatalogError, GroundTruth, PhotoId, PhotoRecord, Split, TaskName, TaskTruth, TruthCatalog,
};

/// Reads a split or a task name stored in column `i`.
fn parsed<T: std::str::FromStr<Err = CatalogError>>(
    row: &rusqlite::Row<'_>,
    i: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    text.parse().map_err(|e: CatalogError| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
    })
}

/// Whether foreign key `e` names a row that is not there: the task (the photo's existence is
/// checked before).
fn unknown_task(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

/// Writes (or replaces) the ground truth of photo `id` in `truth`'s task.
pub(super) fn write_ground_truth(
    tx: &Transaction<'_>,
    id: i64,
    truth: &GroundTruth,
) -> Result<(), CatalogError> {
    tx.prepare_cached(
        "INSERT INTO ground_truth (photo_id, task, label, split) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (photo_id, task) DO UPDATE SET label = excluded.label, split = excluded.split",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            truth.task.as_str(),
            truth.label,
            truth.split.as_str()
        ])
    })
    .map_err(|e| {
        if unknown_task(&e) {
            CatalogError::NotFound {
                what: format!("task {}", truth.task),
            }
        } else {
            CatalogError::db("write ground truth")(e)
        }
    })?;
    Ok(())
}

/// Fills in every photo's ground truths (and, as clients of before tasks read it, the default
/// task's as `meta.ground_truth`) with one query per photo.
pub(super) fn attach_truths(
    conn: &Connection,
    photos: &mut [PhotoRecord],
) -> Result<(), CatalogError> {
    let op = "read ground truth";
    let mut stmt = conn
        .prepare_cached(
            "SELECT task, label, split FROM ground_truth WHERE photo_id = ?1 ORDER BY task",
        )
        .map_err(CatalogError::db(op))?;
    for photo in photos {
        let rows = stmt
            .query_map(params![sql_id(photo.id)?], |r| {
                Ok(GroundTruth {
                    task: parsed(r, 0)?,
                    label: r.get(1)?,
                    split: parsed(r, 2)?,
                })
            })
            .map_err(CatalogError::db(op))?;
        photo.ground_truths = rows
            .collect::<Result<Vec<_>, _>>()
            .map_err(CatalogError::db(op))?;
        photo.meta.ground_truth = photo
            .ground_truths
            .iter()
            .find(|t| t.task == *TaskName::DEFAULT)
            .cloned();
    }
    Ok(())
}

fn photo_exists(tx: &Transaction<'_>, id: i64) -> Result<bool, CatalogError> {
    tx.prepare_cached("SELECT EXISTS(SELECT 1 FROM photos WHERE id = ?1)")
        .and_then(|mut s| s.query_row(params![id], |r| r.get(0)))
        .map_err(CatalogError::db("find photo"))
}

impl TruthCatalog for SqliteCatalog {
    fn labelled(
        &self,
        task: &TaskName,
        split: Split,
    ) -> Result<Vec<(PhotoId, String)>, CatalogError> {
        let op = "list labelled photos";
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT photo_id, label FROM ground_truth WHERE task = ?1 AND split = ?2
                     ORDER BY photo_id",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map(params![task.as_str(), split.as_str()], |r| {
                    Ok((r.get::<_, i64>(0)?.cast_unsigned(), r.get::<_, String>(1)?))
                })
                .map_err(CatalogError::db(op))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db(op))
        })
    }

    fn ground_truths(&self, task: &TaskName) -> Result<Vec<TaskTruth>, CatalogError> {
        let op = "list ground truth";
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT g.photo_id, g.label, g.split, p.sha256
                     FROM ground_truth g JOIN photos p ON p.id = g.photo_id
                     WHERE g.task = ?1 ORDER BY g.photo_id",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map(params![task.as_str()], |r| {
                    Ok(TaskTruth {
                        id: r.get::<_, i64>(0)?.cast_unsigned(),
                        label: r.get(1)?,
                        split: parsed(r, 2)?,
                        sha256: r.get(3)?,
                    })
                })
                .map_err(CatalogError::db(op))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db(op))
        })
    }

    fn set_ground_truth(&self, id: PhotoId, truth: &GroundTruth) -> Result<(), CatalogError> {
        let sid = sql_id(id)?;
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            if !photo_exists(&tx, sid)? {
                return Err(CatalogError::NotFound {
                    what: format!("photo {id}"),
                });
            }
            write_ground_truth(&tx, sid, truth)?;
            tx.commit().map_err(CatalogError::db("commit ground truth"))
        })
    }

    fn set_ground_truths(
        &self,
        rows: &[(PhotoId, GroundTruth)],
    ) -> Result<Vec<PhotoId>, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let mut written = Vec::with_capacity(rows.len());
            for (id, truth) in rows {
                let sid = sql_id(*id)?;
                if photo_exists(&tx, sid)? {
                    write_ground_truth(&tx, sid, truth)?;
                    written.push(*id);
                }
            }
            tx.commit()
                .map_err(CatalogError::db("commit ground truth"))?;
            Ok(written)
        })
    }

    fn clear_ground_truth(&self, id: PhotoId, task: &TaskName) -> Result<bool, CatalogError> {
        let sid = sql_id(id)?;
        self.with(|conn| {
            let removed = conn
                .prepare_cached("DELETE FROM ground_truth WHERE photo_id = ?1 AND task = ?2")
                .and_then(|mut s| s.execute(params![sid, task.as_str()]))
                .map_err(CatalogError::db("clear ground truth"))?;
            Ok(removed > 0)
        })
    }
}
