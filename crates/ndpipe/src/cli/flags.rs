//! Server flags. Each is optional and names the configuration key it overrides; only the flags
//! (and `NDPIPE_*` variables) that were given are laid over the file. Defaults are in the
//! libraries' `Config`s and in `ndpipe config example`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use ndpipe_model::{CodecKind, ExecutionProvider};
use ndpipe_store::{ExactDuplicates, NearHash};
use serde::Serialize;

/// Flags of `ndpipe serve` and `ndpipe pipestore`: keys of `[pipestore]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct PipeStoreFlags {
    /// Data directory: volumes, index, features, catalog and heads [data; default: data].
    #[arg(long, env = "NDPIPE_DATA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<PathBuf>,
    /// Address of the HTTP API [listen; default: 127.0.0.1:8080].
    #[arg(long, env = "NDPIPE_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<SocketAddr>,
    /// Address of this node's gRPC service; port 0 picks a free one [grpc_listen].
    #[arg(long, env = "NDPIPE_GRPC_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) grpc_listen: Option<SocketAddr>,
    /// Address of the S3-compatible API [s3_listen; default: 127.0.0.1:9000 for serve, off
    /// for pipestore].
    #[arg(long, env = "NDPIPE_S3_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3_listen: Option<SocketAddr>,
    /// Domain of virtual-host-style S3 requests (BUCKET.DOMAIN) [s3_domain; default:
    /// localhost].
    #[arg(long, env = "NDPIPE_S3_DOMAIN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3_domain: Option<String>,
    /// URL the Tuner uses to reach this node's gRPC service [advertise_url; default:
    /// http://GRPC_LISTEN].
    #[arg(long, env = "NDPIPE_ADVERTISE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) advertise_url: Option<String>,
    /// The name this node registers with; the same name keeps its node id [name].
    #[arg(long, env = "NDPIPE_NODE_NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// The Tuner's gRPC URL to register with (`ndpipe pipestore`) [tuner].
    #[arg(long, env = "NDPIPE_TUNER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tuner: Option<String>,
    /// The catalog: a postgres:// URL shared by the cluster, or a SQLite file [catalog;
    /// default: DATA/catalog.sqlite].
    #[arg(long, env = "NDPIPE_CATALOG")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) catalog: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) catalog_deadlines: CatalogFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) clients: ClientFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) peers: PeerFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) similar: SimilarFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) similar_index: SimilarIndexFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) duplicates: DuplicateFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) console: ConsoleFlags,
    /// Largest accepted image in pixels, checked before decoding [max_pixels; default: 64 Mpx].
    #[arg(long, env = "NDPIPE_MAX_PIXELS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_pixels: Option<u64>,
    /// Volume files are sealed at this size, in bytes [max_volume_bytes; default: 1 GiB].
    #[arg(long, env = "NDPIPE_MAX_VOLUME_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_volume_bytes: Option<u64>,
    /// Free bytes to keep on the data directory's file system; below it uploads answer 507
    /// while reads, deletes and searches go on [min_free_bytes; default: 256 MiB].
    #[arg(long, env = "NDPIPE_MIN_FREE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_free_bytes: Option<u64>,
    /// Bytes of the photo index kept in memory [index_cache_bytes; default: 64 MiB].
    #[arg(long, env = "NDPIPE_INDEX_CACHE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index_cache_bytes: Option<usize>,
    /// Bytes of the feature store kept in memory [feature_cache_bytes; default: 128 MiB].
    #[arg(long, env = "NDPIPE_FEATURE_CACHE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) feature_cache_bytes: Option<usize>,
    /// Photos waiting for online labelling with their tensors in memory, about 150 KB each
    /// [label_queue; default: 256].
    #[arg(long, env = "NDPIPE_LABEL_QUEUE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) label_queue: Option<usize>,
    /// Photo ids the labelling backlog holds in memory; past it photos stay unlabelled in the
    /// catalog until the backlog refills from there [label_backlog; default: 100000].
    #[arg(long, env = "NDPIPE_LABEL_BACKLOG")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) label_backlog: Option<usize>,
    /// Compression of stored tensors: zstd, deflate or none [tensor_codec; default: zstd].
    #[arg(long, env = "NDPIPE_TENSOR_CODEC")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tensor_codec: Option<CodecKind>,
    /// Compression level of stored tensors, zstd 1..=22 or deflate 0..=9 [tensor_level;
    /// default: 3].
    #[arg(long, env = "NDPIPE_TENSOR_LEVEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tensor_level: Option<i32>,
    /// Photos decoded at once [decode_threads; default: one per CPU core].
    #[arg(long, env = "NDPIPE_DECODE_THREADS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) decode_threads: Option<usize>,
    /// Bytes of memory decodes in flight may take together, judged from each header
    /// [decode_budget_bytes; default: 1 GiB].
    #[arg(long, env = "NDPIPE_DECODE_BUDGET_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) decode_budget_bytes: Option<u64>,
    /// Folder with the model: model.json, the ONNX file, the class names [model_dir; default:
    /// .cache/model].
    #[arg(long, env = "NDPIPE_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model_dir: Option<PathBuf>,
    /// The ONNX Runtime shared library [ort_lib; default: MODEL_DIR/lib/libonnxruntime.so].
    #[arg(long, env = "NDPIPE_ORT_LIB")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ort_lib: Option<PathBuf>,
    /// Run without a model: photos are stored but not labelled [no_model].
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) no_model: bool,
    /// Threads per model run, 0: ONNX Runtime decides [intra_threads; default: 0].
    #[arg(long, env = "NDPIPE_INTRA_THREADS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) intra_threads: Option<usize>,
    /// Largest batch per model run [max_batch; default: 32].
    #[arg(long, env = "NDPIPE_MAX_BATCH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_batch: Option<usize>,
    /// Cap the model at this many images/s, 0: no cap; emulates a slower accelerator for
    /// experiments with several PipeStores on one machine [model_rate_limit; default: 0].
    #[arg(long, env = "NDPIPE_MODEL_RATE_LIMIT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model_rate_limit: Option<f64>,
    /// Where inference runs: cpu, cuda or tensorrt [execution_provider; default: cpu].
    #[arg(long, env = "NDPIPE_EXECUTION_PROVIDER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) execution_provider: Option<ExecutionProvider>,
    /// The words model's folder, which maps a search in words onto class names; without it a
    /// search in words is an error [words_model_dir; default: MODEL_DIR/words].
    #[arg(long, env = "NDPIPE_WORDS_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_model_dir: Option<PathBuf>,
    /// Least cosine similarity of a class to a search in words, -1..=1 [words_min_score;
    /// default: 0.6].
    #[arg(long, env = "NDPIPE_WORDS_MIN_SCORE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_min_score: Option<f32>,
    /// Most classes of each task one search in words maps to [words_max_classes; default: 3].
    #[arg(long, env = "NDPIPE_WORDS_MAX_CLASSES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_max_classes: Option<usize>,
    /// Longest wait, in ms, for concurrent uploads to fill a labelling batch [label_wait_ms;
    /// default: 5].
    #[arg(long, env = "NDPIPE_LABEL_WAIT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) label_wait_ms: Option<u64>,
    /// Copies of each photo; 2 or more makes this node a front door that places uploads on
    /// that many nodes (needs a PostgreSQL --catalog) [replicas; default: 2 for a pipestore
    /// with a postgres:// --catalog and a --tuner, else 1; a one-node cluster needs 1].
    #[arg(long, env = "NDPIPE_REPLICAS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) replicas: Option<u32>,
    /// Pause between replication rounds (repair, scrub, free-space report), in ms
    /// [repair_interval_ms; default: 1000].
    #[arg(long, env = "NDPIPE_REPAIR_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) repair_interval_ms: Option<u64>,
    /// Local copies re-read and verified per second, photos and plain objects' files each, 0:
    /// no scrub [scrub_photos_per_second;
    /// default: 20].
    #[arg(long, env = "NDPIPE_SCRUB_PHOTOS_PER_SECOND")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scrub_photos_per_second: Option<u32>,
    /// Photos moved to where placement puts them per replication round, at most, >= 1
    /// [rebalance_moves_per_round; default: 32].
    #[arg(long, env = "NDPIPE_REBALANCE_MOVES_PER_ROUND")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rebalance_moves_per_round: Option<u32>,
    /// Photos rebalancing looks at per round, >= 1 [rebalance_page_photos; default: 256].
    #[arg(long, env = "NDPIPE_REBALANCE_PAGE_PHOTOS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rebalance_page_photos: Option<u32>,
    /// Deadline of each call to another node (an upload forwarded to its primary), in ms
    /// [peer_timeout_ms; default: 30000].
    #[arg(long, env = "NDPIPE_PEER_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_timeout_ms: Option<u64>,
    /// Deadline of a copy to another node and of the check that an upload's primary is
    /// alive, in ms; a node that misses it is passed over for the next node of the placement
    /// [copy_timeout_ms; default: 3000].
    #[arg(long, env = "NDPIPE_COPY_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) copy_timeout_ms: Option<u64>,
    /// Testing only: damage the first N feature chunks sent to the Tuner
    /// [fault_corrupt_chunks].
    #[arg(long, hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fault_corrupt_chunks: Option<u32>,
    /// Testing only: refuse the first N head commits [fault_fail_commits].
    #[arg(long, hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fault_fail_commits: Option<u32>,
}

