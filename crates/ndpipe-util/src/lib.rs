//! Small helpers that several ndpipe crates need, written once.
//!
//! - [`time`]: wall-clock milliseconds since the Unix epoch;
//! - [`sync`]: mutex and rwlock guards that survive a poisoned lock;
//! - [`fs`]: durable file replacement (write, fsync, rename, fsync the directory) and file names
//!   made safe from version ids;
//! - [`f16`](mod@f16): the little-endian f16 encoding of feature vectors, on disk and on the wire;
//! - [`churn`]: how many top-1 labels a new model version changed;
//! - [`idx`]: the IDX container of the Fashion-MNIST files, parsed from untrusted bytes;
//! - `http` (feature `http`): the bearer-token check and the JSON error body of the HTTP APIs;
//! - `per_client` (feature `http`): a cap on one client address's uploads in flight, with its
//!   429 answer;
//! - `serve` (feature `http`): serving a router with header and body deadlines, a connection
//!   cap and a bounded shutdown.
//!
//! Nothing here knows about photos, models or the network protocol.
#![deny(missing_docs)]

pub mod churn;
pub mod f16;
pub mod fs;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "http")]
pub mod http;
pub mod idx;
#[cfg(feature = "http")]
pub mod per_client;
#[cfg(feature = "http")]
pub mod serve;
pub mod sync;
pub mod time;
