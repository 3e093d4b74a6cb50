//! The client side of the `ndpipe` command, shared with the benchmarks: a typed HTTP client for
//! a running store and Tuner ([`client`]) and a reader of the Fashion-MNIST files that the setup
//! step installs ([`fashion_mnist`]). The servers themselves are the `ndpipe-store` and
//! `ndpipe-tuner` libraries; the binary only boots them.
#![deny(missing_docs)]

pub mod client;
pub mod fashion_mnist;
