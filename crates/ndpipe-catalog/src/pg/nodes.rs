//! The node registry, shared by the cluster: registered PipeStores, their state and leases.
//! Every method is one statement, hence one transaction.

use postgres::Row;

use super::error::db;
use super::{PgCatalog, from_sql};
use crate::{CatalogError, NodeRecord, NodeRegistry, NodeState};

const COLUMNS: &str =
    "id, name, url, state, lease_expires_ms, version, registered_ms, last_seen_ms";

fn node_from_row(row: &Row) -> Result<NodeRecord, CatalogError> {
    let op = "read node";
    let id: i64 = row.try_get(0).map_err(db(op))?;
    let state: String = row.try_get(3).map_err(db(op))?;
    Ok(NodeRecord {
        id: from_sql(id, "node id")?,
        name: row.try_get(1).map_err(db(op))?,
        url: row.try_get(2).map_err(db(op))?,
        state: state.parse()?,
        lease_expires_ms: row.try_get(4).map_err(db(op))?,
        version: row.try_get(5).map_err(db(op))?,
        registered_ms: row.try_get(6).map_err(db(op))?,
        last_seen_ms: row.try_get(7).map_err(db(op))?,
    })
}

fn not_found(what: &str) -> CatalogError {
    CatalogError::NotFound {
        what: format!("node {what}"),
    }
}

impl NodeRegistry for PgCatalog {
    fn register_node(
        &self,
        name: &str,
        url: &str,
        version: Option<&str>,
        lease_expires_ms: i64,
        now_ms: i64,
    ) -> Result<NodeRecord, CatalogError> {
        self.with(|conn| {
            let row = conn
                .query_one(
                    &format!(
                        "INSERT INTO nodes (name, url, state, lease_expires_ms, version,
                                            registered_ms, last_seen_ms)
                         VALUES ($1, $2, 'active', $3, $4, $5, $5)
                         ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url,
                           lease_expires_ms = EXCLUDED.lease_expires_ms,
                           version = EXCLUDED.version, last_seen_ms = EXCLUDED.last_seen_ms
                         RETURNING {COLUMNS}"
                    ),
                    &[&name, &url, &lease_expires_ms, &version, &now_ms],
                )
                .map_err(db("register node"))?;
            node_from_row(&row)
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
            conn.query_opt(
                &format!(
                    "UPDATE nodes SET lease_expires_ms = $3, version = $4, last_seen_ms = $5
                     WHERE id = $1 AND name = $2 RETURNING {COLUMNS}"
                ),
                &[&i64::from(id), &name, &lease_expires_ms, &version, &now_ms],
            )
            .map_err(db("renew lease"))?
            .ok_or_else(|| not_found(&format!("{name} (node {id})")))
            .and_then(|row| node_from_row(&row))
        })
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>, CatalogError> {
        self.with(|conn| {
            conn.query(&format!("SELECT {COLUMNS} FROM nodes ORDER BY id"), &[])
                .map_err(db("list nodes"))?
                .iter()
                .map(node_from_row)
                .collect()
        })
    }

    fn set_node_state(&self, name: &str, state: NodeState) -> Result<NodeRecord, CatalogError> {
        self.with(|conn| {
            conn.query_opt(
                &format!("UPDATE nodes SET state = $2 WHERE name = $1 RETURNING {COLUMNS}"),
                &[&name, &state.as_str()],
            )
            .map_err(db("set node state"))?
            .ok_or_else(|| not_found(name))
            .and_then(|row| node_from_row(&row))
        })
    }

    fn set_node_version(&self, id: u32, version: &str) -> Result<(), CatalogError> {
        self.with(|conn| {
            let n = conn
                .execute(
                    "UPDATE nodes SET version = $2 WHERE id = $1",
                    &[&i64::from(id), &version],
                )
                .map_err(db("set node version"))?;
            if n == 0 {
                return Err(not_found(&id.to_string()));
            }
            Ok(())
        })
    }

    /// Removes the node and its copies' records, in one transaction; each photo whose primary
    /// it was passes to the registered holder of a copy with the lowest name (a photo no other
    /// registered node holds stays the removed node's: lost).
    fn remove_node(&self, name: &str) -> Result<bool, CatalogError> {
        self.tx("remove node", |tx| {
            let n = tx
                .execute("DELETE FROM nodes WHERE name = $1", &[&name])
                .map_err(db("remove node"))?;
            tx.execute(
                "UPDATE photos p SET node = h.node
                 FROM (SELECT r.photo_id, min(r.node) AS node
                       FROM replicas r JOIN nodes n ON n.name = r.node
                       WHERE r.node <> $1 GROUP BY r.photo_id) h
                 WHERE p.node = $1 AND h.photo_id = p.id",
                &[&name],
            )
            .map_err(db("pass a removed node's photos to their copies"))?;
            tx.execute("DELETE FROM replicas WHERE node = $1", &[&name])
                .map_err(db("forget a removed node's copies"))?;
            tx.execute("DELETE FROM blob_copies WHERE node = $1", &[&name])
                .map_err(db("forget a removed node's plain objects"))?;
            tx.execute("DELETE FROM node_space WHERE node = $1", &[&name])
                .map_err(db("forget a removed node's space"))?;
            Ok(n > 0)
        })
    }
}