/// Flags of `ndpipe tuner`: keys of `[tuner]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct TunerFlags {
    /// Data directory: the model registry and head files [data; default: data/tuner].
    #[arg(long, env = "NDPIPE_TUNER_DATA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<PathBuf>,
    /// HTTP address for operators, /v1/tuner/... [listen; default: 127.0.0.1:8090].
    #[arg(long, env = "NDPIPE_TUNER_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<SocketAddr>,
    /// gRPC address PipeStores register with [grpc_listen; default: 127.0.0.1:7070].
    #[arg(long, env = "NDPIPE_TUNER_GRPC_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) grpc_listen: Option<SocketAddr>,
    /// The catalog of nodes, model versions and jobs: a postgres:// URL shared with the
    /// PipeStores, or a SQLite file [catalog; default: DATA/registry.sqlite].
    #[arg(long, env = "NDPIPE_TUNER_CATALOG")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) catalog: Option<String>,
    /// Bearer token required for fine-tuning and deploys [token].
    #[arg(
        long,
        env = "NDPIPE_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// File whose first line is the bearer token [token_file].
    #[arg(long, env = "NDPIPE_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) peers: PeerFlags,
    /// A model folder: gives the Tuner its own backbone, for the conventional comparison mode
    /// [model_dir].
    #[arg(long, env = "NDPIPE_TUNER_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model_dir: Option<PathBuf>,
    /// Model threads on the Tuner, 0: ONNX Runtime decides [intra_threads; default: 0].
    #[arg(long, env = "NDPIPE_TUNER_INTRA_THREADS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) intra_threads: Option<usize>,
    /// The ONNX Runtime shared library, which loads the Tuner's backbone and verifies added
    /// ones [ort_lib; default: MODEL_DIR/lib/libonnxruntime.so, else libonnxruntime.so].
    #[arg(long, env = "NDPIPE_TUNER_ORT_LIB")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ort_lib: Option<PathBuf>,
    /// The words model's folder, which maps a search in words onto class names
    /// [words_model_dir; default: MODEL_DIR/words, else .cache/model/words].
    #[arg(long, env = "NDPIPE_TUNER_WORDS_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_model_dir: Option<PathBuf>,
    /// Least cosine similarity of a class to a search in words, -1..=1 [words_min_score;
    /// default: 0.6].
    #[arg(long, env = "NDPIPE_TUNER_WORDS_MIN_SCORE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_min_score: Option<f32>,
    /// Most classes of each task one search in words maps to [words_max_classes; default: 3].
    #[arg(long, env = "NDPIPE_TUNER_WORDS_MAX_CLASSES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) words_max_classes: Option<usize>,
    /// Largest backbone (ONNX file) `ndpipe models add` may upload, in bytes
    /// [max_backbone_bytes; default: 512 MiB].
    #[arg(long, env = "NDPIPE_MAX_BACKBONE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_backbone_bytes: Option<usize>,
    /// A job fails, naming the node, when it hears nothing from a node for this many ms; also
    /// the deadline of every call to a node [node_timeout_ms; default: 30000].
    #[arg(long, env = "NDPIPE_NODE_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) node_timeout_ms: Option<u64>,
    /// A PipeStore's lease in ms (it heartbeats three times per lease); a node whose lease ran
    /// out is left out of jobs [node_lease_ms; default: 15000].
    #[arg(long, env = "NDPIPE_NODE_LEASE_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) node_lease_ms: Option<u64>,
    /// The repair job that follows a node's removal fails when what is short of copies has
    /// not gone down for this many ms [repair_stall_ms; default: 600000].
    #[arg(long, env = "NDPIPE_REPAIR_STALL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) repair_stall_ms: Option<u64>,
    /// A rollout commits its nodes one after another, this many ms apart (0: all at once)
    /// [rollout_commit_interval_ms; default: 0].
    #[arg(long, env = "NDPIPE_ROLLOUT_COMMIT_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rollout_commit_interval_ms: Option<u64>,
    /// A fine-tuned version deploys only when its validation top-1 is at most this far (a
    /// share: 0.01 is one point) below its parent's on the same photos; otherwise it stays a
    /// candidate [deploy_margin; default: 0.01].
    #[arg(long, env = "NDPIPE_DEPLOY_MARGIN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) deploy_margin: Option<f32>,
}

