//! The node's two APIs: [`http`] for clients (`/v1`, `/healthz`, `/metrics`) and [`grpc`] for the
//! Tuner. Both are thin adapters over ingest, the catalog, jobs and the node.

pub(crate) mod grpc;
pub(crate) mod http;
