//! The Tuner's two APIs: HTTP for operators ([`http`]) and gRPC for PipeStores ([`grpc`]).

pub(crate) mod grpc;
pub(crate) mod http;
