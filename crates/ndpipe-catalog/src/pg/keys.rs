//! Access keys, shared by every node of the cluster.

use postgres::Row;

use super::error::db;
use super::{PgCatalog, from_sql};
use crate::{AccessKeyRecord, AccessKeys, CatalogError};

const KEY_COLUMNS: &str = "access_key, name, role, secret_sha256, sealed_secret, created_ms";

fn key_from_row(row: &Row) -> Result<AccessKeyRecord, CatalogError> {
    let op = "read access key";
    let role: String = row.try_get(2).map_err(db(op))?;
    Ok(AccessKeyRecord {
        access_key: row.try_get(0).map_err(db(op))?,
        name: row.try_get(1).map_err(db(op))?,
        role: role.parse()?,
        secret_sha256: row.try_get(3).map_err(db(op))?,
        sealed_secret: row.try_get(4).map_err(db(op))?,
        created_ms: row.try_get(5).map_err(db(op))?,
    })
}

impl PgCatalog {
    fn key_where(
        &self,
        column: &str,
        value: &str,
    ) -> Result<Option<AccessKeyRecord>, CatalogError> {
        self.with(|conn| {
            conn.query_opt(
                &format!("SELECT {KEY_COLUMNS} FROM access_keys WHERE {column} = $1"),
                &[&value],
            )
            .map_err(db("read access key"))?
            .as_ref()
            .map(key_from_row)
            .transpose()
        })
    }
}

impl AccessKeys for PgCatalog {
    fn create_key(&self, key: &AccessKeyRecord) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    &format!(
                        "INSERT INTO access_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT DO NOTHING"
                    ),
                    &[
                        &key.access_key,
                        &key.name,
                        &key.role.as_str(),
                        &key.secret_sha256,
                        &key.sealed_secret,
                        &key.created_ms,
                    ],
                )
                .map_err(db("create access key"))?;
            if n == 0 {
                return Err(CatalogError::Conflict {
                    what: format!("access key {}", key.name),
                });
            }
            Ok(())
        })
    }

    fn key(&self, access_key: &str) -> Result<Option<AccessKeyRecord>, CatalogError> {
        self.key_where("access_key", access_key)
    }

    fn key_by_secret(&self, secret_sha256: &str) -> Result<Option<AccessKeyRecord>, CatalogError> {
        self.key_where("secret_sha256", secret_sha256)
    }

    fn keys(&self) -> Result<Vec<AccessKeyRecord>, CatalogError> {
        self.with(|conn| {
            conn.query(
                &format!("SELECT {KEY_COLUMNS} FROM access_keys ORDER BY name"),
                &[],
            )
            .map_err(db("list access keys"))?
            .iter()
            .map(key_from_row)
            .collect()
        })
    }

    fn delete_key(&self, name: &str) -> Result<bool, CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute("DELETE FROM access_keys WHERE name = $1", &[&name])
                .map_err(db("delete access key"))?;
            Ok(n > 0)
        })
    }

    fn count_keys(&self) -> Result<u64, CatalogError> {
        self.with(|conn| {
            let n: i64 = conn
                .query_one("SELECT COUNT(*) FROM access_keys", &[])
                .and_then(|r| r.try_get(0))
                .map_err(db("count access keys"))?;
            from_sql(n, "access key count")
        })
    }
}
