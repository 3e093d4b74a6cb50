//! The model registry. The versions (lineage, metrics, task) are the cluster's; which version is
//! active for each task is each node's own (`active_models`), as with a SQLite catalog per node:
//! a PipeStore's active versions are the heads it serves, and the Tuner's are the versions it
//! means every node to serve. A node activating a version never changes what another node serves.

use postgres::Row;
use postgres::types::ToSql;

use super::PgCatalog;
use super::error::db;
use crate::{CatalogError, ModelRegistry, ModelVersion, TaskName};

fn model_from_row(row: &Row) -> Result<ModelVersion, CatalogError> {
    let op = "read model";
    let task: String = row.try_get(6).map_err(db(op))?;
    Ok(ModelVersion {
        task: task.parse()?,
        id: row.try_get(0).map_err(db(op))?,
        backbone: row.try_get(1).map_err(db(op))?,
        parent: row.try_get(2).map_err(db(op))?,
        metrics: row.try_get(3).map_err(db(op))?,
        created_ms: row.try_get(4).map_err(db(op))?,
        active: row.try_get(5).map_err(db(op))?,
    })
}

/// Makes `id` the active version of its task on `node`; whether the version exists.
fn activate(
    tx: &mut postgres::Transaction<'_>,
    node: &str,
    id: &str,
) -> Result<bool, CatalogError> {
    let n = tx
        .execute(
            "INSERT INTO active_models (node, model_id, task)
             SELECT $1, id, task FROM model_versions WHERE id = $2
             ON CONFLICT (node, task) DO UPDATE SET model_id = EXCLUDED.model_id",
            &[&node, &id],
        )
        .map_err(db("activate model"))?;
    Ok(n > 0)
}

impl ModelRegistry for PgCatalog {
    fn register_model(&self, model: &ModelVersion) -> Result<(), CatalogError> {
        let node: &str = &self.node;
        self.tx("register model", |tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO model_versions (id, backbone, parent, metrics, created_ms, task)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                    &[
                        &model.id,
                        &model.backbone,
                        &model.parent,
                        &model.metrics,
                        &model.created_ms,
                        &model.task.as_str(),
                    ],
                )
                .map_err(|e| {
                    if e.code() == Some(&postgres::error::SqlState::FOREIGN_KEY_VIOLATION) {
                        CatalogError::NotFound {
                            what: format!("task {}", model.task),
                        }
                    } else {
                        db("register model")(e)
                    }
                })?;
            if inserted == 0 {
                return Err(CatalogError::Conflict {
                    what: format!("model version {}", model.id),
                });
            }
            if model.active {
                activate(tx, node, &model.id)?;
            }
            Ok(())
        })
    }

    fn models(&self) -> Result<Vec<ModelVersion>, CatalogError> {
        self.select_models("ORDER BY m.created_ms, m.id", &[])
    }

    fn model(&self, id: &str) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self.select_models("WHERE m.id = $2", &[&id])?.pop())
    }

    fn active_model(&self, task: &TaskName) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self
            .select_models(
                "WHERE a.model_id IS NOT NULL AND m.task = $2",
                &[&task.as_str()],
            )?
            .pop())
    }

    fn active_models(&self) -> Result<Vec<ModelVersion>, CatalogError> {
        self.select_models("WHERE a.model_id IS NOT NULL ORDER BY m.task", &[])
    }

    fn set_active_model(&self, id: &str) -> Result<(), CatalogError> {
        let node: &str = &self.node;
        self.tx("activate model", |tx| {
            if !activate(tx, node, id)? {
                return Err(CatalogError::NotFound {
                    what: format!("model version {id}"),
                });
            }
            Ok(())
        })
    }

    fn deactivate_task(&self, task: &TaskName) -> Result<bool, CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "DELETE FROM active_models WHERE node = $1 AND task = $2",
                    &[&self.node(), &task.as_str()],
                )
                .map_err(db("deactivate model"))?;
            Ok(n > 0)
        })
    }
}

impl PgCatalog {
    /// Model versions matching `clause` (a WHERE and/or ORDER BY over `model_versions m`, with
    /// this node's `active_models a` joined; `$1` is the node, further parameters follow).
    fn select_models(
        &self,
        clause: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<ModelVersion>, CatalogError> {
        let node: &str = &self.node;
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![&node];
        all.extend_from_slice(params);
        self.with(|conn| {
            conn.query(
                &format!(
                    "SELECT m.id, m.backbone, m.parent, m.metrics, m.created_ms,
                            a.model_id IS NOT NULL, m.task
                     FROM model_versions m
                     LEFT JOIN active_models a ON a.node = $1 AND a.model_id = m.id
                     {clause}"
                ),
                &all,
            )
            .map_err(db("list models"))?
            .iter()
            .map(model_from_row)
            .collect()
        })
    }
}
