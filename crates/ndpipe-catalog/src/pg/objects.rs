//! Buckets and objects of the S3 API, shared by every node of the cluster: a key names one
//! object cluster-wide, and a photo object lives on the node whose photo it is.

use std::collections::BTreeMap;

use postgres::{Row, Transaction};

use super::error::db;
use super::{PgCatalog, from_sql, sql_id};
use crate::objects::within_prefix;
use crate::{Bucket, CatalogError, ObjectBody, ObjectCatalog, ObjectRecord, PhotoId, PutCondition};

const OBJECT_COLUMNS: &str = "bucket, key, photo_id, blob, bytes, etag, sha256, content_type, \
     modified_ms, metadata, attributes, tags";

/// The JSON of column `i`, parsed.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &Row,
    i: usize,
    what: &str,
) -> Result<T, CatalogError> {
    let value: serde_json::Value = row.try_get(i).map_err(db("read object"))?;
    serde_json::from_value(value).map_err(|e| CatalogError::Invalid(format!("object {what}: {e}")))
}

/// `value` as JSON for a column.
fn json_value(
    value: &impl serde::Serialize,
    what: &str,
) -> Result<serde_json::Value, CatalogError> {
    serde_json::to_value(value).map_err(|e| CatalogError::Invalid(format!("object {what}: {e}")))
}

fn object_from_row(row: &Row) -> Result<ObjectRecord, CatalogError> {
    let op = "read object";
    let photo: Option<i64> = row.try_get(2).map_err(db(op))?;
    let blob: Option<String> = row.try_get(3).map_err(db(op))?;
    let body = match (photo, blob) {
        (Some(id), _) => ObjectBody::Photo(from_sql(id, "photo id")?),
        (None, Some(name)) => ObjectBody::Blob(name),
        (None, None) => {
            return Err(CatalogError::Invalid(
                "an object with neither photo nor blob".into(),
            ));
        }
    };
    Ok(ObjectRecord {
        bucket: row.try_get(0).map_err(db(op))?,
        key: row.try_get(1).map_err(db(op))?,
        body,
        bytes: from_sql(row.try_get(4).map_err(db(op))?, "object size")?,
        etag: row.try_get(5).map_err(db(op))?,
        sha256: row.try_get(6).map_err(db(op))?,
        content_type: row.try_get(7).map_err(db(op))?,
        modified_ms: row.try_get(8).map_err(db(op))?,
        metadata: json_column(row, 9, "metadata")?,
        attributes: json_column(row, 10, "attributes")?,
        tags: json_column(row, 11, "tags")?,
    })
}

fn bucket_from_row(row: &Row) -> Result<Bucket, CatalogError> {
    Ok(Bucket {
        name: row.try_get(0).map_err(db("read bucket"))?,
        created_ms: row.try_get(1).map_err(db("read bucket"))?,
    })
}

/// The object at (`bucket`, `key`), locked until the transaction ends.
fn lock_object(
    tx: &mut Transaction<'_>,
    bucket: &str,
    key: &str,
) -> Result<Option<ObjectRecord>, CatalogError> {
    tx.query_opt(
        &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = $1 AND key = $2 FOR UPDATE"),
        &[&bucket, &key],
    )
    .map_err(db("read object"))?
    .as_ref()
    .map(object_from_row)
    .transpose()
}

/// The advisory-lock space of object keys (the two-key form, apart from the one-key locks
/// such as the migrations').
const KEY_LOCKS: i32 = 0x6f62_6a73;

/// Locks (`bucket`, `key`) until the transaction ends, whether or not an object is there:
/// writers of one key take turns, and each reads what the one before it committed (a row lock
/// alone would not do: a waiter on a replaced row finds it deleted, and a missing row has no
/// lock to take). Keys with the same hash only wait for each other.
fn lock_key(tx: &mut Transaction<'_>, bucket: &str, key: &str) -> Result<(), CatalogError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2::text || '/' || $3::text))",
        &[&KEY_LOCKS, &bucket, &key],
    )
    .map_err(db("lock object key"))?;
    Ok(())
}

/// Whether `name` exists; the bucket row is locked (shared) so it cannot be deleted meanwhile.
fn lock_bucket(tx: &mut Transaction<'_>, name: &str) -> Result<bool, CatalogError> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM buckets WHERE name = $1 FOR KEY SHARE",
            &[&name],
        )
        .map_err(db("find bucket"))?;
    Ok(row.is_some())
}

