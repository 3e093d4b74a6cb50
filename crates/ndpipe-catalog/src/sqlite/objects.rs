//! Buckets and objects of the S3 API.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::{SqliteCatalog, sql_id};
use crate::objects::within_prefix;
use crate::{Bucket, CatalogError, ObjectBody, ObjectCatalog, ObjectRecord, PhotoId, PutCondition};

const OBJECT_COLUMNS: &str = "bucket, key, photo_id, blob, bytes, etag, sha256, content_type, \
     modified_ms, metadata, attributes, tags";

/// The JSON text of column `i`, parsed.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    i: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
    })
}

/// `value` as JSON text for a column.
fn json_text(value: &impl serde::Serialize, what: &str) -> Result<String, CatalogError> {
    serde_json::to_string(value).map_err(|e| CatalogError::Invalid(format!("object {what}: {e}")))
}

fn object_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ObjectRecord> {
    let photo: Option<i64> = row.get(2)?;
    let blob: Option<String> = row.get(3)?;
    let body = match (photo, blob) {
        (Some(id), _) => ObjectBody::Photo(id.cast_unsigned()),
        (None, Some(name)) => ObjectBody::Blob(name),
        (None, None) => {
            return Err(rusqlite::Error::InvalidColumnType(
                3,
                "blob".into(),
                rusqlite::types::Type::Null,
            ));
        }
    };
    Ok(ObjectRecord {
        bucket: row.get(0)?,
        key: row.get(1)?,
        body,
        bytes: row.get::<_, i64>(4)?.cast_unsigned(),
        etag: row.get(5)?,
        sha256: row.get(6)?,
        content_type: row.get(7)?,
        modified_ms: row.get(8)?,
        metadata: json_column(row, 9)?,
        attributes: json_column(row, 10)?,
        tags: json_column(row, 11)?,
    })
}

fn read_object(
    tx: &Transaction<'_>,
    bucket: &str,
    key: &str,
) -> Result<Option<ObjectRecord>, CatalogError> {
    tx.query_row(
        &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = ?1 AND key = ?2"),
        params![bucket, key],
        object_from_row,
    )
    .optional()
    .map_err(CatalogError::db("read object"))
}

fn bucket_exists(tx: &Transaction<'_>, name: &str) -> Result<bool, CatalogError> {
    tx.query_row(
        "SELECT EXISTS(SELECT 1 FROM buckets WHERE name = ?1)",
        params![name],
        |r| r.get(0),
    )
    .map_err(CatalogError::db("find bucket"))
}

