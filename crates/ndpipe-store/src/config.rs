//! The settings: [`Config`], the `[pipestore]` section of `ndpipe.toml`, which the `ndpipe
//! serve` and `ndpipe pipestore` flags override, and [`GatewayConfig`], the `[gateway]`
//! section (`ndpipe gateway`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ndpipe_model::{CodecKind, ExecutionProvider};
use serde::{Deserialize, Serialize};

use crate::api::console::ConsoleSettings;
use crate::duplicates::{
    DEFAULT_NEAR_HAMMING, DEFAULT_NEAR_MIN_SIDE, DEFAULT_SEMANTIC_MIN_COSINE, DuplicateSettings,
    ExactDuplicates, NearHash,
};

/// Default largest upload body, in bytes.
pub const DEFAULT_MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Default lifetime of a console session: 12 hours.
const DEFAULT_CONSOLE_SESSION_SECS: u64 = 12 * 3600;
/// Default bytes of console thumbnails kept in memory.
const DEFAULT_CONSOLE_THUMB_CACHE_BYTES: usize = 64 << 20;
/// Default console history: 720 samples of the counters, an hour at one per 5 s.
const DEFAULT_CONSOLE_HISTORY_SAMPLES: usize = 720;

/// Everything a PipeStore can be told. Every field has a default, so an empty file is valid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Data directory: volumes, index, features, catalog and heads live here.
    pub data: PathBuf,
    /// Address of the HTTP API (`/v1`, `/healthz`, `/metrics`).
    pub listen: SocketAddr,
    /// Address of this node's gRPC service for the Tuner (port 0 picks a free one).
    pub grpc_listen: SocketAddr,
    /// Address of the S3-compatible API (unset: off; `ndpipe serve` uses 127.0.0.1:9000).
    pub s3_listen: Option<SocketAddr>,
    /// Domain of virtual-host-style S3 requests: a request to `BUCKET.DOMAIN` names the bucket
    /// by its host; any other host is path-style (`/BUCKET/KEY`).
    pub s3_domain: String,
    /// URL the Tuner uses to reach this node's gRPC service (default: `http://` and the bound
    /// gRPC address).
    pub advertise_url: Option<String>,
    /// The name this node registers with; the same name keeps its node id across restarts
    /// (default: `pipestore-` and the data directory's name).
    pub name: Option<String>,
    /// The Tuner's gRPC URL to register with (`ndpipe pipestore`); unset, the node registers
    /// with no one (`ndpipe serve` registers with its own Tuner).
    pub tuner: Option<String>,
    /// The catalog: a `postgres://` URL for a catalog the whole cluster shares (photo ids then
    /// come from blocks it reserves for this node), or a SQLite file (default:
    /// `DATA/catalog.sqlite`).
    pub catalog: Option<String>,
    /// Longest a PostgreSQL catalog statement may run, in ms: the server's
    /// `statement_timeout`, and the TCP user timeout of the connection (TCP keepalive probes
    /// every third of it). A request waits on the catalog at most `catalog_checkout_ms` plus
    /// this plus a second, then answers 503 `catalog_unavailable`.
    pub catalog_timeout_ms: u64,
    /// Longest wait, in ms, for a free connection of the PostgreSQL catalog's pool (checked
    /// alive within that time).
    pub catalog_checkout_ms: u64,
    /// How often the access keys are reloaded from the catalog, in ms: a key created or
    /// revoked on another node counts here within that time (keys are checked in memory).
    pub key_refresh_ms: u64,
    /// Bearer token required for writes and admin calls (unset: none needed).
    pub token: Option<String>,
    /// File whose first line is the bearer token (used when `token` is unset).
    pub token_file: Option<PathBuf>,
    /// Serve `/metrics` without credentials even when access keys exist (by default it needs
    /// a `read` key then).
    pub metrics_open: bool,
    /// File whose first line is the cluster secret: every gRPC call to this node must carry it,
    /// and the node sends it to the Tuner and other nodes. `ndpipe pipestore` refuses to start
    /// without it (or mutual TLS) unless `insecure_cluster`; `ndpipe serve` makes one in its
    /// data directory (`DATA/cluster.secret`).
    pub cluster_secret_file: Option<PathBuf>,
    /// Run gRPC without a cluster secret or mutual TLS, open to anyone who reaches its port (a
    /// warning at start, every hour, and `insecure_cluster` in `/healthz`).
    pub insecure_cluster: bool,
    /// This node's TLS certificate (PEM): with `tls_key` and `tls_ca`, gRPC to and from the
    /// Tuner and other nodes is mutual TLS, and the advertised URL is `https://` (unset:
    /// plaintext).
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must present a certificate it signed.
    pub tls_ca: Option<PathBuf>,
    /// Longest wait, in ms, for a request's headers (a half-sent request cannot hold a
    /// connection).
    pub header_timeout_ms: u64,
    /// Longest wait, in ms, for the next piece of a request body (a stalled upload fails).
    pub body_idle_timeout_ms: u64,
    /// Smallest average rate of a request body, in bytes/s, once it has been arriving for
    /// `body_idle_timeout_ms` (a body that trickles fails); 0: no minimum.
    pub min_body_rate: u64,
    /// HTTP connections served at once; more are closed at once.
    pub max_connections: usize,
    /// Connections one client address may hold of `max_connections`, so that one address
    /// cannot lock the others out; 0: all of them.
    pub max_connections_per_client: usize,
    /// Largest accepted upload, in bytes.
    pub max_upload_bytes: usize,
    /// Uploads one client address may have in flight at once (`POST /v1/photos`); more answer
    /// 429 `too_many_uploads`. 0: no cap.
    pub max_uploads_per_client: usize,
    /// Largest accepted image, in pixels (width * height), checked before decoding.
    pub max_pixels: u64,
    /// Volume files are sealed at this size, in bytes.
    pub max_volume_bytes: u64,
    /// Free bytes to keep on the data directory's file system: below it, uploads are refused
    /// with `507 insufficient_storage` while reads, deletes and searches go on, and they are
    /// accepted again as soon as space is freed. A fixed amount rather than a share of the disk
    /// (ext4 already keeps 5% for root; a share would hold back terabytes on a large disk).
    pub min_free_bytes: u64,
    /// Bytes of the photo index kept in memory (redb's page cache; the rest is read from disk).
    pub index_cache_bytes: usize,
    /// Bytes of the feature store kept in memory (redb's page cache).
    pub feature_cache_bytes: usize,
    /// Photos waiting for online labelling with their tensors in memory (about 150 KB each);
    /// more wait in the backlog as ids.
    pub label_queue: usize,
    /// Photo ids the online-labelling backlog holds in memory; past it, photos stay unlabelled
    /// in the catalog and the backlog refills from there once it has worked off what it holds.
    pub label_backlog: usize,
    /// Compression of stored tensors: `zstd`, `deflate` or `none`.
    pub tensor_codec: CodecKind,
    /// Compression level of stored tensors (zstd 1..=22, deflate 0..=9).
    pub tensor_level: i32,
    /// Photos decoded at once (default: one per CPU core).
    pub decode_threads: Option<usize>,
    /// Bytes of memory the decodes in flight may take together, judged from each photo's
    /// header before it is decoded (a photo larger than the budget decodes alone).
    pub decode_budget_bytes: u64,
    /// Folder with the model: `model.json`, the ONNX file and the class names (made by `make
    /// setup`).
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library (default: `MODEL_DIR/lib/libonnxruntime.so`).
    pub ort_lib: Option<PathBuf>,
    /// Run without a model: photos are stored but not labelled until a re-labelling with one.
    pub no_model: bool,
    /// Threads per model run (0: ONNX Runtime decides).
    pub intra_threads: usize,
    /// Largest batch per model run (online labelling and re-labelling).
    pub max_batch: usize,
    /// Images per second the model may do at most, over all its uses (0: no cap): emulates a
    /// slower accelerator, so that several PipeStores on one machine behave like machines of
    /// that rate in experiments.
    pub model_rate_limit: f64,
    /// Where inference runs: `cpu`, `cuda` or `tensorrt`.
    pub execution_provider: ExecutionProvider,
    /// The words model's folder, which maps a search in words ("kitty") onto class names
    /// (unset: `MODEL_DIR/words`, where `make setup` puts it). Without the model the store runs
    /// on and searches by class name; a search in words is then an error.
    pub words_model_dir: Option<PathBuf>,
    /// Least cosine similarity of a class to a search in words (-1..=1); exact class names and
    /// synonyms always match.
    pub words_min_score: f32,
    /// Most classes of each task one search in words maps to (at least 1).
    pub words_max_classes: usize,
    /// Longest wait, in ms, for concurrent uploads to fill an online-labelling batch.
    pub label_wait_ms: u64,
    /// Copies of each photo on the cluster's nodes; 2 or more makes every node's client API a
    /// front door that places photos (needs a PostgreSQL `catalog`); 1 keeps each photo on the
    /// node it was uploaded to. Unset: 2 on a cluster (a `postgres://` catalog and a `tuner`
    /// to join, as `ndpipe pipestore` runs), else 1 (`ndpipe serve`, a SQLite catalog); see
    /// [`Config::replicas`].
    pub replicas: Option<u32>,
    /// Pause between rounds of the replication worker (repair, scrub, free-space report), in ms.
    pub repair_interval_ms: u64,
    /// Local copies the scrub re-reads and verifies per second, photos and plain objects'
    /// files each (0: no scrub).
    pub scrub_photos_per_second: u32,
    /// Photos a node moves to where placement puts them per replication round, at most (each
    /// move is one copy and one drop): how fast a node that joined takes its share, against
    /// the load the moves put on the cluster. At least 1.
    pub rebalance_moves_per_round: u32,
    /// Photos a node's rebalancing looks at per round (one catalog page). At least 1.
    pub rebalance_page_photos: u32,
    /// Deadline of each call to another node (an upload forwarded to its primary), in ms.
    pub peer_timeout_ms: u64,
    /// Deadline of a copy sent to another node, and of the check that an upload's primary is
    /// alive, in ms: a node that does not answer within it is passed over for the next node
    /// of the photo's placement.
    pub copy_timeout_ms: u64,
    /// Where each backbone's similarity index is saved (default: `DATA/index`).
    pub similar_index_dir: Option<PathBuf>,
    /// How often a changed similarity index is saved, in ms (and at a clean stop; after a
    /// crash the index is reconciled with the feature store at start).
    pub similar_save_interval_ms: u64,
    /// Deadline of a similarity query, in ms: nodes that have not answered by then are named
    /// in a partial answer.
    pub similar_timeout_ms: u64,
    /// Similar photos answered when the query names no `k`.
    pub similar_default_k: usize,
    /// Largest `k` a similarity query may ask for.
    pub similar_max_k: usize,
    /// Graph degree (HNSW M) of the similarity index: more finds more true neighbours, at
    /// more memory and build time.
    pub similar_connectivity: usize,
    /// Beam width while adding to the similarity index (HNSW ef_construction).
    pub similar_expansion_add: usize,
    /// Beam width while searching the similarity index (HNSW ef): more finds more true
    /// neighbours, more slowly.
    pub similar_expansion_search: usize,
    /// What an upload of bytes the catalog already has (the same SHA-256, any node's photo on a
    /// shared catalog) does: `existing` answers 200 with the existing photo's id as
    /// `duplicate_of` and stores nothing; `store` stores it as a new photo and says
    /// `duplicate_of` in the 201 (see [`ExactDuplicates`] for why `existing` is the default).
    pub exact_duplicates: ExactDuplicates,
    /// The perceptual hash of near duplicates: `phash`, `gradient` (dHash), `mean` or
    /// `blockhash`, 64 bits each (changing it hashes every photo again).
    pub near_hash: NearHash,
    /// Largest Hamming distance, in bits of 64, between the hashes of near duplicates (0..=32).
    pub near_hamming: u32,
    /// Smallest width and height, in pixels, of a photo paired as a near duplicate (smaller
    /// images hash with too little detail to tell them apart).
    pub near_min_side: u32,
    /// Smallest cosine similarity between the features of semantic duplicates (-1..=1).
    pub semantic_min_cosine: f64,
    /// How long a console session lasts after sign-in, in seconds.
    pub console_session_secs: u64,
    /// Bytes of console thumbnails kept in memory (each made once, then served from here).
    pub console_thumb_cache_bytes: usize,
    /// Samples of the process's counters the console keeps for its storage page (one per
    /// 5 s, the oldest dropped first).
    pub console_history_samples: usize,
    /// Marks the console's session cookie `Secure` (browsers then send it over HTTPS only):
    /// for a console reached through a TLS proxy.
    pub console_secure_cookie: bool,
    /// Testing only: damage the first N feature chunks sent to the Tuner (their checksum then
    /// fails and the Tuner must fetch them again).
    pub fault_corrupt_chunks: u32,
    /// Testing only: refuse the first N head commits (the Tuner must bring the node to the
    /// active version later).
    pub fault_fail_commits: u32,
}

