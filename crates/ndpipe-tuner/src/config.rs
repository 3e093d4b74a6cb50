//! The Tuner's settings: one serde struct, the `[tuner]` section of `ndpipe.toml`, which the
//! `ndpipe tuner` flags override.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Everything a Tuner can be told. Every field has a default, so an empty file is valid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Data directory: the model registry and head files.
    pub data: PathBuf,
    /// HTTP address for operators (`/v1/tuner/...`).
    pub listen: SocketAddr,
    /// gRPC address PipeStores register with.
    pub grpc_listen: SocketAddr,
    /// The catalog of the node registry, model versions and jobs: a `postgres://` URL for the
    /// database the cluster's PipeStores share, or a SQLite file (default:
    /// `DATA/registry.sqlite`).
    pub catalog: Option<String>,
    /// Bearer token required for fine-tuning and deploys (unset: none needed).
    pub token: Option<String>,
    /// File whose first line is the bearer token (used when `token` is unset).
    pub token_file: Option<PathBuf>,
    /// File whose first line is the cluster secret: every gRPC call to the Tuner must carry it,
    /// and the Tuner sends it to the PipeStores. `ndpipe tuner` refuses to start without it (or
    /// mutual TLS) unless `insecure_cluster`.
    pub cluster_secret_file: Option<PathBuf>,
    /// Run gRPC without a cluster secret or mutual TLS, open to anyone who reaches its port (a
    /// warning at start, every hour, and `insecure_cluster` in `/healthz`).
    pub insecure_cluster: bool,
    /// This Tuner's TLS certificate (PEM): with `tls_key` and `tls_ca`, gRPC to and from the
    /// PipeStores is mutual TLS (unset: plaintext).
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must present a certificate it signed.
    pub tls_ca: Option<PathBuf>,
    /// Longest wait, in ms, for an HTTP request's headers.
    pub header_timeout_ms: u64,
    /// Longest wait, in ms, for the next piece of an HTTP request body.
    pub body_idle_timeout_ms: u64,
    /// Smallest average rate of a request body, in bytes/s, once it has been arriving for
    /// `body_idle_timeout_ms` (a body that trickles fails); 0: no minimum.
    pub min_body_rate: u64,
    /// HTTP connections served at once; more are closed at once.
    pub max_connections: usize,
    /// Connections one client address may hold of `max_connections`, so that one address
    /// cannot lock the others out; 0: all of them.
    pub max_connections_per_client: usize,
    /// A model folder: gives the Tuner its own backbone, for the conventional comparison mode.
    pub model_dir: Option<PathBuf>,
    /// Model threads on the Tuner (0: ONNX Runtime decides).
    pub intra_threads: usize,
    /// The ONNX Runtime shared library, which loads the Tuner's backbone and verifies added
    /// ones (unset: `model_dir/lib/libonnxruntime.so` with `model_dir`, else the loader's
    /// `libonnxruntime.so`).
    pub ort_lib: Option<PathBuf>,
    /// The words model's folder, which maps a search in words ("kitty") onto class names in
    /// `GET /v1/search` (unset: `model_dir/words` with `model_dir`, else `.cache/model/words`,
    /// where `make setup` puts it). Without the model a search in words is an error.
    pub words_model_dir: Option<PathBuf>,
    /// Least cosine similarity of a class to a search in words (-1..=1); exact class names and
    /// synonyms always match.
    pub words_min_score: f32,
    /// Most classes of each task one search in words maps to (at least 1).
    pub words_max_classes: usize,
    /// Largest backbone (ONNX file) `ndpipe models add` may upload, in bytes.
    pub max_backbone_bytes: usize,
    /// A job fails, naming the node, when it hears nothing from a node for this long (ms): no
    /// message on a feature or re-labelling stream, no answer to a call. Also the deadline of
    /// every unary call to a node. Must exceed the time a node takes for one chunk of features.
    pub node_timeout_ms: u64,
    /// A PipeStore's lease, in ms: it heartbeats three times per lease, and a node whose lease
    /// ran out is left out of jobs (and reported) instead of waited for.
    pub node_lease_ms: u64,
    /// The repair job that follows a node's removal fails when the photos and plain objects
    /// short of copies have not gone down for this long, in ms.
    pub repair_stall_ms: u64,
    /// A rollout's commit phase: 0 commits every node at once; otherwise the nodes commit one
    /// after another, this many ms apart (a rolling switch an operator can watch, node by node).
    pub rollout_commit_interval_ms: u64,
    /// A fine-tuned version deploys only when its validation top-1 is at most this far (a share:
    /// 0.01 is one point) below its parent's on the same photos; otherwise it stays a candidate
    /// (a request's `deploy_margin` or `force` overrides it). Rollouts gate each task's
    /// retrained head the same way.
    pub deploy_margin: f32,
}

