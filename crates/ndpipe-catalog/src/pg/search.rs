//! Label search by the `photo_labels` index (`label_terms.rs`), of one node or of the cluster.

use ndpipe_util::time::now_ms;
use postgres::Row;

use super::error::db;
use super::photos::limit_offset;
use super::{PgCatalog, from_sql};
use crate::label_terms::query_terms;
use crate::{CatalogError, NodeHit, SearchHit};

/// A search of the node `$8` (or, with `$8` NULL, of every node): the page of the two index
/// ranges (the whole label `$3`, a class name `$5`), merged in score order, then each hit's
/// label, node, and whether that node's lease is live at `$9`.
const SEARCH: &str = "SELECT l.photo_id, pr.label, l.score, l.rank, p.node,
            COALESCE(n.lease_expires_ms > $9, false)
     FROM (SELECT photo_id, rank, score FROM (
             (SELECT pl.photo_id, pl.rank, pl.score FROM photo_labels pl
              WHERE pl.model_version = $1 AND pl.kind = $2 AND pl.term = $3
              ORDER BY pl.score DESC, pl.photo_id, pl.rank)
             UNION ALL
             (SELECT pl.photo_id, pl.rank, pl.score FROM photo_labels pl
              WHERE pl.model_version = $1 AND pl.kind = $4 AND pl.term = $5
              ORDER BY pl.score DESC, pl.photo_id, pl.rank)) t
           WHERE $8::text IS NULL
              OR EXISTS (SELECT 1 FROM photos q WHERE q.id = t.photo_id AND q.node = $8::text)
           ORDER BY score DESC, photo_id, rank LIMIT $6 OFFSET $7) l
     JOIN predictions pr
       ON pr.photo_id = l.photo_id AND pr.model_version = $1 AND pr.rank = l.rank
     JOIN photos p ON p.id = l.photo_id
     LEFT JOIN nodes n ON n.name = p.node
     ORDER BY l.score DESC, l.photo_id, l.rank";

fn hit_from_row(row: &Row) -> Result<SearchHit, CatalogError> {
    let op = "search";
    let id: i64 = row.try_get(0).map_err(db(op))?;
    let rank: i32 = row.try_get(3).map_err(db(op))?;
    Ok(SearchHit {
        id: from_sql(id, "photo id")?,
        label: row.try_get(1).map_err(db(op))?,
        score: row.try_get(2).map_err(db(op))?,
        rank: from_sql(i64::from(rank), "prediction rank")?,
    })
}

/// The search of one node's photos, or with `node` `None` of the whole cluster's.
pub(super) fn search(
    catalog: &PgCatalog,
    label: &str,
    model_version: &str,
    offset: usize,
    limit: usize,
    node: Option<&str>,
) -> Result<Vec<NodeHit>, CatalogError> {
    let op = "search";
    let (offset, limit) = limit_offset(offset, limit);
    let [(whole, exact), (name, folded)] = query_terms(label);
    catalog.with(|conn| {
        let rows = conn
            .query(
                SEARCH,
                &[
                    &model_version,
                    &whole,
                    &exact,
                    &name,
                    &folded,
                    &limit,
                    &offset,
                    &node,
                    &now_ms(),
                ],
            )
            .map_err(db(op))?;
        rows.iter()
            .map(|r| {
                Ok(NodeHit {
                    node: Some(r.try_get(4).map_err(db(op))?),
                    available: r.try_get(5).map_err(db(op))?,
                    hit: hit_from_row(r)?,
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PhotoCatalog, Prediction, test_postgres, test_suite::photo};

    #[test]
    fn search_reads_the_label_index_and_scans_nothing() {
        let Some(db) = test_postgres::database("search_plan") else {
            return;
        };
        let c = PgCatalog::connect(&db.url).unwrap();
        let mut rows = Vec::new();
        for id in 1..=3000u64 {
            c.upsert_photo(&photo(id, None)).unwrap();
            let label = format!("class {}, name {}", id % 300, id % 7);
            let score = (id % 100) as f32 / 100.0;
            rows.push((id, vec![Prediction { label, score }]));
        }
        c.put_predictions_many("v", &rows).unwrap();
        let mut conn = db.client();
        conn.batch_execute("ANALYZE").unwrap();
        let node: Option<&str> = Some("default");
        let plan: Vec<String> = conn
            .query(
                &format!("EXPLAIN {SEARCH}"),
                &[
                    &"v", &0i32, &"class 7", &1i32, &"class 7", &10i64, &0i64, &node, &0i64,
                ],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let text = plan.join("\n");
        assert_eq!(
            text.matches("Index Scan using photo_labels_search on photo_labels")
                .count()
                + text
                    .matches("Index Only Scan using photo_labels_search on photo_labels")
                    .count(),
            2,
            "{text}"
        );
        assert!(text.contains("Merge Append"), "{text}");
        for table in ["photo_labels", "predictions", "photos"] {
            let scan = format!("Seq Scan on {table} ");
            assert!(!text.contains(&scan), "{table} is not scanned: {text}");
        }
    }
}