/// The PostgreSQL catalog's options for node `node` from the settings (in ms), all above 0.
pub(crate) fn catalog_options(
    node: &str,
    timeout_ms: u64,
    checkout_ms: u64,
) -> Result<ndpipe_catalog::PgOptions, (&'static str, String)> {
    for (setting, value) in [
        ("catalog_timeout_ms", timeout_ms),
        ("catalog_checkout_ms", checkout_ms),
    ] {
        if value == 0 {
            return Err((setting, "must be above 0".into()));
        }
    }
    Ok(ndpipe_catalog::PgOptions {
        node: node.into(),
        statement_timeout: Duration::from_millis(timeout_ms),
        checkout_timeout: Duration::from_millis(checkout_ms),
        ..ndpipe_catalog::PgOptions::default()
    })
}

/// `key_refresh_ms` as a duration, above 0.
pub(crate) fn key_refresh(ms: u64) -> Result<Duration, (&'static str, String)> {
    if ms == 0 {
        return Err(("key_refresh_ms", "must be above 0".into()));
    }
    Ok(Duration::from_millis(ms))
}

impl Config {
    /// The web console's settings.
    pub(crate) fn console(&self) -> ConsoleSettings {
        ConsoleSettings {
            session_ttl: std::time::Duration::from_secs(self.console_session_secs),
            thumb_cache_bytes: self.console_thumb_cache_bytes,
            history_samples: self.console_history_samples,
            secure_cookie: self.console_secure_cookie,
            max_upload_bytes: self.max_upload_bytes,
        }
    }