impl Config {
    /// How the Tuner runs ONNX Runtime: `ort_lib` (or its default) with `intra_threads`.
    pub(crate) fn runtime(&self) -> ndpipe_model::RuntimeConfig {
        let dylib = match (&self.ort_lib, &self.model_dir) {
            (Some(lib), _) => lib.clone(),
            (None, Some(dir)) => ndpipe_model::RuntimeConfig::for_model_dir(dir).dylib,
            (None, None) => ndpipe_model::RuntimeConfig::default().dylib,
        };
        ndpipe_model::RuntimeConfig {
            dylib,
            intra_threads: self.intra_threads,
            ..ndpipe_model::RuntimeConfig::default()
        }
    }

    /// The words model's folder: `words_model_dir`, else `model_dir/words`, else
    /// `.cache/model/words`.
    pub fn words_model_dir(&self) -> PathBuf {
        let model_dir = self
            .model_dir
            .as_deref()
            .unwrap_or(Path::new(".cache/model"));
        self.words_model_dir
            .clone()
            .unwrap_or_else(|| model_dir.join(ndpipe_model::words::WORDS_SUBDIR))
    }

    /// What a search in words maps to: `words_min_score` and `words_max_classes`.
    pub fn words_options(&self) -> ndpipe_model::words::MatchOptions {
        ndpipe_model::words::MatchOptions {
            min_score: self.words_min_score,
            max_classes: self.words_max_classes,
        }
    }

    /// The HTTP server's limits.
    pub(crate) fn http_limits(&self) -> ndpipe_util::serve::HttpLimits {
        ndpipe_util::serve::HttpLimits::from_config(ndpipe_util::serve::HttpSettings {
            header_timeout_ms: self.header_timeout_ms,
            body_idle_timeout_ms: self.body_idle_timeout_ms,
            min_body_rate: self.min_body_rate,
            max_connections: self.max_connections,
            max_connections_per_client: self.max_connections_per_client,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data: PathBuf::from("data/tuner"),
            listen: SocketAddr::from(([127, 0, 0, 1], 8090)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            catalog: None,
            token: None,
            token_file: None,
            cluster_secret_file: None,
            insecure_cluster: false,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            header_timeout_ms: 10_000,
            body_idle_timeout_ms: 30_000,
            min_body_rate: 1024,
            max_connections: 512,
            max_connections_per_client: 64,
            model_dir: None,
            intra_threads: 0,
            ort_lib: None,
            words_model_dir: None,
            words_min_score: ndpipe_model::words::MatchOptions::default().min_score,
            words_max_classes: ndpipe_model::words::MatchOptions::default().max_classes,
            max_backbone_bytes: 512 << 20,
            node_timeout_ms: 30_000,
            repair_stall_ms: 600_000,
            rollout_commit_interval_ms: 0,
            node_lease_ms: 15_000,
            deploy_margin: 0.01,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_model_defaults_to_the_model_dir() {
        assert_eq!(
            Config::default().words_model_dir(),
            PathBuf::from(".cache/model/words")
        );
        let with_model = Config {
            model_dir: Some(PathBuf::from("/m")),
            ..Config::default()
        };
        assert_eq!(with_model.words_model_dir(), PathBuf::from("/m/words"));
        let set = Config {
            words_model_dir: Some(PathBuf::from("/w")),
            words_min_score: 0.7,
            ..with_model
        };
        assert_eq!(set.words_model_dir(), PathBuf::from("/w"));
        assert_eq!(set.words_options().min_score, 0.7);
    }
}
