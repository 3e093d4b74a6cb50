//! Ground truth, per task, of this node's photos.

use postgres::error::SqlState;
use postgres::{Client, Transaction};

use super::error::db;
use super::{PgCatalog, from_sql, sql_id, sql_ids};
use crate::{
    CatalogError, GroundTruth, PhotoId, PhotoRecord, Split, TaskName, TaskTruth, TruthCatalog,
};

/// Maps a failed ground-truth write: a foreign key on the task means the task is unknown.
fn truth_error(task: &TaskName) -> impl FnOnce(postgres::Error) -> CatalogError + '_ {
    move |e| {
        if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) {
            CatalogError::NotFound {
                what: format!("task {task}"),
            }
        } else {
            db("write ground truth")(e)
        }
    }
}

/// Writes (or replaces) the ground truth of photo `id` in `truth`'s task.
pub(super) fn write_ground_truth(
    tx: &mut Transaction<'_>,
    id: i64,
    truth: &GroundTruth,
) -> Result<(), CatalogError> {
    tx.execute(
        "INSERT INTO ground_truth (photo_id, task, label, split) VALUES ($1, $2, $3, $4)
         ON CONFLICT (photo_id, task) DO UPDATE SET label = EXCLUDED.label,
           split = EXCLUDED.split",
        &[
            &id,
            &truth.task.as_str(),
            &truth.label,
            &truth.split.as_str(),
        ],
    )
    .map_err(truth_error(&truth.task))?;
    Ok(())
}

/// Fills in every photo's ground truths (and, as clients of before tasks read it, the default
/// task's as `meta.ground_truth`) with one query.
pub(super) fn attach_truths(
    conn: &mut Client,
    photos: &mut [PhotoRecord],
) -> Result<(), CatalogError> {
    let op = "read ground truth";
    if photos.is_empty() {
        return Ok(());
    }
    let ids = sql_ids(&photos.iter().map(|p| p.id).collect::<Vec<_>>())?;
    let rows = conn
        .query(
            "SELECT photo_id, task, label, split FROM ground_truth WHERE photo_id = ANY($1)
             ORDER BY photo_id, task",
            &[&ids],
        )
        .map_err(db(op))?;
    for row in &rows {
        let id: PhotoId = from_sql(row.try_get(0).map_err(db(op))?, "photo id")?;
        let task: String = row.try_get(1).map_err(db(op))?;
        let split: String = row.try_get(3).map_err(db(op))?;
        let truth = GroundTruth {
            task: task.parse()?,
            label: row.try_get(2).map_err(db(op))?,
            split: split.parse()?,
        };
        if let Some(photo) = photos.iter_mut().find(|p| p.id == id) {
            photo.ground_truths.push(truth);
        }
    }
    for photo in photos {
        photo.meta.ground_truth = photo
            .ground_truths
            .iter()
            .find(|t| t.task == *TaskName::DEFAULT)
            .cloned();
    }
    Ok(())
}

/// The ground truth of `task` of the photos whose primary is `node`, in id order.
pub(super) fn truths_of(
    catalog: &PgCatalog,
    node: &str,
    task: &TaskName,
) -> Result<Vec<TaskTruth>, CatalogError> {
    let op = "list ground truth";
    catalog.with(|conn| {
        conn.query(
            "SELECT g.photo_id, g.label, g.split, p.sha256 FROM ground_truth g
             JOIN photos p ON p.id = g.photo_id
             WHERE p.node = $1 AND g.task = $2 ORDER BY g.photo_id",
            &[&node, &task.as_str()],
        )
        .map_err(db(op))?
        .iter()
        .map(|r| {
            let id: i64 = r.try_get(0).map_err(db(op))?;
            let split: String = r.try_get(2).map_err(db(op))?;
            Ok(TaskTruth {
                id: from_sql(id, "photo id")?,
                label: r.try_get(1).map_err(db(op))?,
                split: split.parse()?,
                sha256: r.try_get(3).map_err(db(op))?,
            })
        })
        .collect()
    })
}

/// Locks this node's photo `id` until the transaction ends; whether it has it.
fn lock_own_photo(tx: &mut Transaction<'_>, id: i64, node: &str) -> Result<bool, CatalogError> {
    Ok(tx
        .query_opt(
            "SELECT 1 FROM photos WHERE id = $1 AND node = $2 FOR NO KEY UPDATE",
            &[&id, &node],
        )
        .map_err(db("find photo"))?
        .is_some())
}

impl TruthCatalog for PgCatalog {
    fn labelled(
        &self,
        task: &TaskName,
        split: Split,
    ) -> Result<Vec<(PhotoId, String)>, CatalogError> {
        let op = "list labelled photos";
        self.with(|conn| {
            conn.query(
                "SELECT g.photo_id, g.label FROM ground_truth g JOIN photos p ON p.id = g.photo_id
                 WHERE p.node = $1 AND g.task = $2 AND g.split = $3 ORDER BY g.photo_id",
                &[&self.node(), &task.as_str(), &split.as_str()],
            )
            .map_err(db(op))?
            .iter()
            .map(|r| {
                let id: i64 = r.try_get(0).map_err(db(op))?;
                Ok((from_sql(id, "photo id")?, r.try_get(1).map_err(db(op))?))
            })
            .collect()
        })
    }

    fn ground_truths(&self, task: &TaskName) -> Result<Vec<TaskTruth>, CatalogError> {
        truths_of(self, self.node(), task)
    }

    fn set_ground_truth(&self, id: PhotoId, truth: &GroundTruth) -> Result<(), CatalogError> {
        let sid = sql_id(id)?;
        self.tx("write ground truth", |tx| {
            if !lock_own_photo(tx, sid, &self.node)? {
                return Err(CatalogError::NotFound {
                    what: format!("photo {id}"),
                });
            }
            write_ground_truth(tx, sid, truth)
        })
    }

    fn set_ground_truths(
        &self,
        rows: &[(PhotoId, GroundTruth)],
    ) -> Result<Vec<PhotoId>, CatalogError> {
        self.tx("write ground truth", |tx| {
            let mut written = Vec::with_capacity(rows.len());
            for (id, truth) in rows {
                let sid = sql_id(*id)?;
                if lock_own_photo(tx, sid, &self.node)? {
                    write_ground_truth(tx, sid, truth)?;
                    written.push(*id);
                }
            }
            Ok(written)
        })
    }

    fn clear_ground_truth(&self, id: PhotoId, task: &TaskName) -> Result<bool, CatalogError> {
        let sid = sql_id(id)?;
        self.tx("clear ground truth", |tx| {
            if !lock_own_photo(tx, sid, &self.node)? {
                return Ok(false);
            }
            let n = tx
                .execute(
                    "DELETE FROM ground_truth WHERE photo_id = $1 AND task = $2",
                    &[&sid, &task.as_str()],
                )
                .map_err(db("clear ground truth"))?;
            Ok(n > 0)
        })
    }
}