impl ObjectCatalog for PgCatalog {
    fn create_bucket(&self, bucket: &Bucket) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "INSERT INTO buckets (name, created_ms) VALUES ($1, $2)
                     ON CONFLICT (name) DO NOTHING",
                    &[&bucket.name, &bucket.created_ms],
                )
                .map_err(db("create bucket"))?;
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
            conn.query_opt(
                "SELECT name, created_ms FROM buckets WHERE name = $1",
                &[&name],
            )
            .map_err(db("read bucket"))?
            .as_ref()
            .map(bucket_from_row)
            .transpose()
        })
    }

    fn buckets(&self) -> Result<Vec<Bucket>, CatalogError> {
        self.with(|conn| {
            conn.query("SELECT name, created_ms FROM buckets ORDER BY name", &[])
                .map_err(db("list buckets"))?
                .iter()
                .map(bucket_from_row)
                .collect()
        })
    }

    fn delete_bucket(&self, name: &str) -> Result<(), CatalogError> {
        self.tx("delete bucket", |tx| {
            let found = tx
                .query_opt("SELECT 1 FROM buckets WHERE name = $1 FOR UPDATE", &[&name])
                .map_err(db("find bucket"))?;
            if found.is_none() {
                return Err(CatalogError::NotFound {
                    what: format!("bucket {name}"),
                });
            }
            let used = tx
                .query_opt("SELECT 1 FROM objects WHERE bucket = $1 LIMIT 1", &[&name])
                .map_err(db("find objects"))?;
            if used.is_some() {
                return Err(CatalogError::NotEmpty {
                    what: format!("bucket {name}"),
                });
            }
            tx.execute("DELETE FROM buckets WHERE name = $1", &[&name])
                .map_err(db("delete bucket"))?;
            Ok(())
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
        let bytes = i64::try_from(o.bytes)
            .map_err(|_| CatalogError::Invalid(format!("object size {} out of range", o.bytes)))?;
        let metadata = json_value(&o.metadata, "metadata")?;
        let attributes = json_value(&o.attributes, "attributes")?;
        let tags = json_value(&o.tags, "tags")?;
        self.tx("write object", |tx| {
            if !lock_bucket(tx, &o.bucket)? {
                return Err(CatalogError::NotFound {
                    what: format!("bucket {}", o.bucket),
                });
            }
            lock_key(tx, &o.bucket, &o.key)?;
            let old = lock_object(tx, &o.bucket, &o.key)?;
            condition.check(&o.bucket, &o.key, old.as_ref())?;
            tx.execute(
                "DELETE FROM objects WHERE bucket = $1 AND key = $2",
                &[&o.bucket, &o.key],
            )
            .map_err(db("replace object"))?;
            tx.execute(
                &format!(
                    "INSERT INTO objects ({OBJECT_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
                ),
                &[
                    &o.bucket,
                    &o.key,
                    &photo,
                    &blob,
                    &bytes,
                    &o.etag,
                    &o.sha256,
                    &o.content_type,
                    &o.modified_ms,
                    &metadata,
                    &attributes,
                    &tags,
                ],
            )
            .map_err(db("write object"))?;
            Ok(old)
        })
    }

    fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError> {
        self.with(|conn| {
            conn.query_opt(
                &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = $1 AND key = $2"),
                &[&bucket, &key],
            )
            .map_err(db("read object"))?
            .as_ref()
            .map(object_from_row)
            .transpose()
        })
    }

    fn object_of_photo(&self, id: PhotoId) -> Result<Option<ObjectRecord>, CatalogError> {
        let id = sql_id(id)?;
        self.with(|conn| {
            conn.query_opt(
                &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE photo_id = $1"),
                &[&id],
            )
            .map_err(db("read object"))?
            .as_ref()
            .map(object_from_row)
            .transpose()
        })
    }

    fn set_object_tags(
        &self,
        bucket: &str,
        key: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<bool, CatalogError> {
        let tags = json_value(tags, "tags")?;
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE objects SET tags = $3 WHERE bucket = $1 AND key = $2",
                    &[&bucket, &key, &tags],
                )
                .map_err(db("tag object"))?;
            Ok(n > 0)
        })
    }

    fn delete_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>, CatalogError> {
        self.tx("delete object", |tx| {
            lock_key(tx, bucket, key)?;
            let old = lock_object(tx, bucket, key)?;
            tx.execute(
                "DELETE FROM objects WHERE bucket = $1 AND key = $2",
                &[&bucket, &key],
            )
            .map_err(db("delete object"))?;
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
            conn.query(
                &format!(
                    "SELECT {OBJECT_COLUMNS} FROM objects
                     WHERE bucket = $1 AND key >= $2 AND ($3::text IS NULL OR key > $3::text)
                     ORDER BY key LIMIT $4"
                ),
                &[&bucket, &prefix, &after, &limit],
            )
            .map_err(db("list objects"))?
            .iter()
            .map(object_from_row)
            .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(within_prefix(rows, prefix))
    }
}
