//! The node's APIs: [`http`] for clients (`/v1`, `/healthz`, `/metrics`), [`console`] the web
//! console at `/ui` over `http`'s handlers, [`s3`] for S3 clients
//! (`--s3-listen`) and [`grpc`] for the Tuner. All are thin adapters over ingest, the catalog,
//! jobs and the node.

pub(crate) mod console;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod replication;
pub(crate) mod s3;
pub(crate) mod similar;