/// Flags of `ndpipe gateway`: keys of `[gateway]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct GatewayFlags {
    /// Address of the client API [listen; default: 127.0.0.1:8080].
    #[arg(long, env = "NDPIPE_GATEWAY_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<SocketAddr>,
    /// Address of the S3-compatible API [s3_listen; default: off].
    #[arg(long, env = "NDPIPE_GATEWAY_S3_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3_listen: Option<SocketAddr>,
    /// Domain of virtual-host-style S3 requests (BUCKET.DOMAIN) [s3_domain; default:
    /// localhost].
    #[arg(long, env = "NDPIPE_S3_DOMAIN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3_domain: Option<String>,
    /// Folder where S3 multipart uploads are staged until they complete; finish an upload
    /// through the gateway that started it [s3_staging; default: TMPDIR/ndpipe-gateway-s3-uploads].
    #[arg(long, env = "NDPIPE_GATEWAY_S3_STAGING")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3_staging: Option<PathBuf>,
    /// The cluster's master key file (a PipeStore's DATA/keys.master, the same on every
    /// node): needed to check S3 signatures by access keys [keys_master_file].
    #[arg(long, env = "NDPIPE_KEYS_MASTER_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) keys_master_file: Option<PathBuf>,
    /// The cluster's catalog, a postgres:// URL (required) [catalog].
    #[arg(long, env = "NDPIPE_CATALOG")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) catalog: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) catalog_deadlines: CatalogFlags,
    /// Copies of each photo, placed on that many live PipeStores; give the PipeStores' value
    /// [replicas; default: 2].
    #[arg(long, env = "NDPIPE_REPLICAS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) replicas: Option<u32>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) clients: ClientFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) peers: PeerFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) duplicates: DuplicateFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) console: ConsoleFlags,
    /// Deadline of each call to a PipeStore, an upload's ingest and copies included, in ms
    /// [peer_timeout_ms; default: 30000].
    #[arg(long, env = "NDPIPE_PEER_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_timeout_ms: Option<u64>,
    /// Deadline of the check that an upload's primary is alive, in ms; a PipeStore that
    /// misses it is passed over for the next node of the placement [copy_timeout_ms; default:
    /// 3000].
    #[arg(long, env = "NDPIPE_COPY_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) copy_timeout_ms: Option<u64>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) similar: SimilarFlags,
}

