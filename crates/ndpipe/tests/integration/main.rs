//! Integration tests: each starts the real `ndpipe` binary on a loopback port.
//!
//! - `api`: the HTTP API, its errors, and what a bad upload leaves behind (nothing).
//! - `durability`: kill -9, torn tails, a lost index, corruption, compaction.
//! - `cli`: the import and photos commands.
//! - `config`: the configuration file, and flags over it.
//! - `inference`: labels at ingest with the real model, search, re-labelling jobs, model faults.
//! - `cache`: the cache policies on a real training run reading a PipeStore (quick mode).
//! - `tuner`: a Tuner and two PipeStore processes: fine-tuning, deploy, rollback, faults.

mod api;
mod cache;
mod cli;
mod common;
mod config;
mod durability;
mod inference;
mod tuner;
