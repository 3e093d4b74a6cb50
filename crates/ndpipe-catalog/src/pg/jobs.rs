//! The job log of the handle's node: long-running jobs with their resumable state.

use super::PgCatalog;
use super::error::db;
use crate::{CatalogError, JobLog, JobRecord};

impl JobLog for PgCatalog {
    fn put_job(&self, job: &JobRecord) -> Result<(), CatalogError> {
        self.with(|conn| {
            conn.execute(
                "INSERT INTO jobs (node, id, kind, status, state, created_ms, updated_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (node, id) DO UPDATE SET status = EXCLUDED.status,
                   state = EXCLUDED.state, updated_ms = EXCLUDED.updated_ms",
                &[
                    &self.node(),
                    &job.id,
                    &job.kind,
                    &job.status,
                    &job.state,
                    &job.created_ms,
                    &job.updated_ms,
                ],
            )
            .map_err(db("write job"))?;
            Ok(())
        })
    }

    fn jobs(&self) -> Result<Vec<JobRecord>, CatalogError> {
        let op = "list jobs";
        self.with(|conn| {
            conn.query(
                "SELECT id, kind, status, state, created_ms, updated_ms FROM jobs
                 WHERE node = $1 ORDER BY created_ms, id",
                &[&self.node()],
            )
            .map_err(db(op))?
            .iter()
            .map(|r| {
                Ok(JobRecord {
                    id: r.try_get(0).map_err(db(op))?,
                    kind: r.try_get(1).map_err(db(op))?,
                    status: r.try_get(2).map_err(db(op))?,
                    state: r.try_get(3).map_err(db(op))?,
                    created_ms: r.try_get(4).map_err(db(op))?,
                    updated_ms: r.try_get(5).map_err(db(op))?,
                })
            })
            .collect()
        })
    }
}