    /// Copies of each photo: `replicas`, else 2 when the node runs in a cluster (a shared
    /// PostgreSQL catalog and a Tuner to join) and 1 when it runs alone or embedded, where a
    /// second copy has nowhere to go.
    pub fn replicas(&self) -> u32 {
        let in_cluster = self.tuner.is_some()
            && self
                .catalog
                .as_deref()
                .is_some_and(ndpipe_catalog::is_postgres_url);
        self.replicas.unwrap_or(if in_cluster { 2 } else { 1 })
    }

    /// The settings of duplicate finding.
    pub(crate) fn duplicates(&self) -> DuplicateSettings {
        DuplicateSettings {
            exact: self.exact_duplicates,
            near_hash: self.near_hash,
            near_hamming: self.near_hamming,
            near_min_side: self.near_min_side,
            semantic_min_cosine: self.semantic_min_cosine,
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

    /// The words model's folder: `words_model_dir`, else `MODEL_DIR/words`.
    pub fn words_model_dir(&self) -> PathBuf {
        self.words_model_dir
            .clone()
            .unwrap_or_else(|| self.model_dir.join(ndpipe_model::words::WORDS_SUBDIR))
    }

    /// What a search in words maps to: `words_min_score` and `words_max_classes`.
    pub fn words_options(&self) -> ndpipe_model::words::MatchOptions {
        ndpipe_model::words::MatchOptions {
            min_score: self.words_min_score,
            max_classes: self.words_max_classes,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data: PathBuf::from("data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            s3_listen: None,
            s3_domain: "localhost".into(),
            advertise_url: None,
            name: None,
            tuner: None,
            catalog: None,
            catalog_timeout_ms: 3_000,
            catalog_checkout_ms: 2_000,
            key_refresh_ms: 3_000,
            token: None,
            token_file: None,
            metrics_open: false,
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
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_uploads_per_client: 32,
            max_pixels: ndpipe_model::PreprocessConfig::default().max_pixels,
            max_volume_bytes: 1 << 30,
            min_free_bytes: 256 << 20,
            index_cache_bytes: crate::storage::DEFAULT_INDEX_CACHE_BYTES,
            feature_cache_bytes: crate::storage::DEFAULT_FEATURE_CACHE_BYTES,
            label_queue: 256,
            label_backlog: 100_000,
            tensor_codec: CodecKind::Zstd,
            tensor_level: 3,
            decode_threads: None,
            decode_budget_bytes: 1 << 30,
            model_dir: PathBuf::from(".cache/model"),
            ort_lib: None,
            no_model: false,
            intra_threads: 0,
            max_batch: 32,
            model_rate_limit: 0.0,
            execution_provider: ExecutionProvider::Cpu,
            words_model_dir: None,
            words_min_score: ndpipe_model::words::MatchOptions::default().min_score,
            words_max_classes: ndpipe_model::words::MatchOptions::default().max_classes,
            label_wait_ms: 5,
            fault_corrupt_chunks: 0,
            fault_fail_commits: 0,
            replicas: None,
            repair_interval_ms: 1000,
            scrub_photos_per_second: 20,
            rebalance_moves_per_round: 32,
            rebalance_page_photos: 256,
            peer_timeout_ms: 30_000,
            copy_timeout_ms: 3_000,
            similar_index_dir: None,
            similar_save_interval_ms: 60_000,
            similar_timeout_ms: 2_000,
            similar_default_k: 10,
            similar_max_k: 1000,
            similar_connectivity: 16,
            similar_expansion_add: 128,
            similar_expansion_search: 64,
            exact_duplicates: ExactDuplicates::default(),
            near_hash: NearHash::default(),
            near_hamming: DEFAULT_NEAR_HAMMING,
            near_min_side: DEFAULT_NEAR_MIN_SIDE,
            semantic_min_cosine: DEFAULT_SEMANTIC_MIN_COSINE,
            console_session_secs: DEFAULT_CONSOLE_SESSION_SECS,
            console_thumb_cache_bytes: DEFAULT_CONSOLE_THUMB_CACHE_BYTES,
            console_history_samples: DEFAULT_CONSOLE_HISTORY_SAMPLES,
            console_secure_cookie: false,
        }
    }
}

/// Everything `ndpipe gateway` can be told: the `[gateway]` section of `ndpipe.toml`. A gateway
/// is a front door that holds no photo, so it has no data directory; it needs the cluster's
/// PostgreSQL catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address of the client API (`/v1/photos`, `/v1/cluster`, `/healthz`, `/metrics`).
    pub listen: SocketAddr,
    /// Address of the S3-compatible API (unset: off): photo objects and plain objects placed
    /// on the PipeStores as `/v1` uploads are.
    pub s3_listen: Option<SocketAddr>,
    /// Domain of virtual-host-style S3 requests (`BUCKET.DOMAIN`).
    pub s3_domain: String,
    /// Where S3 multipart uploads in progress are staged until they complete (a multipart
    /// upload is finished through the gateway that started it); unset:
    /// `ndpipe-gateway-s3-uploads` in the system's temporary folder.
    pub s3_staging: Option<PathBuf>,
    /// The cluster's master key file (a PipeStore's `DATA/keys.master`): with it the gateway
    /// checks S3 signatures by access keys; without, only the admin token signs.
    pub keys_master_file: Option<PathBuf>,
    /// The cluster's catalog: a `postgres://` URL (required).
    pub catalog: Option<String>,
    /// Longest a PostgreSQL catalog statement may run, in ms: the server's
    /// `statement_timeout`, and the TCP user timeout of the connection (TCP keepalive probes
    /// every third of it). A request waits on the catalog at most `catalog_checkout_ms` plus
    /// this plus a second, then answers 503 `catalog_unavailable`.
    pub catalog_timeout_ms: u64,
    /// Longest wait, in ms, for a free connection of the PostgreSQL catalog's pool (checked
    /// alive within that time).
    pub catalog_checkout_ms: u64,
    /// How often the access keys are reloaded from the catalog, in ms: a key created or
    /// revoked on another node counts here within that time (keys are checked in memory).
    pub key_refresh_ms: u64,
    /// Copies of each photo placed by this gateway; the PipeStores' `replicas` should be the
    /// same, since their repair brings photos to theirs.
    pub replicas: u32,
    /// Bearer token required for writes (unset: none needed); access keys in the catalog are
    /// checked too.
    pub token: Option<String>,
    /// File whose first line is the bearer token (used when `token` is unset).
    pub token_file: Option<PathBuf>,
    /// Serve `/metrics` without credentials even when access keys exist.
    pub metrics_open: bool,
    /// File whose first line is the cluster secret, sent with every call to a PipeStore;
    /// `ndpipe gateway` refuses to start without it (or mutual TLS) unless `insecure_cluster`.
    pub cluster_secret_file: Option<PathBuf>,
    /// Call the PipeStores without a cluster secret or mutual TLS (a warning at start, every
    /// hour, and `insecure_cluster` in `/healthz`).
    pub insecure_cluster: bool,
    /// This gateway's TLS certificate (PEM): with `tls_key` and `tls_ca`, calls to the
    /// PipeStores are mutual TLS.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM).
    pub tls_ca: Option<PathBuf>,
    /// Longest wait, in ms, for a request's headers.
    pub header_timeout_ms: u64,
    /// Longest wait, in ms, for the next piece of a request body.
    pub body_idle_timeout_ms: u64,
    /// Smallest average rate of a request body, in bytes/s, once it has been arriving for
    /// `body_idle_timeout_ms` (a body that trickles fails); 0: no minimum.
    pub min_body_rate: u64,
    /// HTTP connections served at once; more are closed at once.
    pub max_connections: usize,
    /// Connections one client address may hold of `max_connections`, so that one address
    /// cannot lock the others out; 0: all of them.
    pub max_connections_per_client: usize,
    /// Largest accepted upload, in bytes (no larger than the PipeStores').
    pub max_upload_bytes: usize,
    /// Uploads one client address may have in flight at once; more answer 429. 0: no cap.
    pub max_uploads_per_client: usize,
    /// Deadline of each call to a PipeStore (an upload's ingest and copies included), in ms.
    pub peer_timeout_ms: u64,
    /// Deadline of the check that an upload's primary is alive, in ms: a PipeStore that does
    /// not answer within it is passed over for the next node of the photo's placement.
    pub copy_timeout_ms: u64,
    /// Deadline of a similarity query, in ms: PipeStores that have not answered by then are
    /// named in a partial answer.
    pub similar_timeout_ms: u64,
    /// Similar photos answered when the query names no `k`.
    pub similar_default_k: usize,
    /// Largest `k` a similarity query may ask for.
    pub similar_max_k: usize,
    /// What an upload of bytes the catalog already has (the same SHA-256, any node's photo on a
    /// shared catalog) does: `existing` answers 200 with the existing photo's id as
    /// `duplicate_of` and stores nothing; `store` stores it as a new photo and says
    /// `duplicate_of` in the 201 (see [`ExactDuplicates`] for why `existing` is the default).
    pub exact_duplicates: ExactDuplicates,
    /// The perceptual hash of near duplicates: `phash`, `gradient` (dHash), `mean` or
    /// `blockhash`, 64 bits each (changing it hashes every photo again).
    pub near_hash: NearHash,
    /// Largest Hamming distance, in bits of 64, between the hashes of near duplicates (0..=32).
    pub near_hamming: u32,
    /// Smallest width and height, in pixels, of a photo paired as a near duplicate (smaller
    /// images hash with too little detail to tell them apart).
    pub near_min_side: u32,
    /// Smallest cosine similarity between the features of semantic duplicates (-1..=1).
    pub semantic_min_cosine: f64,
    /// How long a console session lasts after sign-in, in seconds.
    pub console_session_secs: u64,
    /// Bytes of console thumbnails kept in memory (each made once, then served from here).
    pub console_thumb_cache_bytes: usize,
    /// Samples of the process's counters the console keeps for its storage page (one per
    /// 5 s, the oldest dropped first).
    pub console_history_samples: usize,
    /// Marks the console's session cookie `Secure` (browsers then send it over HTTPS only):
    /// for a console reached through a TLS proxy.
    pub console_secure_cookie: bool,
}

impl GatewayConfig {
    /// The web console's settings.
    pub(crate) fn console(&self) -> ConsoleSettings {
        ConsoleSettings {
            session_ttl: std::time::Duration::from_secs(self.console_session_secs),
            thumb_cache_bytes: self.console_thumb_cache_bytes,
            history_samples: self.console_history_samples,
            secure_cookie: self.console_secure_cookie,
            max_upload_bytes: self.max_upload_bytes,
        }
    }

    /// The settings of duplicate finding.
    pub(crate) fn duplicates(&self) -> DuplicateSettings {
        DuplicateSettings {
            exact: self.exact_duplicates,
            near_hash: self.near_hash,
            near_hamming: self.near_hamming,
            near_min_side: self.near_min_side,
            semantic_min_cosine: self.semantic_min_cosine,
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

impl Default for GatewayConfig {
    fn default() -> Self {
        let store = Config::default();
        GatewayConfig {
            listen: store.listen,
            s3_listen: None,
            s3_domain: store.s3_domain.clone(),
            s3_staging: None,
            keys_master_file: None,
            catalog: None,
            catalog_timeout_ms: store.catalog_timeout_ms,
            catalog_checkout_ms: store.catalog_checkout_ms,
            key_refresh_ms: store.key_refresh_ms,
            replicas: 2,
            token: None,
            token_file: None,
            metrics_open: false,
            cluster_secret_file: None,
            insecure_cluster: false,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            header_timeout_ms: store.header_timeout_ms,
            body_idle_timeout_ms: store.body_idle_timeout_ms,
            min_body_rate: store.min_body_rate,
            max_connections: store.max_connections,
            max_connections_per_client: store.max_connections_per_client,
            max_upload_bytes: store.max_upload_bytes,
            max_uploads_per_client: store.max_uploads_per_client,
            peer_timeout_ms: store.peer_timeout_ms,
            copy_timeout_ms: store.copy_timeout_ms,
            similar_timeout_ms: store.similar_timeout_ms,
            similar_default_k: store.similar_default_k,
            similar_max_k: store.similar_max_k,
            exact_duplicates: store.exact_duplicates,
            near_hash: store.near_hash,
            near_hamming: store.near_hamming,
            near_min_side: store.near_min_side,
            semantic_min_cosine: store.semantic_min_cosine,
            console_session_secs: store.console_session_secs,
            console_thumb_cache_bytes: store.console_thumb_cache_bytes,
            console_history_samples: store.console_history_samples,
            console_secure_cookie: store.console_secure_cookie,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_default_to_two_only_in_a_cluster() {
        let pg = Some("postgres://ndpipe@db/ndpipe".to_string());
        let tuner = Some("http://tuner:7070".to_string());
        let with = |catalog: &Option<String>, tuner: &Option<String>, replicas| Config {
            catalog: catalog.clone(),
            tuner: tuner.clone(),
            replicas,
            ..Config::default()
        };
        assert_eq!(with(&pg, &tuner, None).replicas(), 2);
        assert_eq!(with(&pg, &None, None).replicas(), 1, "embedded");
        assert_eq!(with(&None, &tuner, None).replicas(), 1, "SQLite");
        assert_eq!(with(&pg, &tuner, Some(1)).replicas(), 1, "set");
        assert_eq!(with(&None, &None, Some(3)).replicas(), 3);
    }

    #[test]
    fn the_words_model_defaults_to_the_model_dir() {
        let c = Config {
            model_dir: PathBuf::from("/m"),
            ..Config::default()
        };
        assert_eq!(c.words_model_dir(), PathBuf::from("/m/words"));
        let set = Config {
            words_model_dir: Some(PathBuf::from("/w")),
            words_max_classes: 5,
            ..c
        };
        assert_eq!(set.words_model_dir(), PathBuf::from("/w"));
        assert_eq!(set.words_options().max_classes, 5);
        assert_eq!(
            Config::default().words_options(),
            ndpipe_model::words::MatchOptions::default()
        );
    }
}
