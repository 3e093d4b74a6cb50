//! Photos, predicted labels and label search, as one node sees them, and the search across every
//! node of the cluster.

use std::collections::{BTreeMap, HashSet};

use ndpipe_util::time::now_ms;
use postgres::{Row, Transaction};

use super::error::db;
use super::truths::{attach_truths, write_ground_truth};
use super::{PgCatalog, counts, from_sql, sql_id, sql_ids};
use crate::label_terms::label_terms;
use crate::{
    CatalogError, NodeHit, OTHER_CLASS, PhotoCatalog, PhotoId, PhotoMeta, PhotoRecord, Prediction,
    SearchHit,
};

pub(super) const PHOTO_COLUMNS: &str = "p.id, p.sha256, p.bytes, p.width, p.height, p.content_type, \
                             p.created_ms";
pub(super) const PHOTO_FROM: &str = "photos p";

pub(super) fn photo_from_row(row: &Row) -> Result<PhotoRecord, CatalogError> {
    let int = |i: usize| row.try_get::<_, i64>(i).map_err(db("read photo"));
    let text = |i: usize| row.try_get::<_, String>(i).map_err(db("read photo"));
    Ok(PhotoRecord::new(
        from_sql(int(0)?, "photo id")?,
        PhotoMeta {
            sha256: text(1)?,
            bytes: from_sql(int(2)?, "photo size")?,
            width: from_sql(int(3)?, "photo width")?,
            height: from_sql(int(4)?, "photo height")?,
            content_type: text(5)?,
            created_ms: int(6)?,
            ground_truth: None,
        },
    ))
}

/// Locks the node's photo `id` against deletion and other writers of its labels until the
/// transaction ends. Returns whether the node has it.
fn lock_photo(tx: &mut Transaction<'_>, id: i64, node: &str) -> Result<bool, CatalogError> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM photos WHERE id = $1 AND node = $2 FOR NO KEY UPDATE",
            &[&id, &node],
        )
        .map_err(db("find photo"))?;
    Ok(row.is_some())
}

/// Inserts the ranked predictions of `version` for each photo (locked by `lock_photo` or
/// `put_predictions_many`, so none can vanish meanwhile), in one statement.
fn insert_predictions(
    tx: &mut Transaction<'_>,
    version: &str,
    rows: &[(i64, &[Prediction])],
) -> Result<(), CatalogError> {
    let total: usize = rows.iter().map(|(_, labels)| labels.len()).sum();
    let (mut ids, mut ranks, mut labels, mut scores) = (
        Vec::with_capacity(total),
        Vec::with_capacity(total),
        Vec::with_capacity(total),
        Vec::with_capacity(total),
    );
    for (id, predictions) in rows {
        for (rank, p) in predictions.iter().enumerate() {
            ids.push(*id);
            ranks.push(i32::try_from(rank).map_err(|_| {
                CatalogError::Invalid(format!("photo {id} has over 2^31 predictions"))
            })?);
            labels.push(p.label.as_str());
            scores.push(p.score);
        }
    }
    tx.execute(
        "INSERT INTO predictions (photo_id, model_version, rank, label, score)
         SELECT r.photo_id, $1::text, r.rank, r.label, r.score
         FROM UNNEST($2::bigint[], $3::integer[], $4::text[], $5::real[])
           AS r (photo_id, rank, label, score)",
        &[&version, &ids, &ranks, &labels, &scores],
    )
    .map_err(db("write predictions"))?;
    index_labels(tx, version, &ids, &ranks, &labels, &scores)
}

