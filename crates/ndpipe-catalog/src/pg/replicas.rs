//! [`ReplicaCatalog`]: the copies of each photo, tombstones and the nodes placement chooses
//! from. A copy counts when its holder is registered (a node that is down but not removed still
//! holds its copies); a removed node's copies are forgotten with it (`nodes.rs`).

use ndpipe_util::time::now_ms;

use super::error::db;
use super::photos::photo_from_row;
use super::{PgCatalog, counts, from_sql, sql_id, sql_ids};
use crate::{
    CatalogError, FailOver, GroundTruth, NodeOverview, PhotoCopies, PhotoId, PlacementNode,
    Prediction, ReplicaCatalog, ReplicationCounts, TaskName, TaskTruth,
};

/// The photo columns `photo_from_row` reads, the default task's ground truth (what the photo's
/// metadata carries), then the primary and every registered holder.
const COPIES_SELECT: &str = "SELECT p.id, p.sha256, p.bytes, p.width, p.height, \
     p.content_type, p.created_ms, g.label, g.split, p.node, \
     COALESCE(array_agg(r.node ORDER BY r.node) FILTER (WHERE r.node IS NOT NULL), '{}') \
     FROM photos p LEFT JOIN ground_truth g ON g.photo_id = p.id AND g.task = 'default' \
     LEFT JOIN replicas r ON r.photo_id = p.id AND r.node IN (SELECT name FROM nodes)";

fn copies_from_row(row: &postgres::Row) -> Result<PhotoCopies, CatalogError> {
    let op = "read photo copies";
    let mut photo = photo_from_row(row)?;
    let label: Option<String> = row.try_get(7).map_err(db(op))?;
    let split: Option<String> = row.try_get(8).map_err(db(op))?;
    if let (Some(label), Some(split)) = (label, split) {
        photo.meta.ground_truth = Some(GroundTruth::new(label, split.parse()?));
    }
    Ok(PhotoCopies {
        id: photo.id,
        meta: photo.meta,
        primary: row.try_get(9).map_err(db(op))?,
        holders: row.try_get(10).map_err(db(op))?,
    })
}

const GROUP_BY: &str = " GROUP BY p.id, p.node, g.label, g.split";