impl ObjectCatalog for SqliteCatalog {
    fn create_bucket(&self, bucket: &Bucket) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "INSERT INTO buckets (name, created_ms) VALUES (?1, ?2)
                     ON CONFLICT(name) DO NOTHING",
                    params![bucket.name, bucket.created_ms],
                )
                .map_err(CatalogError::db("create bucket"))?;
            if n == 0 {
                return Err(CatalogError::Conflict {
                    what: format!("bucket {}", bucket.name),
                });
            }
            Ok(())
        })
    }

    fn bucket(&self, name: &str) -> Result<Option<Bucket>, CatalogError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT name, created_ms FROM buckets WHERE name = ?1",
                params![name],
                |r| {
                    Ok(Bucket {
                        name: r.get(0)?,
                        created_ms: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(CatalogError::db("read bucket"))
        })
    }

    fn buckets(&self) -> Result<Vec<Bucket>, CatalogError> {
        self.with(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT name, created_ms FROM buckets ORDER BY name")
                .map_err(CatalogError::db("list buckets"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(Bucket {
                        name: r.get(0)?,
                        created_ms: r.get(1)?,
                    })
                })
                .map_err(CatalogError::db("list buckets"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("list buckets"))
        })
    }

    fn delete_bucket(&self, name: &str) -> Result<(), CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            if !bucket_exists(&tx, name)? {
                return Err(CatalogError::NotFound {
                    what: format!("bucket {name}"),
                });
            }
            let used: bool = tx
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM objects WHERE bucket = ?1)",
                    params![name],
                    |r| r.get(0),
                )
                .map_err(CatalogError::db("find objects"))?;
            if used {
                return Err(CatalogError::NotEmpty {
                    what: format!("bucket {name}"),
                });
            }
            tx.execute("DELETE FROM buckets WHERE name = ?1", params![name])
                .map_err(CatalogError::db("delete bucket"))?;
            tx.commit().map_err(CatalogError::db("commit bucket"))
        })
    }

    fn put_object(
        &self,
        o: &ObjectRecord,
        condition: &PutCondition,
    ) -> Result<Option<ObjectRecord>, CatalogError> {
        let (photo, blob) = match &o.body {
            ObjectBody::Photo(id) => (Some(sql_id(*id)?), None),
            ObjectBody::Blob(name) => (None, Some(name.as_str())),
        };
        let metadata = json_text(&o.metadata, "metadata")?;
        let attributes = json_text(&o.attributes, "attributes")?;
        let tags = json_text(&o.tags, "tags")?;
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            if !bucket_exists(&tx, &o.bucket)? {
                return Err(CatalogError::NotFound {
                    what: format!("bucket {}", o.bucket),
                });
            }
            // One connection behind a mutex: nothing writes between this read and the write.
            let old = read_object(&tx, &o.bucket, &o.key)?;
            condition.check(&o.bucket, &o.key, old.as_ref())?;
            tx.execute(
                "DELETE FROM objects WHERE bucket = ?1 AND key = ?2",
                params![o.bucket, o.key],
            )
            .map_err(CatalogError::db("replace object"))?;
            tx.execute(
                &format!("INSERT INTO objects ({OBJECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
                params![
                    o.bucket,
                    o.key,
                    photo,
                    blob,
                    o.bytes as i64,
                    o.etag,
                    o.sha256,
                    o.content_type,
                    o.modified_ms,
                    metadata,
                    attributes,
                    tags
                ],
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    CatalogError::Conflict {
                        what: format!("an object of photo {photo:?}"),
                    }
                }
                e => CatalogError::db("write object")(e),
            })?;
            tx.commit().map_err(CatalogError::db("commit object"))?;
            Ok(old)
        })
    }

    fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            read_object(&tx, bucket, key)
        })
    }

    fn object_of_photo(&self, id: PhotoId) -> Result<Option<ObjectRecord>, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            conn.query_row(
                &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE photo_id = ?1"),
                params![id],
                object_from_row,
            )
            .optional()
            .map_err(CatalogError::db("read object"))
        })
    }

    fn set_object_tags(
        &self,
        bucket: &str,
        key: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<bool, CatalogError> {
        let tags = json_text(tags, "tags")?;
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE objects SET tags = ?3 WHERE bucket = ?1 AND key = ?2",
                    params![bucket, key, tags],
                )
                .map_err(CatalogError::db("tag object"))?;
            Ok(n > 0)
        })
    }

    fn delete_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let old = read_object(&tx, bucket, key)?;
            tx.execute(
                "DELETE FROM objects WHERE bucket = ?1 AND key = ?2",
                params![bucket, key],
            )
            .map_err(CatalogError::db("delete object"))?;
            tx.commit().map_err(CatalogError::db("commit object"))?;
            Ok(old)
        })
    }

    fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ObjectRecord>, CatalogError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.with(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {OBJECT_COLUMNS} FROM objects
                     WHERE bucket = ?1 AND key >= ?2 AND (?3 IS NULL OR key > ?3)
                     ORDER BY key LIMIT ?4"
                ))
                .map_err(CatalogError::db("list objects"))?;
            let rows = stmt
                .query_map(params![bucket, prefix, after, limit], object_from_row)
                .map_err(CatalogError::db("list objects"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(CatalogError::db("list objects"))
        })?;
        Ok(within_prefix(rows, prefix))
    }
}
