//! The Tuner's node registry: registered PipeStores, their state and leases.

use rusqlite::{OptionalExtension, Transaction, params};

use super::SqliteCatalog;
use crate::{CatalogError, NodeRecord, NodeRegistry, NodeState};

const COLUMNS: &str =
    "id, name, url, state, lease_expires_ms, version, registered_ms, last_seen_ms";

impl NodeRegistry for SqliteCatalog {
    fn register_node(
        &self,
        name: &str,
        url: &str,
        version: Option<&str>,
        lease_expires_ms: i64,
        now_ms: i64,
    ) -> Result<NodeRecord, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            tx.execute(
                "INSERT INTO nodes (name, url, state, lease_expires_ms, version, registered_ms,
                   last_seen_ms)
                 VALUES (?1, ?2, 'active', ?3, ?4, ?5, ?5)
                 ON CONFLICT(name) DO UPDATE SET url = excluded.url,
                   lease_expires_ms = excluded.lease_expires_ms, version = excluded.version,
                   last_seen_ms = excluded.last_seen_ms",
                params![name, url, lease_expires_ms, version, now_ms],
            )
            .map_err(CatalogError::db("register node"))?;
            let record = select_one(&tx, "WHERE name = ?1", params![name])?
                .ok_or_else(|| not_found(name))?;
            tx.commit().map_err(CatalogError::db("commit node"))?;
            Ok(record)
        })
    }

    fn renew_node_lease(
        &self,
        id: u32,
        name: &str,
        version: Option<&str>,
        lease_expires_ms: i64,
        now_ms: i64,
    ) -> Result<NodeRecord, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let n = tx
                .execute(
                    "UPDATE nodes SET lease_expires_ms = ?3, version = ?4, last_seen_ms = ?5
                     WHERE id = ?1 AND name = ?2",
                    params![id, name, lease_expires_ms, version, now_ms],
                )
                .map_err(CatalogError::db("renew lease"))?;
            if n == 0 {
                return Err(not_found(&format!("{name} (node {id})")));
            }
            let record =
                select_one(&tx, "WHERE id = ?1", params![id])?.ok_or_else(|| not_found(name))?;
            tx.commit().map_err(CatalogError::db("commit lease"))?;
            Ok(record)
        })
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            select(&tx, "ORDER BY id", [])
        })
    }

    fn set_node_state(&self, name: &str, state: NodeState) -> Result<NodeRecord, CatalogError> {
        self.with(|conn| {
            let tx = conn.transaction().map_err(CatalogError::db("begin"))?;
            let n = tx
                .execute(
                    "UPDATE nodes SET state = ?2 WHERE name = ?1",
                    params![name, state.as_str()],
                )
                .map_err(CatalogError::db("set node state"))?;
            if n == 0 {
                return Err(not_found(name));
            }
            let record = select_one(&tx, "WHERE name = ?1", params![name])?
                .ok_or_else(|| not_found(name))?;
            tx.commit().map_err(CatalogError::db("commit node state"))?;
            Ok(record)
        })
    }

    fn set_node_version(&self, id: u32, version: &str) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE nodes SET version = ?2 WHERE id = ?1",
                    params![id, version],
                )
                .map_err(CatalogError::db("set node version"))?;
            if n == 0 {
                return Err(not_found(&format!("node {id}")));
            }
            Ok(())
        })
    }

    fn remove_node(&self, name: &str) -> Result<bool, CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute("DELETE FROM nodes WHERE name = ?1", params![name])
                .map_err(CatalogError::db("remove node"))?;
            Ok(n > 0)
        })
    }
}

fn not_found(what: &str) -> CatalogError {
    CatalogError::NotFound {
        what: format!("node {what}"),
    }
}

fn select_one<P: rusqlite::Params>(
    tx: &Transaction<'_>,
    clause: &str,
    params: P,
) -> Result<Option<NodeRecord>, CatalogError> {
    tx.query_row(
        &format!("SELECT {COLUMNS} FROM nodes {clause}"),
        params,
        row,
    )
    .optional()
    .map_err(CatalogError::db("read node"))?
    .map(decode)
    .transpose()
}

fn select<P: rusqlite::Params>(
    tx: &Transaction<'_>,
    clause: &str,
    params: P,
) -> Result<Vec<NodeRecord>, CatalogError> {
    let mut stmt = tx
        .prepare_cached(&format!("SELECT {COLUMNS} FROM nodes {clause}"))
        .map_err(CatalogError::db("list nodes"))?;
    let rows = stmt
        .query_map(params, row)
        .map_err(CatalogError::db("list nodes"))?;
    let mut out = Vec::new();
    for r in rows {
        out.push(decode(r.map_err(CatalogError::db("list nodes"))?)?);
    }
    Ok(out)
}

/// A row as read, before its state is parsed.
type Row = (u32, String, String, String, i64, Option<String>, i64, i64);

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn decode(
    (id, name, url, state, lease_expires_ms, version, registered_ms, last_seen_ms): Row,
) -> Result<NodeRecord, CatalogError> {
    Ok(NodeRecord {
        id,
        state: state.parse()?,
        name,
        url,
        lease_expires_ms,
        version,
        registered_ms,
        last_seen_ms,
    })
}
