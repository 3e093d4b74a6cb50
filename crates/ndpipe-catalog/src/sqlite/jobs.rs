//! The job log: long-running jobs with their resumable state.

use rusqlite::params;

use super::SqliteCatalog;
use crate::{CatalogError, JobLog, JobRecord};

impl JobLog for SqliteCatalog {
    fn put_job(&self, job: &JobRecord) -> Result<(), CatalogError> {
        self.with(|conn| {
            conn.execute(
                "INSERT INTO jobs (id, kind, status, state, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET status = excluded.status, state = excluded.state,
                   updated_ms = excluded.updated_ms",
                params![
                    job.id,
                    job.kind,
                    job.status,
                    job.state.to_string(),
                    job.created_ms,
                    job.updated_ms
                ],
            )
            .map_err(CatalogError::db("write job"))?;
            Ok(())
        })
    }

    fn jobs(&self) -> Result<Vec<JobRecord>, CatalogError> {
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, kind, status, state, created_ms, updated_ms FROM jobs
                     ORDER BY created_ms, id",
                )
                .map_err(CatalogError::db("list jobs"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })
                .map_err(CatalogError::db("list jobs"))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, kind, status, state, created_ms, updated_ms) =
                    row.map_err(CatalogError::db("list jobs"))?;
                let state = serde_json::from_str(&state)
                    .map_err(|e| CatalogError::Invalid(format!("state of job {id}: {e}")))?;
                out.push(JobRecord {
                    id,
                    kind,
                    status,
                    state,
                    created_ms,
                    updated_ms,
                });
            }
            Ok(out)
        })
    }
}