impl ReplicaCatalog for PgCatalog {
    fn placement_nodes(&self) -> Result<Vec<PlacementNode>, CatalogError> {
        let now = now_ms();
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT n.name, n.url, n.lease_expires_ms > $1, n.state = 'active',
                            s.free_bytes
                     FROM nodes n LEFT JOIN node_space s ON s.node = n.name
                     ORDER BY n.name",
                    &[&now],
                )
                .map_err(db("list placement nodes"))?;
            rows.iter()
                .map(|r| {
                    let op = "read placement node";
                    let free: Option<i64> = r.try_get(4).map_err(db(op))?;
                    Ok(PlacementNode {
                        name: r.try_get(0).map_err(db(op))?,
                        url: r.try_get(1).map_err(db(op))?,
                        live: r.try_get(2).map_err(db(op))?,
                        active: r.try_get(3).map_err(db(op))?,
                        free_bytes: free.map(|f| u64::try_from(f).unwrap_or(0)),
                    })
                })
                .collect()
        })
    }

    fn node_overview(&self) -> Result<Vec<NodeOverview>, CatalogError> {
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT n.name, n.last_seen_ms,
                            (SELECT count(*) FROM replicas r WHERE r.node = n.name)
                     FROM nodes n ORDER BY n.name",
                    &[],
                )
                .map_err(db("list nodes' overview"))?;
            rows.iter()
                .map(|r| {
                    let op = "read a node's overview";
                    let photos: i64 = r.try_get(2).map_err(db(op))?;
                    Ok(NodeOverview {
                        name: r.try_get(0).map_err(db(op))?,
                        last_seen_ms: r.try_get(1).map_err(db(op))?,
                        photos: u64::try_from(photos).unwrap_or(0),
                    })
                })
                .collect()
        })
    }

    fn report_free_space(&self, free_bytes: u64) -> Result<(), CatalogError> {
        let free = i64::try_from(free_bytes).unwrap_or(i64::MAX);
        let node = self.node();
        self.with(|conn| {
            conn.execute(
                "INSERT INTO node_space (node, free_bytes, updated_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (node) DO UPDATE SET free_bytes = EXCLUDED.free_bytes,
                   updated_ms = EXCLUDED.updated_ms",
                &[&node, &free, &now_ms()],
            )
            .map_err(db("report free space"))?;
            Ok(())
        })
    }

    fn add_copy(&self, id: PhotoId, node: &str) -> Result<(), CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            conn.execute(
                "INSERT INTO replicas (photo_id, node, added_ms) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[&id, &node, &now_ms()],
            )
            .map_err(db("record a copy"))?;
            Ok(())
        })
    }

    fn drop_copy(&self, id: PhotoId, node: &str) -> Result<(), CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            conn.execute(
                "DELETE FROM replicas WHERE photo_id = $1 AND node = $2",
                &[&id, &node],
            )
            .map_err(db("forget a copy"))?;
            Ok(())
        })
    }

    fn copies(&self, id: PhotoId) -> Result<Option<PhotoCopies>, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            let row = conn
                .query_opt(
                    &format!("{COPIES_SELECT} WHERE p.id = $1{GROUP_BY}"),
                    &[&id],
                )
                .map_err(db("find photo copies"))?;
            row.as_ref().map(copies_from_row).transpose()
        })
    }

    fn list_cluster(
        &self,
        after: Option<PhotoId>,
        limit: u32,
    ) -> Result<Vec<PhotoCopies>, CatalogError> {
        let after = after.map(sql_id).transpose()?.unwrap_or(-1);
        let limit = i64::from(limit);
        self.with(|conn| {
            let rows = conn
                .query(
                    &format!("{COPIES_SELECT} WHERE p.id > $1{GROUP_BY} ORDER BY p.id LIMIT $2"),
                    &[&after, &limit],
                )
                .map_err(db("list the cluster's photos"))?;
            rows.iter().map(copies_from_row).collect()
        })
    }

    fn held_here(&self) -> Result<Vec<PhotoId>, CatalogError> {
        let node = self.node();
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT photo_id FROM replicas WHERE node = $1 ORDER BY photo_id",
                    &[&node],
                )
                .map_err(db("list copies held"))?;
            rows.iter()
                .map(|r| {
                    let id: i64 = r.try_get(0).map_err(db("read copy"))?;
                    from_sql(id, "photo id")
                })
                .collect()
        })
    }

    fn add_tombstone(&self, id: PhotoId) -> Result<(), CatalogError> {
        let id = sql_id(id)?;
        self.tx("delete photo everywhere", |tx| {
            tx.execute(
                "INSERT INTO tombstones (photo_id, deleted_ms) VALUES ($1, $2)
                 ON CONFLICT DO NOTHING",
                &[&id, &now_ms()],
            )
            .map_err(db("write a tombstone"))?;
            tx.execute("DELETE FROM photos WHERE id = $1", &[&id])
                .map_err(db("delete photo"))?;
            Ok(())
        })
    }

    fn tombstoned(&self, ids: &[PhotoId]) -> Result<Vec<PhotoId>, CatalogError> {
        let ids = sql_ids(ids)?;
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT photo_id FROM tombstones WHERE photo_id = ANY($1) ORDER BY photo_id",
                    &[&ids],
                )
                .map_err(db("find tombstones"))?;
            rows.iter()
                .map(|r| {
                    let id: i64 = r.try_get(0).map_err(db("read tombstone"))?;
                    from_sql(id, "photo id")
                })
                .collect()
        })
    }

    fn tombstones_since(&self, since_ms: i64) -> Result<Vec<(PhotoId, i64)>, CatalogError> {
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT photo_id, deleted_ms FROM tombstones WHERE deleted_ms >= $1
                     ORDER BY deleted_ms",
                    &[&since_ms],
                )
                .map_err(db("find recent tombstones"))?;
            rows.iter()
                .map(|r| {
                    let op = "read tombstone";
                    let id: i64 = r.try_get(0).map_err(db(op))?;
                    Ok((from_sql(id, "photo id")?, r.try_get(1).map_err(db(op))?))
                })
                .collect()
        })
    }

    fn under_replicated(&self, wanted: u32, limit: u32) -> Result<Vec<PhotoCopies>, CatalogError> {
        let node = self.node();
        let (wanted, limit) = (i64::from(wanted), i64::from(limit));
        self.with(|conn| {
            let rows = conn
                .query(
                    &format!(
                        "{COPIES_SELECT} WHERE p.node = $1{GROUP_BY}
                         HAVING count(r.node) < $2 ORDER BY p.id LIMIT $3"
                    ),
                    &[&node, &wanted, &limit],
                )
                .map_err(db("find under-replicated photos"))?;
            rows.iter().map(copies_from_row).collect()
        })
    }

    fn primaries_after(
        &self,
        after: Option<PhotoId>,
        limit: u32,
    ) -> Result<Vec<PhotoCopies>, CatalogError> {
        let node = self.node();
        let after = after.map(sql_id).transpose()?.unwrap_or(-1);
        let limit = i64::from(limit);
        self.with(|conn| {
            let rows = conn
                .query(
                    &format!(
                        "{COPIES_SELECT} WHERE p.node = $1 AND p.id > $2{GROUP_BY}
                         ORDER BY p.id LIMIT $3"
                    ),
                    &[&node, &after, &limit],
                )
                .map_err(db("list this node's photos"))?;
            rows.iter().map(copies_from_row).collect()
        })
    }

    fn hand_over(&self, id: PhotoId, to: &str) -> Result<bool, CatalogError> {
        let id = sql_id(id)?;
        let node = self.node();
        self.with(|conn| {
            let moved = conn
                .execute(
                    "UPDATE photos SET node = $2 WHERE id = $1 AND node = $3
                       AND EXISTS (SELECT 1 FROM replicas WHERE photo_id = $1 AND node = $2)",
                    &[&id, &to, &node],
                )
                .map_err(db("hand a photo over"))?;
            Ok(moved == 1)
        })
    }

    fn fail_over(&self, node: &str) -> Result<FailOver, CatalogError> {
        let now = now_ms();
        self.tx("fail over a node's photos", |tx| {
            let moved = tx
                .execute(
                    "UPDATE photos p SET node = h.node
                     FROM (SELECT r.photo_id, min(r.node) AS node
                           FROM replicas r JOIN nodes n ON n.name = r.node
                           WHERE r.node <> $1 AND n.lease_expires_ms > $2 AND n.state = 'active'
                           GROUP BY r.photo_id) h
                     WHERE p.node = $1 AND h.photo_id = p.id",
                    &[&node, &now],
                )
                .map_err(db("move primaries"))?;
            let total: i64 = tx
                .query_one("SELECT count(*) FROM photos WHERE node = $1", &[&node])
                .and_then(|r| r.try_get(0))
                .map_err(db("count stranded photos"))?;
            let rows = tx
                .query(
                    "SELECT id FROM photos WHERE node = $1 ORDER BY id LIMIT 100",
                    &[&node],
                )
                .map_err(db("list stranded photos"))?;
            let stranded = rows
                .iter()
                .map(|r| {
                    let id: i64 = r.try_get(0).map_err(db("read stranded photo"))?;
                    from_sql(id, "photo id")
                })
                .collect::<Result<_, CatalogError>>()?;
            Ok(FailOver {
                moved,
                stranded,
                stranded_total: from_sql(total, "photo count")?,
            })
        })
    }

    fn replication_counts(&self, wanted: u32) -> Result<ReplicationCounts, CatalogError> {
        let wanted = i64::from(wanted);
        self.with(|conn| {
            let row = conn
                .query_one(
                    "SELECT count(*) FILTER (WHERE c >= $1),
                            count(*) FILTER (WHERE c > 0 AND c < $1),
                            count(*) FILTER (WHERE c = 0),
                            (SELECT count(*) FROM tombstones)
                     FROM (SELECT p.id, count(r.node) AS c FROM photos p
                           LEFT JOIN replicas r ON r.photo_id = p.id
                             AND r.node IN (SELECT name FROM nodes)
                           GROUP BY p.id) counts",
                    &[&wanted],
                )
                .map_err(db("count copies"))?;
            let [at_target, under_replicated, lost, tombstones] = counts(&row, "photo count")?;
            Ok(ReplicationCounts {
                at_target,
                under_replicated,
                lost,
                tombstones,
            })
        })
    }

    fn copies_many(&self, ids: &[PhotoId]) -> Result<Vec<PhotoCopies>, CatalogError> {
        let ids = sql_ids(ids)?;
        self.with(|conn| {
            let rows = conn
                .query(
                    &format!("{COPIES_SELECT} WHERE p.id = ANY($1){GROUP_BY} ORDER BY p.id"),
                    &[&ids],
                )
                .map_err(db("find the copies of photos"))?;
            rows.iter().map(copies_from_row).collect()
        })
    }

    fn cluster_predictions(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(String, Vec<Prediction>)>, CatalogError> {
        self.predictions_on(id, None)
    }

    fn task_truths_of(&self, node: &str, task: &TaskName) -> Result<Vec<TaskTruth>, CatalogError> {
        super::truths::truths_of(self, node, task)
    }

    fn primary_active_versions(&self, id: PhotoId) -> Result<Vec<String>, CatalogError> {
        let id = sql_id(id)?;
        let op = "read the primary's active versions";
        self.with(|conn| {
            conn.query(
                "SELECT a.model_id FROM photos p JOIN active_models a ON a.node = p.node
                 WHERE p.id = $1 ORDER BY a.task",
                &[&id],
            )
            .map_err(db(op))?
            .iter()
            .map(|r| r.try_get(0).map_err(db(op)))
            .collect()
        })
    }

    fn cluster_active_predictions(
        &self,
        id: PhotoId,
    ) -> Result<Vec<(TaskName, Vec<Prediction>)>, CatalogError> {
        let id = sql_id(id)?;
        let op = "read active predictions";
        self.with(|conn| {
            let rows = conn
                .query(
                    "SELECT a.task, pr.label, pr.score
                     FROM photos p
                     JOIN active_models a ON a.node = p.node
                     JOIN predictions pr ON pr.photo_id = p.id AND pr.model_version = a.model_id
                     WHERE p.id = $1 ORDER BY a.task, pr.rank",
                    &[&id],
                )
                .map_err(db(op))?;
            let mut out: Vec<(TaskName, Vec<Prediction>)> = Vec::new();
            for r in &rows {
                let task: String = r.try_get(0).map_err(db(op))?;
                let prediction = Prediction {
                    label: r.try_get(1).map_err(db(op))?,
                    score: r.try_get(2).map_err(db(op))?,
                };
                match out.last_mut() {
                    Some((t, list)) if *t == *task.as_str() => list.push(prediction),
                    _ => out.push((task.parse()?, vec![prediction])),
                }
            }
            Ok(out)
        })
    }
}
