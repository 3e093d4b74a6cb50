//! Access keys.

use rusqlite::{OptionalExtension, params};

use super::SqliteCatalog;
use crate::{AccessKeyRecord, AccessKeys, CatalogError};

const KEY_COLUMNS: &str = "access_key, name, role, secret_sha256, sealed_secret, created_ms";

fn key_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<AccessKeyRecord> {
    let role: String = row.get(2)?;
    Ok(AccessKeyRecord {
        access_key: row.get(0)?,
        name: row.get(1)?,
        role: role.parse().map_err(|e: CatalogError| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, e.into())
        })?,
        secret_sha256: row.get(3)?,
        sealed_secret: row.get(4)?,
        created_ms: row.get(5)?,
    })
}

impl SqliteCatalog {
    fn key_where(
        &self,
        column: &str,
        value: &str,
    ) -> Result<Option<AccessKeyRecord>, CatalogError> {
        self.with(|conn| {
            conn.query_row(
                &format!("SELECT {KEY_COLUMNS} FROM access_keys WHERE {column} = ?1"),
                params![value],
                key_from_row,
            )
            .optional()
            .map_err(CatalogError::db("read access key"))
        })
    }
}

impl AccessKeys for SqliteCatalog {
    fn create_key(&self, key: &AccessKeyRecord) -> Result<(), CatalogError> {
        self.with(|conn| {
            conn.execute(
                &format!("INSERT INTO access_keys ({KEY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                params![
                    key.access_key,
                    key.name,
                    key.role.as_str(),
                    key.secret_sha256,
                    key.sealed_secret,
                    key.created_ms
                ],
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    CatalogError::Conflict {
                        what: format!("access key {}", key.name),
                    }
                }
                e => CatalogError::db("create access key")(e),
            })?;
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
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {KEY_COLUMNS} FROM access_keys ORDER BY name"
                ))
                .map_err(CatalogError::db("list access keys"))?;
            let rows = stmt
                .query_map([], key_from_row)
                .map_err(CatalogError::db("list access keys"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("list access keys"))
        })
    }

    fn delete_key(&self, name: &str) -> Result<bool, CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute("DELETE FROM access_keys WHERE name = ?1", params![name])
                .map_err(CatalogError::db("delete access key"))?;
            Ok(n > 0)
        })
    }

    fn count_keys(&self) -> Result<u64, CatalogError> {
        self.with(|conn| {
            conn.query_row("SELECT COUNT(*) FROM access_keys", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n.cast_unsigned())
            .map_err(CatalogError::db("count access keys"))
        })
    }
}