/// Flags of the servers that take photos from clients (PipeStores and gateways): who may
/// call, and how much one upload and one client may send; the same keys in `[pipestore]`
/// and `[gateway]`.
/// The catalog's deadlines and the access keys' refresh: keys of `[pipestore]` and
/// `[gateway]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct CatalogFlags {
    /// Longest a PostgreSQL catalog statement runs, in ms (its statement_timeout and TCP user
    /// timeout); a request waits on the catalog at most this plus --catalog-checkout-ms plus
    /// 1 s, then answers 503 catalog_unavailable [catalog_timeout_ms; default: 3000].
    #[arg(long, env = "NDPIPE_CATALOG_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) catalog_timeout_ms: Option<u64>,
    /// Longest wait for a free connection of the PostgreSQL catalog's pool, in ms
    /// [catalog_checkout_ms; default: 2000].
    #[arg(long, env = "NDPIPE_CATALOG_CHECKOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) catalog_checkout_ms: Option<u64>,
    /// How often the access keys are reloaded from the catalog, in ms: a key revoked on
    /// another node is refused here within that time [key_refresh_ms; default: 3000].
    #[arg(long, env = "NDPIPE_KEY_REFRESH_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) key_refresh_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct ClientFlags {
    /// Bearer token required for writes and admin calls [token].
    #[arg(
        long,
        env = "NDPIPE_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// File whose first line is the bearer token [token_file].
    #[arg(long, env = "NDPIPE_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token_file: Option<PathBuf>,
    /// Serve /metrics without credentials even when access keys exist [metrics_open].
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) metrics_open: bool,
    /// Largest accepted upload, in bytes (a gateway's no larger than the PipeStores')
    /// [max_upload_bytes; default: 64 MiB].
    #[arg(long, env = "NDPIPE_MAX_UPLOAD_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_upload_bytes: Option<usize>,
    /// Uploads one client address may have in flight at once; more answer 429, 0: no cap
    /// [max_uploads_per_client; default: 32].
    #[arg(long, env = "NDPIPE_MAX_UPLOADS_PER_CLIENT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_uploads_per_client: Option<usize>,
}

