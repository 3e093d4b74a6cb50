//! The Tuner's two APIs: HTTP for operators ([`http`], with health, readiness and metrics in
//! `ops` for a standalone Tuner) and gRPC for PipeStores ([`grpc`]).

pub(crate) mod grpc;
pub(crate) mod http;
mod ops;
