//! Tasks: named classifiers over the backbone's features.

use rusqlite::{OptionalExtension, params};

use super::SqliteCatalog;
use crate::{CatalogError, Task, TaskCatalog, TaskName};

fn task_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Task> {
    let name: String = row.get(0)?;
    Ok(Task {
        name: name.parse().map_err(|e: CatalogError| {
            rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
        })?,
        floor: row.get::<_, Option<f64>>(1)?.map(|f| f as f32),
        created_ms: row.get(2)?,
    })
}

impl TaskCatalog for SqliteCatalog {
    fn create_task(&self, task: &Task) -> Result<(), CatalogError> {
        self.with(|conn| {
            let inserted = conn
                .execute(
                    "INSERT INTO tasks (name, floor, created_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (name) DO NOTHING",
                    params![
                        task.name.as_str(),
                        task.floor.map(f64::from),
                        task.created_ms
                    ],
                )
                .map_err(CatalogError::db("create task"))?;
            if inserted == 0 {
                return Err(CatalogError::Conflict {
                    what: format!("task {}", task.name),
                });
            }
            Ok(())
        })
    }

    fn tasks(&self) -> Result<Vec<Task>, CatalogError> {
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT name, floor, created_ms FROM tasks ORDER BY name")
                .map_err(CatalogError::db("list tasks"))?;
            let rows = stmt
                .query_map([], task_from_row)
                .map_err(CatalogError::db("list tasks"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("list tasks"))
        })
    }

    fn task(&self, name: &TaskName) -> Result<Option<Task>, CatalogError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT name, floor, created_ms FROM tasks WHERE name = ?1",
                params![name.as_str()],
                task_from_row,
            )
            .optional()
            .map_err(CatalogError::db("read task"))
        })
    }

    fn set_task_floor(&self, name: &TaskName, floor: Option<f32>) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE tasks SET floor = ?2 WHERE name = ?1",
                    params![name.as_str(), floor.map(f64::from)],
                )
                .map_err(CatalogError::db("set task floor"))?;
            if n == 0 {
                return Err(CatalogError::NotFound {
                    what: format!("task {name}"),
                });
            }
            Ok(())
        })
    }
}
