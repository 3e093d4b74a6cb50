//! Integration tests: each starts the real `ndpipe` binary on a loopback port.
//!
//! - `api`: the HTTP API, its errors, and what a bad upload leaves behind (nothing).
//! - `durability`: kill -9, torn tails, a lost index, corruption, compaction.
//! - `disk`: a full disk (a tmpfs the test mounts): 507 below the reserve, nothing lost, start
//!   read-only, uploads again once space returns.
//! - `catalog_outage`: a PostgreSQL catalog frozen (SIGSTOP), thawed and stopped under a store
//!   with access keys: reads by id, `/healthz` and `/metrics` served, the rest 503
//!   `catalog_unavailable` within its deadline, recovery without a restart.
//! - `cli`: the import and photos commands.
//! - `duplicates`: the same bytes again per `--exact-duplicates`, edited copies grouped as near
//!   duplicates with their original as keeper, `ndpipe photos duplicates`.
//! - `config`: the configuration file, and flags over it.
//! - `inference`: labels at ingest with the real model, search, re-labelling jobs, model faults.
//! - `cache`: the cache policies on a real training run reading a PipeStore (quick mode).
//! - `tls`: gRPC between the Tuner and the PipeStores over mutual TLS.
//! - `tuner`: a Tuner and two PipeStore processes: fine-tuning, deploy, rollback, faults.
//! - `s3`: the S3 API with real clients (awscli, boto3, rclone, s5cmd).
//! - `cluster`: the control plane: a stopped node, a Tuner restart, a node gone for good, a
//!   client going away, a node that missed a commit.
//! - `faults`: five rounds of random kill -9, SIGSTOP and restarts during jobs (`faultbench`).
//! - `partitions`: five rounds of network cuts between namespaces, and a rolling upgrade
//!   (`faultbench`; as root, skipped with a message elsewhere).
//! - `limits`: stalled headers and bodies cut off, connections over the cap closed.
//! - `postgres`: a Tuner and three PipeStores on one PostgreSQL catalog: cluster-wide ids,
//!   search and versions.
//! - `detour`: uploads around a SIGSTOPped, then killed PipeStore (two copies each, within the
//!   copy deadline), and rebalancing back onto it after its restart.
//! - `replication`: three PipeStores with two copies of each photo: placement, a node killed
//!   during uploads, repair after its removal, a delete while a node is away, a flipped byte.
//! - `replicated_finetune`: a fine-tune on that cluster losing a node mid-extraction goes on,
//!   or (training through the cache) runs again on the survivors; each photo trained once.
//! - `replica_features`: a copy carries its photo's features to every holder, repair's too.
//! - `rollout`: backbones as a cluster operation: `ndpipe models add` verifies and keeps them.
//! - `rollout_balance`: a rollout moves photos from a 4x slower PipeStore to a fast one.
//! - `rollout_replicated`: a rollout over two copies of every photo extracts each photo once.
//! - `gateway`: a gateway in front of three PipeStores with two copies of each photo:
//!   placement, reads and deletes through it, its token, a PipeStore killed behind it; a
//!   repair job that cannot finish fails.
//! - `similar`: similar photos with the real model: one store (an edited copy finds its
//!   original, kill -9 and a damaged index file), and three PipeStores with a gateway (every
//!   front door finds every node's photos; a stopped or killed node makes a partial answer
//!   within the deadline).
//! - `gateway_s3`: S3 through that gateway (boto3): photos, sidecars and multipart uploads
//!   from every front door, plain objects on two nodes, repaired, deleted and mended.
//! - `console`: the web console in headless chromium (fantoccini): sign-in, thumbnails, search,
//!   upload, live jobs, CSRF and read-only keys refused, a gateway's grid, a killed node shown
//!   down.
//! - `console_train`: the console's Label & train, Models and Duplicates pages in a real
//!   browser: label, fine-tune watched live, deploy; a duplicates group, one deleted.
//! - `tuner_restart`: a standalone Tuner on PostgreSQL killed mid-fine-tune (the job fails with
//!   its reason) and mid-rollout (the job resumes and every node ends on the new backbone).
//! - `s3_races`: conditional PUTs racing through two PipeStores' S3 APIs: one winner each.

mod api;
mod bad_input;
mod cache;
mod catalog_outage;
mod cli;
mod cluster;
mod common;
mod config;
mod console;
mod console_train;
mod detour;
mod disk;
mod duplicates;
mod durability;
mod fair_connections;
mod faults;
mod gateway;
mod gateway_s3;
mod inference;
mod limits;
mod partitions;
mod postgres;
mod replica_features;
mod replicated_finetune;
mod replication;
mod rollout;
mod rollout_balance;
mod rollout_replicated;
mod s3;
mod s3_races;
mod secure;
mod similar;
mod tasks;
mod tasks_rollout;
mod tls;
mod tuner;
mod tuner_restart;