/// Inserts the search terms (`label_terms`) of the predictions just inserted, in one statement.
fn index_labels(
    tx: &mut Transaction<'_>,
    version: &str,
    ids: &[i64],
    ranks: &[i32],
    labels: &[&str],
    scores: &[f32],
) -> Result<(), CatalogError> {
    let (mut t_ids, mut t_ranks, mut t_scores, mut kinds, mut terms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (((id, rank), label), score) in ids.iter().zip(ranks).zip(labels).zip(scores) {
        for (kind, term) in label_terms(label) {
            t_ids.push(*id);
            t_ranks.push(*rank);
            t_scores.push(*score);
            kinds.push(kind);
            terms.push(term);
        }
    }
    tx.execute(
        "INSERT INTO photo_labels (model_version, kind, term, score, photo_id, rank)
         SELECT $1::text, r.kind, r.term, r.score, r.photo_id, r.rank
         FROM UNNEST($2::integer[], $3::text[], $4::real[], $5::bigint[], $6::integer[])
           AS r (kind, term, score, photo_id, rank)",
        &[&version, &kinds, &terms, &t_scores, &t_ids, &t_ranks],
    )
    .map_err(db("index labels"))?;
    Ok(())
}

pub(super) fn limit_offset(offset: usize, limit: usize) -> (i64, i64) {
    (
        i64::try_from(offset).unwrap_or(i64::MAX),
        i64::try_from(limit).unwrap_or(i64::MAX),
    )
}

impl PhotoCatalog for PgCatalog {
    fn upsert_photo(&self, photo: &PhotoRecord) -> Result<(), CatalogError> {
        let id = sql_id(photo.id)?;
        let meta = &photo.meta;
        let bytes = i64::try_from(meta.bytes).map_err(|_| {
            CatalogError::Invalid(format!("photo size {} out of range", meta.bytes))
        })?;
        let node: &str = &self.node;
        self.tx("upsert photo", |tx| {
            let written = tx
                .execute(
                    "INSERT INTO photos (id, node, sha256, bytes, width, height, content_type,
                                         created_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (id) DO UPDATE SET sha256 = EXCLUDED.sha256,
                       bytes = EXCLUDED.bytes, width = EXCLUDED.width, height = EXCLUDED.height,
                       content_type = EXCLUDED.content_type, created_ms = EXCLUDED.created_ms
                     WHERE photos.node = EXCLUDED.node",
                    &[
                        &id,
                        &node,
                        &meta.sha256,
                        &bytes,
                        &i64::from(meta.width),
                        &i64::from(meta.height),
                        &meta.content_type,
                        &meta.created_ms,
                    ],
                )
                .map_err(db("upsert photo"))?;
            if written == 0 {
                let owner: String = tx
                    .query_one("SELECT node FROM photos WHERE id = $1", &[&id])
                    .and_then(|r| r.try_get(0))
                    .map_err(db("find photo"))?;
                return Err(CatalogError::Conflict {
                    what: format!("photo {id} of node {owner}"),
                });
            }
            tx.execute(
                "INSERT INTO replicas (photo_id, node, added_ms) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[&id, &node, &now_ms()],
            )
            .map_err(db("record the primary copy"))?;
            match &meta.ground_truth {
                Some(truth) => write_ground_truth(tx, id, truth),
                None => Ok(()),
            }
        })
    }

    fn delete_photo(&self, id: PhotoId) -> Result<bool, CatalogError> {
        let id = sql_id(id)?;
        let node = self.node();
        self.tx("delete photo", |tx| {
            let n = tx
                .execute(
                    "DELETE FROM photos WHERE id = $1 AND node = $2",
                    &[&id, &node],
                )
                .map_err(db("delete photo"))?;
            tx.execute(
                "DELETE FROM replicas WHERE photo_id = $1 AND node = $2",
                &[&id, &node],
            )
            .map_err(db("delete the primary copy's record"))?;
            Ok(n > 0)
        })
    }

    fn photo(&self, id: PhotoId) -> Result<Option<PhotoRecord>, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            let mut photos = conn
                .query(
                    &format!(
                        "SELECT {PHOTO_COLUMNS} FROM {PHOTO_FROM} WHERE p.id = $1 AND p.node = $2"
                    ),
                    &[&id, &self.node()],
                )
                .map_err(db("read photo"))?
                .iter()
                .map(photo_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            attach_truths(conn, &mut photos)?;
            Ok(photos.pop())
        })
    }

    fn photos_with_sha256(&self, sha256: &str) -> Result<Vec<PhotoRecord>, CatalogError> {
        self.with(|conn| super::duplicates::photos_with_sha256(conn, sha256))
    }

    fn existing_photo_ids(&self, ids: &[PhotoId]) -> Result<HashSet<PhotoId>, CatalogError> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        let ids = sql_ids(ids)?;
        let op = "find photos";
        self.with(|conn| {
            conn.query("SELECT id FROM photos WHERE id = ANY($1)", &[&ids])
                .map_err(db(op))?
                .iter()
                .map(|r| from_sql(r.try_get(0).map_err(db(op))?, "photo id"))
                .collect()
        })
    }

    fn list_photos(
        &self,
        after: Option<PhotoId>,
        limit: usize,
    ) -> Result<Vec<PhotoRecord>, CatalogError> {
        let after = after.map(sql_id).transpose()?.unwrap_or(-1);
        let (_, limit) = limit_offset(0, limit);
        self.with(|conn| {
            let mut photos = conn
                .query(
                    &format!(
                        "SELECT {PHOTO_COLUMNS} FROM {PHOTO_FROM}
                         WHERE p.node = $1 AND p.id > $2 ORDER BY p.id LIMIT $3"
                    ),
                    &[&self.node(), &after, &limit],
                )
                .map_err(db("list photos"))?
                .iter()
                .map(photo_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            attach_truths(conn, &mut photos)?;
            Ok(photos)
        })
    }

    fn count_photos(&self) -> Result<u64, CatalogError> {
        self.with(|conn| {
            let n: i64 = conn
                .query_one(
                    "SELECT COUNT(*) FROM photos WHERE node = $1",
                    &[&self.node()],
                )
                .and_then(|r| r.try_get(0))
                .map_err(db("count photos"))?;
            from_sql(n, "photo count")
        })
    }

    fn put_predictions(
        &self,
        id: PhotoId,
        model_version: &str,
        labels: &[Prediction],
    ) -> Result<(), CatalogError> {
        let sid = sql_id(id)?;
        self.tx("write predictions", |tx| {
            if !lock_photo(tx, sid, &self.node)? {
                return Err(CatalogError::NotFound {
                    what: format!("photo {id}"),
                });
            }
            tx.execute(
                "DELETE FROM predictions WHERE photo_id = $1 AND model_version = $2",
                &[&sid, &model_version],
            )
            .map_err(db("clear predictions"))?;
            insert_predictions(tx, model_version, &[(sid, labels)])
        })
    }

    fn put_predictions_many(
        &self,
        model_version: &str,
        rows: &[(PhotoId, Vec<Prediction>)],
    ) -> Result<usize, CatalogError> {
        let mut latest: BTreeMap<i64, &[Prediction]> = BTreeMap::new();
        let mut asked = Vec::with_capacity(rows.len());
        for (id, labels) in rows {
            let sid = sql_id(*id)?;
            latest.insert(sid, labels);
            asked.push(sid);
        }
        let ids: Vec<i64> = latest.keys().copied().collect();
        self.tx("write predictions", |tx| {
            let present: HashSet<i64> = tx
                .query(
                    "SELECT id FROM photos WHERE node = $1 AND id = ANY($2)
                     ORDER BY id FOR NO KEY UPDATE",
                    &[&self.node(), &ids],
                )
                .map_err(db("find photos"))?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()
                .map_err(db("find photos"))?;
            latest.retain(|id, _| present.contains(id));
            let kept: Vec<i64> = latest.keys().copied().collect();
            tx.execute(
                "DELETE FROM predictions WHERE model_version = $1 AND photo_id = ANY($2)",
                &[&model_version, &kept],
            )
            .map_err(db("clear predictions"))?;
            let rows: Vec<(i64, &[Prediction])> = latest.into_iter().collect();
            insert_predictions(tx, model_version, &rows)?;
            Ok(asked.iter().filter(|id| present.contains(id)).count())
        })
    }

    fn unlabelled(&self, model_version: &str) -> Result<Vec<PhotoId>, CatalogError> {
        let op = "list unlabelled photos";
        self.with(|conn| {
            conn.query(
                "SELECT p.id FROM photos p WHERE p.node = $2 AND NOT EXISTS
                   (SELECT 1 FROM predictions pr
                    WHERE pr.photo_id = p.id AND pr.model_version = $1 AND pr.rank = 0)
                 ORDER BY p.id",
                &[&model_version, &self.node()],
            )
            .map_err(db(op))?
            .iter()
            .map(|r| from_sql(r.try_get(0).map_err(db(op))?, "photo id"))
            .collect()
        })
    }

    fn label_counts(&self, model_version: &str) -> Result<(u64, u64), CatalogError> {
        self.with(|conn| {
            let row = conn
                .query_one(
                    "SELECT COUNT(*), COUNT(*) FILTER (WHERE pr.label = $3)
                     FROM predictions pr JOIN photos p ON p.id = pr.photo_id
                     WHERE pr.model_version = $1 AND pr.rank = 0 AND p.node = $2",
                    &[&model_version, &self.node(), &OTHER_CLASS],
                )
                .map_err(db("count labels"))?;
            let [labelled, other] = counts(&row, "label count")?;
            Ok((labelled, other))
        })
    }

    fn predictions(&self, id: PhotoId) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError> {
        self.predictions_on(id, Some(self.node()))
    }

    fn search(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<SearchHit>, CatalogError> {
        Ok(
            super::search::search(self, label, model_version, offset, limit, Some(self.node()))?
                .into_iter()
                .map(|h| h.hit)
                .collect(),
        )
    }

    fn search_cluster(
        &self,
        label: &str,
        model_version: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<NodeHit>, CatalogError> {
        super::search::search(self, label, model_version, offset, limit, None)
    }
}

impl PgCatalog {
    /// Photo `id`'s predictions by version, from the row of `node` (`None`: whichever node's
    /// row it is).
    pub(super) fn predictions_on(
        &self,
        id: PhotoId,
        node: Option<&str>,
    ) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError> {
        let sid = sql_id(id)?;
        let op = "read predictions";
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT pr.model_version, pr.label, pr.score
                     FROM predictions pr JOIN photos p ON p.id = pr.photo_id
                     WHERE pr.photo_id = $1 AND ($2::TEXT IS NULL OR p.node = $2)
                     ORDER BY pr.model_version, pr.rank",
                    &[&sid, &node],
                )
                .map_err(db(op))?;
            let mut out: Vec<(String, Vec<Prediction>)> = Vec::new();
            for row in &rows {
                let version: String = row.try_get(0).map_err(db(op))?;
                let prediction = Prediction {
                    label: row.try_get(1).map_err(db(op))?,
                    score: row.try_get(2).map_err(db(op))?,
                };
                match out.last_mut() {
                    Some((v, list)) if *v == version => list.push(prediction),
                    _ => out.push((version, vec![prediction])),
                }
            }
            Ok(out)
        })
    }
}