/// Flags of duplicate finding, on the servers that take uploads (PipeStores and gateways); the
/// same keys in `[pipestore]` and `[gateway]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct DuplicateFlags {
    /// An upload of bytes the catalog already has: existing (200 with the existing photo's id
    /// as duplicate_of, nothing stored) or store (201, a new photo, duplicate_of said)
    /// [exact_duplicates; default: existing].
    #[arg(long, env = "NDPIPE_EXACT_DUPLICATES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exact_duplicates: Option<ExactDuplicates>,
    /// Perceptual hash of near duplicates: phash, gradient, mean or blockhash [near_hash;
    /// default: phash].
    #[arg(long, env = "NDPIPE_NEAR_HASH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) near_hash: Option<NearHash>,
    /// Largest Hamming distance, in bits of 64, between near duplicates' hashes, 0..=32
    /// [near_hamming; default: 12].
    #[arg(long, env = "NDPIPE_NEAR_HAMMING")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) near_hamming: Option<u32>,
    /// Smallest width and height, in pixels, of a photo paired as a near duplicate
    /// [near_min_side; default: 64].
    #[arg(long, env = "NDPIPE_NEAR_MIN_SIDE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) near_min_side: Option<u32>,
    /// Smallest cosine similarity between semantic duplicates' features, -1..=1
    /// [semantic_min_cosine; default: 0.9].
    #[arg(long, env = "NDPIPE_SEMANTIC_MIN_COSINE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) semantic_min_cosine: Option<f64>,
}

/// Flags of the web console at `/ui`; the same keys in `[pipestore]` and `[gateway]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct ConsoleFlags {
    /// How long a console session lasts after sign-in, in seconds [console_session_secs;
    /// default: 43200, 12 h].
    #[arg(long, env = "NDPIPE_CONSOLE_SESSION_SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) console_session_secs: Option<u64>,
    /// Bytes of console thumbnails kept in memory [console_thumb_cache_bytes; default: 64 MiB].
    #[arg(long, env = "NDPIPE_CONSOLE_THUMB_CACHE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) console_thumb_cache_bytes: Option<usize>,
    /// Samples of the process's counters kept for the console's storage page, one per 5 s
    /// [console_history_samples; default: 720, an hour].
    #[arg(long, env = "NDPIPE_CONSOLE_HISTORY_SAMPLES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) console_history_samples: Option<usize>,
    /// Mark the console's session cookie `Secure` (sent over HTTPS only): for a console
    /// reached through a TLS proxy [console_secure_cookie].
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) console_secure_cookie: bool,
}

