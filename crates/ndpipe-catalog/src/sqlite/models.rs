//! The model registry: versions, lineage, metrics and which one serves each task.

use rusqlite::params;

use super::SqliteCatalog;
use crate::{CatalogError, ModelRegistry, ModelVersion, TaskName};

impl ModelRegistry for SqliteCatalog {
    fn register_model(&self, model: &ModelVersion) -> Result<(), CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let exists: bool = tx
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM model_versions WHERE id = ?1)",
                    params![model.id],
                    |r| r.get(0),
                )
                .map_err(CatalogError::db("find model"))?;
            if exists {
                return Err(CatalogError::Conflict {
                    what: format!("model version {}", model.id),
                });
            }
            let known_task: bool = tx
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM tasks WHERE name = ?1)",
                    params![model.task.as_str()],
                    |r| r.get(0),
                )
                .map_err(CatalogError::db("find task"))?;
            if !known_task {
                return Err(CatalogError::NotFound {
                    what: format!("task {}", model.task),
                });
            }
            if model.active {
                tx.execute(
                    "UPDATE model_versions SET active = 0 WHERE active = 1 AND task = ?1",
                    params![model.task.as_str()],
                )
                .map_err(CatalogError::db("deactivate models"))?;
            }
            tx.execute(
                "INSERT INTO model_versions (id, backbone, parent, metrics, created_ms, active, task)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    model.id,
                    model.backbone,
                    model.parent,
                    model.metrics.to_string(),
                    model.created_ms,
                    model.active,
                    model.task.as_str()
                ],
            )
            .map_err(CatalogError::db("register model"))?;
            tx.commit().map_err(CatalogError::db("commit model"))
        })
    }

    fn models(&self) -> Result<Vec<ModelVersion>, CatalogError> {
        self.select_models("ORDER BY created_ms, id", [])
    }

    fn model(&self, id: &str) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self.select_models("WHERE id = ?1", [id])?.pop())
    }

    fn active_model(&self, task: &TaskName) -> Result<Option<ModelVersion>, CatalogError> {
        Ok(self
            .select_models("WHERE active = 1 AND task = ?1", [task.as_str()])?
            .pop())
    }

    fn active_models(&self) -> Result<Vec<ModelVersion>, CatalogError> {
        self.select_models("WHERE active = 1 ORDER BY task", [])
    }

    fn set_active_model(&self, id: &str) -> Result<(), CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let n = tx
                .execute(
                    "UPDATE model_versions SET active = 0
                     WHERE active = 1 AND id <> ?1
                       AND task = (SELECT task FROM model_versions WHERE id = ?1)",
                    params![id],
                )
                .map_err(CatalogError::db("deactivate models"))
                .and_then(|_| {
                    tx.execute(
                        "UPDATE model_versions SET active = 1 WHERE id = ?1",
                        params![id],
                    )
                    .map_err(CatalogError::db("activate model"))
                })?;
            if n == 0 {
                return Err(CatalogError::NotFound {
                    what: format!("model version {id}"),
                });
            }
            tx.commit().map_err(CatalogError::db("commit activation"))
        })
    }

    fn deactivate_task(&self, task: &TaskName) -> Result<bool, CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE model_versions SET active = 0 WHERE active = 1 AND task = ?1",
                    params![task.as_str()],
                )
                .map_err(CatalogError::db("deactivate models"))?;
            Ok(n > 0)
        })
    }
}

impl SqliteCatalog {
    /// Model versions matching `clause` (a WHERE and/or ORDER BY over `model_versions`).
    fn select_models<P: rusqlite::Params>(
        &self,
        clause: &str,
        params: P,
    ) -> Result<Vec<ModelVersion>, CatalogError> {
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT id, backbone, parent, metrics, created_ms, active, task
                     FROM model_versions {clause}"
                ))
                .map_err(CatalogError::db("list models"))?;
            let rows = stmt
                .query_map(params, |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, bool>(5)?,
                        r.get::<_, String>(6)?,
                    ))
                })
                .map_err(CatalogError::db("list models"))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, backbone, parent, metrics, created_ms, active, task) =
                    row.map_err(CatalogError::db("list models"))?;
                let metrics = serde_json::from_str(&metrics)
                    .map_err(|e| CatalogError::Invalid(format!("metrics of model {id}: {e}")))?;
                out.push(ModelVersion {
                    task: task.parse()?,
                    id,
                    backbone,
                    parent,
                    metrics,
                    created_ms,
                    active,
                });
            }
            Ok(out)
        })
    }
}
