//! Tasks: the cluster's named classifiers over the backbone's features.

use postgres::Row;

use super::PgCatalog;
use super::error::db;
use crate::{CatalogError, Task, TaskCatalog, TaskName};

fn task_from_row(row: &Row) -> Result<Task, CatalogError> {
    let op = "read task";
    let name: String = row.try_get(0).map_err(db(op))?;
    Ok(Task {
        name: name.parse()?,
        floor: row.try_get(1).map_err(db(op))?,
        created_ms: row.try_get(2).map_err(db(op))?,
    })
}

impl TaskCatalog for PgCatalog {
    fn create_task(&self, task: &Task) -> Result<(), CatalogError> {
        self.with(|conn| {
            let inserted = conn
                .execute(
                    "INSERT INTO tasks (name, floor, created_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (name) DO NOTHING",
                    &[&task.name.as_str(), &task.floor, &task.created_ms],
                )
                .map_err(db("create task"))?;
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
            conn.query(
                "SELECT name, floor, created_ms FROM tasks ORDER BY name",
                &[],
            )
            .map_err(db("list tasks"))?
            .iter()
            .map(task_from_row)
            .collect()
        })
    }

    fn task(&self, name: &TaskName) -> Result<Option<Task>, CatalogError> {
        self.with(|conn| {
            conn.query_opt(
                "SELECT name, floor, created_ms FROM tasks WHERE name = $1",
                &[&name.as_str()],
            )
            .map_err(db("read task"))?
            .as_ref()
            .map(task_from_row)
            .transpose()
        })
    }

    fn set_task_floor(&self, name: &TaskName, floor: Option<f32>) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE tasks SET floor = $2 WHERE name = $1",
                    &[&name.as_str(), &floor],
                )
                .map_err(db("set task floor"))?;
            if n == 0 {
                return Err(CatalogError::NotFound {
                    what: format!("task {name}"),
                });
            }
            Ok(())
        })
    }
}