/// Flags of every server on how it meets its peers and clients: the cluster secret, mutual
/// TLS, and the HTTP limits; the same keys in `[pipestore]` and `[tuner]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct PeerFlags {
    /// File whose first line is the cluster secret, required of every gRPC call between nodes
    /// and the Tuner [cluster_secret_file].
    #[arg(long, env = "NDPIPE_CLUSTER_SECRET_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cluster_secret_file: Option<PathBuf>,
    /// Run without a cluster secret or mutual TLS: gRPC open to anyone who reaches it; without
    /// this, pipestore, tuner and gateway refuse to start so [insecure_cluster].
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) insecure_cluster: bool,
    /// This process's TLS certificate (PEM); with --tls-key and --tls-ca, gRPC between the
    /// Tuner and the PipeStores is mutual TLS [tls_cert].
    #[arg(long, env = "NDPIPE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM) [tls_key].
    #[arg(long, env = "NDPIPE_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must present a certificate it signed
    /// [tls_ca].
    #[arg(long, env = "NDPIPE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Longest wait for a request's headers, in ms [header_timeout_ms; default: 10000].
    #[arg(long, env = "NDPIPE_HEADER_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) header_timeout_ms: Option<u64>,
    /// Longest wait for the next piece of a request body, in ms [body_idle_timeout_ms;
    /// default: 30000].
    #[arg(long, env = "NDPIPE_BODY_IDLE_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) body_idle_timeout_ms: Option<u64>,
    /// Smallest average rate of a request body, in bytes/s, once it has been arriving for the
    /// body idle timeout; a body that trickles fails; 0: no minimum [min_body_rate; default:
    /// 1024].
    #[arg(long, env = "NDPIPE_MIN_BODY_RATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_body_rate: Option<u64>,
    /// HTTP connections served at once; more are closed at once, past a few kept for
    /// /healthz and /readyz [max_connections; default: 512].
    #[arg(long, env = "NDPIPE_MAX_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_connections: Option<usize>,
    /// HTTP connections one client address may hold, so that one address cannot lock the
    /// others out; 0: all of --max-connections [max_connections_per_client; default: 64].
    #[arg(long, env = "NDPIPE_MAX_CONNECTIONS_PER_CLIENT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_connections_per_client: Option<usize>,
}

/// Flags of every front door on similarity queries; the same keys in `[pipestore]` and
/// `[gateway]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct SimilarFlags {
    /// Deadline of a similarity query, in ms; nodes that have not answered by then are named
    /// in a partial answer [similar_timeout_ms; default: 2000].
    #[arg(long, env = "NDPIPE_SIMILAR_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_timeout_ms: Option<u64>,
    /// Similar photos answered when a query names no k [similar_default_k; default: 10].
    #[arg(long, env = "NDPIPE_SIMILAR_DEFAULT_K")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_default_k: Option<usize>,
    /// Largest k a similarity query may ask for [similar_max_k; default: 1000].
    #[arg(long, env = "NDPIPE_SIMILAR_MAX_K")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_max_k: Option<usize>,
}

/// Flags of a PipeStore's similarity index: keys of `[pipestore]`.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub(crate) struct SimilarIndexFlags {
    /// Where each backbone's similarity index is saved [similar_index_dir; default:
    /// DATA/index].
    #[arg(long, env = "NDPIPE_SIMILAR_INDEX_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_index_dir: Option<PathBuf>,
    /// How often a changed similarity index is saved, in ms, and at a clean stop
    /// [similar_save_interval_ms; default: 60000].
    #[arg(long, env = "NDPIPE_SIMILAR_SAVE_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_save_interval_ms: Option<u64>,
    /// Graph degree (HNSW M) of the similarity index [similar_connectivity; default: 16].
    #[arg(long, env = "NDPIPE_SIMILAR_CONNECTIVITY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_connectivity: Option<usize>,
    /// Beam width while adding to the similarity index (HNSW ef_construction)
    /// [similar_expansion_add; default: 128].
    #[arg(long, env = "NDPIPE_SIMILAR_EXPANSION_ADD")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_expansion_add: Option<usize>,
    /// Beam width while searching the similarity index (HNSW ef) [similar_expansion_search;
    /// default: 64].
    #[arg(long, env = "NDPIPE_SIMILAR_EXPANSION_SEARCH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) similar_expansion_search: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_given_flags_are_laid_over_the_file() {
        let flags = PipeStoreFlags {
            max_batch: Some(8),
            ..PipeStoreFlags::default()
        };
        assert_eq!(
            serde_json::to_value(&flags).unwrap(),
            serde_json::json!({"max_batch": 8})
        );
        let all = PipeStoreFlags {
            no_model: true,
            tensor_codec: Some(CodecKind::Deflate),
            execution_provider: Some(ExecutionProvider::TensorRt),
            ..PipeStoreFlags::default()
        };
        let config: ndpipe_store::Config =
            serde_json::from_value(serde_json::to_value(&all).unwrap()).unwrap();
        assert!(config.no_model);
        assert_eq!(config.tensor_codec, CodecKind::Deflate);
        assert_eq!(config.execution_provider, ExecutionProvider::TensorRt);
    }
}
