//! The model registry, shared by the whole cluster: versions, lineage, metrics and the one that
//! serves. Writers lock the table (readers go on), so that two nodes activating versions at once
//! leave exactly one active.

use postgres::Row;
use postgres::types::ToSql;

use super::PgCatalog;
use super::error::db;
use crate::{CatalogError, ModelRegistry, ModelVersion};

const LOCK: &str = "LOCK TABLE model_versions IN EXCLUSIVE MODE";

fn model_from_row(row: &Row) -> Result<ModelVersion, CatalogError> {
    let op = "read model";
    Ok(ModelVersion {
        id: row.try_get(0).map_err(db(op))?,
        backbone: row.try_get(1).map_err(db(op))?,
        parent: row.try_get(2).map_err(db(op))?,
        metrics: row.try_get(3).map_err(db(op))?,
        created_ms: row.try_get(4).map_err(db(op))?,
        active: row.try_get(5).map_err(db(op))?,
    })
}

impl ModelRegistry for PgCatalog {
    fn register_model(&self, model: &ModelVersion) -> Result<(), CatalogError> {
        self.tx("register model", |tx| {
            tx.batch_execute(LOCK).map_err(db("lock models"))?;
            let exists = tx
                .query_opt("SELECT 1 FROM model_versions WHERE id = $1", &[&model.id])
                .map_err(db("find model"))?
                .is_some();
            if exists {
                return Err(CatalogError::Conflict {
                    what: format!("model version {}", model.id),
                });
            }
            if model.active {
                tx.execute("UPDATE model_versions SET active = false WHERE active", &[])
                    .map_err(db("deactivate models"))?;
            }
            tx.execute(
                "INSERT INTO model_versions (id, backbone, parent, metrics, created_ms, active)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &model.id,
                    &model.backbone,
                    &model.parent,
                    &model.metrics,
                    &model.created_ms,
                    &model.active,
                ],
            )
            .map_err(db("register model"))?;
            Ok(())
        })
    }

    fn models(&self) -> Result<Vec<ModelVersion>, CatalogError> {
        self.select_models("ORDER BY created_ms, id", &[])
    }

    fn model(&self, id: &str) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self.select_models("WHERE id = $1", &[&id])?.pop())
    }

    fn active_model(&self) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self.select_models("WHERE active", &[])?.pop())
    }

    fn set_active_model(&self, id: &str) -> Result<(), CatalogError> {
        self.tx("activate model", |tx| {
            tx.batch_execute(LOCK).map_err(db("lock models"))?;
            tx.execute(
                "UPDATE model_versions SET active = false WHERE active AND id <> $1",
                &[&id],
            )
            .map_err(db("deactivate models"))?;
            let n = tx
                .execute(
                    "UPDATE model_versions SET active = true WHERE id = $1",
                    &[&id],
                )
                .map_err(db("activate model"))?;
            if n == 0 {
                return Err(CatalogError::NotFound {
                    what: format!("model version {id}"),
                });
            }
            Ok(())
        })
    }
}

impl PgCatalog {
    /// Model versions matching `clause` (a WHERE and/or ORDER BY over `model_versions`).
    fn select_models(
        &self,
        clause: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<ModelVersion>, CatalogError> {
        self.with(|conn| {
            conn.query(
                &format!(
                    "SELECT id, backbone, parent, metrics, created_ms, active
                     FROM model_versions {clause}"
                ),
                params,
            )
            .map_err(db("list models"))?
            .iter()
            .map(model_from_row)
            .collect()
        })
    }
}
