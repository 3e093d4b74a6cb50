//! The composition root: [`PipeStore::open`] builds a whole node from its [`Config`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ndpipe_catalog::{Catalog, ReplicaCatalog};
use ndpipe_model::{InferenceBackend, PreprocessConfig, RuntimeConfig};
use ndpipe_proto::transport::{ClusterSecret, Tls};
use tracing::info;

use crate::config::Config;
use crate::error::Error;
use crate::inference::backbones::{BackboneDirs, BackboneLoader};
use crate::inference::heads::HeadDir;
use crate::inference::labeler::{Labeler, LabelerConfig};
use crate::inference::model::Models;
use crate::inference::{ActiveModel, RelabelOptions};
use crate::ingest::{IngestConfig, Ingestor};
use crate::jobs::Jobs;
use crate::keys::KeyStore;
use crate::metrics::StoreMetrics;
use crate::node::PipeStoreNode;
use crate::replication::{FrontDoorConfig, RepairConfig, Replication, ReplicationParts};
use crate::similar::{NodeSimilar, SimilarError};
use crate::storage::{Blobs, FeatureStore, PhotoIds, PhotoStore, StoreConfig, StoreError};

/// A PipeStore, opened and ready to serve: its photo and feature stores, catalog, model,
/// online labelling, jobs and Tuner-facing node. [`PipeStore::start`] serves it.
pub struct PipeStore {
    pub(crate) config: Config,
    pub(crate) name: String,
    pub(crate) cluster_secret: Option<ClusterSecret>,
    pub(crate) tls: Option<Tls>,
    pub(crate) store: Arc<PhotoStore>,
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) metrics: Arc<StoreMetrics>,
    pub(crate) ingestor: Arc<Ingestor>,
    pub(crate) jobs: Arc<Jobs>,
    pub(crate) node: Option<Arc<PipeStoreNode>>,
    pub(crate) models: Option<Arc<Models>>,
    pub(crate) keys: Arc<KeyStore>,
    pub(crate) replication: Option<Arc<Replication>>,
    /// The plain S3 objects' files held here (`DATA/objects`).
    pub(crate) blobs: Arc<Blobs>,
    /// Similar photos: this node's index and its front door's queries.
    pub(crate) similar: NodeSimilar,
}

impl PipeStore {
    /// Builds the whole service from `config`, logging each step: opens the photo store
    /// (`DATA/store`, recovering from a crash) and its feature store, the catalog
    /// (`DATA/catalog.sqlite`), the model (unless `no_model`; its pretrained version is
    /// registered and becomes active when none is, and the active fine-tuned head in
    /// `DATA/heads` is loaded), online labelling, ingest, the Tuner-facing node and jobs; then
    /// reconciles the catalog with the store and resumes an interrupted re-labelling.
    pub async fn open(config: Config) -> Result<PipeStore, Error> {
        let backend = if config.no_model {
            info!("no model: photos are stored without labels");
            None
        } else {
            Some(load_model(&config).await?)
        };
        Self::with_backend(config, backend).await
    }

    /// [`PipeStore::open`] with an already loaded backbone (`None`: no model).
    pub(crate) async fn with_backend(
        config: Config,
        backend: Option<Arc<dyn InferenceBackend>>,
    ) -> Result<PipeStore, Error> {
        info!(data = %config.data.display(), listen = %config.listen, token = config.token.is_some() || config.token_file.is_some(), "opening the PipeStore");
        let codec = config
            .tensor_codec
            .at(config.tensor_level)
            .map_err(|e| Error::Config {
                setting: "tensor_level",
                reason: e.to_string(),
            })?;
        check_rebalance(&config)?;
        config
            .duplicates()
            .check()
            .map_err(|(setting, reason)| Error::Config { setting, reason })?;
        let token = token(config.token.as_ref(), config.token_file.as_ref())?;
        let cluster_secret = cluster_secret(config.cluster_secret_file.as_ref())?;
        let tls = tls(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            config.tls_ca.as_deref(),
        )?;
        let name = node_name(config.name.as_deref(), &config.data);
        let (catalog, ids, replica_map) = open_catalog(&config, &name).await?;
        let (store, features) = open_stores(&config, ids.clone()).await?;
        let blobs_dir = config.data.join("objects");
        let blobs = Arc::new(Blobs::open(blobs_dir.clone()).map_err(|source| Error::Io {
            path: blobs_dir,
            source,
        })?);
        let keys = Arc::new(KeyStore::with_catalog(
            catalog.clone(),
            &config.data,
            token.clone(),
            crate::config::key_refresh(config.key_refresh_ms)
                .map_err(|(setting, reason)| Error::Config { setting, reason })?,
        )?);
        let metrics = Arc::new(StoreMetrics::default());
        let models = match backend {
            Some(backend) => Some(open_models(&config, backend, catalog.clone()).await?),
            None => None,
        };
        let similar = NodeSimilar::open(
            &config,
            &name,
            (store.clone(), features.clone()),
            models.as_ref().map(|m| m.active().clone()),
            metrics.similar.clone(),
            replica_map
                .clone()
                .filter(|_| config.replicas() > 1)
                .map(|map| (map, cluster_secret.clone(), tls.clone())),
        )
        .map_err(similar_error)?;
        let loader = backbone_loader(&config)?;
        let labeler_config = LabelerConfig {
            max_batch: config.max_batch,
            max_wait: Duration::from_millis(config.label_wait_ms),
            queue: config.label_queue,
            backlog: config.label_backlog,
            ..LabelerConfig::default()
        };
        let relabel = RelabelOptions {
            batch: config.max_batch,
            top_k: labeler_config.top_k,
            ..RelabelOptions::default()
        };
        let node = models.as_ref().map(|models| {
            Arc::new(
                PipeStoreNode::new(
                    store.clone(),
                    features.clone(),
                    catalog.clone(),
                    models.clone(),
                    relabel.clone(),
                    BackboneDirs::new(&config.data),
                    loader.clone(),
                )
                .with_corrupt_chunks(config.fault_corrupt_chunks)
                .with_failing_commits(config.fault_fail_commits)
                .with_cluster_secret(cluster_secret.clone())
                .with_tls(tls.clone())
                .with_replicas(replica_map.clone(), &name)
                .with_duplicates(config.duplicates()),
            )
        });
        let ingest_config = IngestConfig {
            preprocess: PreprocessConfig {
                max_pixels: config.max_pixels,
                ..PreprocessConfig::default()
            },
            tensor_codec: codec,
            max_parallel_decodes: config
                .decode_threads
                .unwrap_or_else(|| IngestConfig::default().max_parallel_decodes),
            decode_budget_bytes: config.decode_budget_bytes,
            exact_duplicates: config.exact_duplicates,
        };
        let mut ingestor = Ingestor::new(
            store.clone(),
            features.clone(),
            catalog.clone(),
            metrics.clone(),
            ingest_config,
        );
        if let Some(models) = &models {
            let labeler = Labeler::start(
                models.active().clone(),
                store.clone(),
                features.clone(),
                catalog.clone(),
                metrics.clone(),
                labeler_config,
            )
            .map_err(|source| Error::Spawn {
                what: "the labelling thread",
                source,
            })?;
            ingestor = ingestor.with_labeler(labeler);
            info!("online labelling started");
        }
        let ingestor = Arc::new(ingestor);
        let replication = match (config.replicas(), replica_map, ids) {
            (0 | 1, _, _) => None,
            (_, Some(map), PhotoIds::Blocks(blocks)) => {
                let parts = ReplicationParts {
                    name: name.clone(),
                    catalog: map,
                    blocks,
                    store: store.clone(),
                    blobs: blobs.clone(),
                    features: features.clone(),
                    model: models.as_ref().map(|m| m.active().clone()),
                    ingestor: ingestor.clone(),
                    metrics: metrics.clone(),
                    secret: cluster_secret.clone(),
                    tls: tls.clone(),
                };
                Some(Arc::new(start_replication(&config, parts).await?))
            }
            _ => {
                return Err(Error::Config {
                    setting: "replicas",
                    reason: format!(
                        "{} copies need a catalog the nodes share: give a postgres:// catalog",
                        config.replicas()
                    ),
                });
            }
        };
        let reconciled = ingestor.reconcile().await.map_err(|e| Error::Startup {
            step: "reconciling the catalog with the store",
            source: Box::new(e),
        })?;
        info!(?reconciled, "catalog reconciled");
        let jobs = Arc::new(Jobs::new(
            store.clone(),
            features,
            catalog.clone(),
            models.as_ref().map(|m| m.active().clone()),
            relabel,
        ));
        let resumer = jobs.clone();
        let resumed = tokio::task::spawn_blocking(move || resumer.resume_interrupted())
            .await?
            .map_err(|e| Error::Startup {
                step: "resuming an interrupted job",
                source: Box::new(e),
            })?;
        if let Some(id) = resumed {
            info!(job = %id, "resumed an interrupted job");
        }
        Ok(PipeStore {
            config,
            name,
            cluster_secret,
            tls,
            store,
            catalog,
            metrics,
            ingestor,
            jobs,
            node,
            models,
            keys,
            replication,
            blobs,
            similar,
        })
    }

    /// The name this node registers with: `config.name`, else `pipestore-` and the name of the
    /// canonical data directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backbone this node runs (`None` without a model), e.g. for an embedded Tuner's
    /// conventional mode.
    pub fn backbone(&self) -> Option<Arc<dyn InferenceBackend>> {
        self.node.as_ref().map(|n| n.backbone())
    }
}

/// How this node loads backbones: ONNX Runtime with `config`'s settings, capped at
/// `config.model_rate_limit`.
fn backbone_loader(config: &Config) -> Result<BackboneLoader, Error> {
    let runtime = RuntimeConfig {
        dylib: config
            .ort_lib
            .clone()
            .unwrap_or_else(|| RuntimeConfig::for_model_dir(&config.model_dir).dylib),
        intra_threads: config.intra_threads,
        max_batch: config.max_batch,
        execution_provider: config.execution_provider,
    };
    let rate = config.model_rate_limit;
    if !(rate.is_finite() && rate >= 0.0) {
        return Err(Error::Config {
            setting: "model_rate_limit",
            reason: format!("{rate} is not a rate: give images per second >= 0 (0: no cap)"),
        });
    }
    Ok(BackboneLoader {
        runtime,
        rate_limit: rate,
    })
}

/// Loads the backbone a rollout committed (`DATA/backbones/active`), else the ONNX model of
/// `config.model_dir`, with ONNX Runtime.
async fn load_model(config: &Config) -> Result<Arc<dyn InferenceBackend>, Error> {
    let loader = backbone_loader(config)?;
    if loader.rate_limit > 0.0 {
        info!(
            images_per_second = loader.rate_limit,
            "model throughput capped (an emulated slower accelerator)"
        );
    }
    let committed = BackboneDirs::new(&config.data)
        .active()
        .map_err(|e| Error::Startup {
            step: "reading the committed backbone's name",
            source: Box::new(e),
        })?;
    let dir = committed.unwrap_or_else(|| config.model_dir.clone());
    let at = dir.clone();
    tokio::task::spawn_blocking(move || loader.load(&at))
        .await?
        .map_err(|source| Error::Model { dir, source })
}

/// A similarity setting out of range as a configuration error, anything else as a start-up
/// failure.
fn similar_error(e: SimilarError) -> Error {
    match e {
        SimilarError::Config { setting, reason } => Error::Config { setting, reason },
        e => Error::Startup {
            step: "starting the similarity index",
            source: Box::new(e),
        },
    }
}

/// Refuses rebalancing limits of 0, which would stop rebalancing.
fn check_rebalance(config: &Config) -> Result<(), Error> {
    for (setting, value) in [
        (
            "rebalance_moves_per_round",
            config.rebalance_moves_per_round,
        ),
        ("rebalance_page_photos", config.rebalance_page_photos),
    ] {
        if value == 0 {
            return Err(Error::Config {
                setting,
                reason: "0 would stop rebalancing: give 1 or more".into(),
            });
        }
    }
    Ok(())
}

/// Replication of this node with `config`'s settings, after the start-up sweep (copies of
/// deleted photos and of uploads that never finished dropped).
async fn start_replication(config: &Config, parts: ReplicationParts) -> Result<Replication, Error> {
    let replication = Replication::new(
        parts,
        FrontDoorConfig::new(
            config.replicas(),
            (config.peer_timeout_ms, config.copy_timeout_ms),
            config.max_upload_bytes,
        ),
        RepairConfig {
            interval: Duration::from_millis(config.repair_interval_ms.max(10)),
            scrub_per_second: config.scrub_photos_per_second,
            rebalance_moves: config.rebalance_moves_per_round,
            rebalance_page: config.rebalance_page_photos,
        },
    );
    let swept = replication.sweep().await.map_err(|e| Error::Startup {
        step: "sweeping copies of deleted and unfinished photos",
        source: Box::new(e),
    })?;
    info!(replicas = config.replicas(), ?swept, "replication ready");
    Ok(replication)
}

/// The catalog's replica map, when it has one (PostgreSQL).
type ReplicaMap = Option<Arc<dyn ReplicaCatalog>>;

/// Opens the catalog that `config.catalog` names, as node `name`, and says where photo ids come
/// from: blocks of a shared catalog, or the store's own counter.
async fn open_catalog(
    config: &Config,
    name: &str,
) -> Result<(Arc<dyn Catalog>, PhotoIds, ReplicaMap), Error> {
    let spec = config.catalog.clone().unwrap_or_default();
    let default = config.data.join("catalog.sqlite");
    let what = ndpipe_catalog::describe(&spec, &default);
    let node = name.to_string();
    let data = config.data.clone();
    std::fs::create_dir_all(&data).map_err(|e| Error::Store {
        source: StoreError::io("create the data directory", &data)(e),
        path: data,
    })?;
    let options = crate::config::catalog_options(
        &node,
        config.catalog_timeout_ms,
        config.catalog_checkout_ms,
    )
    .map_err(|(setting, reason)| Error::Config { setting, reason })?;
    let opened =
        tokio::task::spawn_blocking(move || ndpipe_catalog::open_with(&spec, &options, &default))
            .await?
            .map_err(|source| Error::Catalog {
                what: what.clone(),
                source,
            })?;
    let ids = match opened.photo_ids {
        Some(blocks) => PhotoIds::Blocks(blocks),
        None => PhotoIds::Own,
    };
    let shared = matches!(ids, PhotoIds::Blocks(_));
    if shared {
        crate::catalog_deadline::set(config.catalog_checkout_ms, config.catalog_timeout_ms);
    }
    info!(catalog = %what, shared, "catalog open");
    Ok((opened.catalog, ids, opened.replicas))
}

/// Opens the photo store in `DATA/store` (crash recovery) and its feature store.
async fn open_stores(
    config: &Config,
    ids: PhotoIds,
) -> Result<(Arc<PhotoStore>, Arc<FeatureStore>), Error> {
    let dir = config.data.join("store");
    let store_config = StoreConfig {
        max_volume_bytes: config.max_volume_bytes,
        min_free_bytes: config.min_free_bytes,
        ids,
        index_cache_bytes: config.index_cache_bytes,
    };
    let feature_cache_bytes = config.feature_cache_bytes;
    let (store, recovery, features) = tokio::task::spawn_blocking(move || {
        let (store, recovery) =
            PhotoStore::open(&dir, &store_config).map_err(|source| Error::Store {
                path: dir.clone(),
                source,
            })?;
        let path = dir.join("features.redb");
        let features = FeatureStore::open(&path, feature_cache_bytes)
            .map_err(|source| Error::Store { path, source })?;
        Ok::<_, Error>((store, recovery, features))
    })
    .await??;
    info!(?recovery, "photo store ready");
    Ok((Arc::new(store), Arc::new(features)))
}

/// The models of a node running `backend`: its pretrained version registered as the general
/// task's, every task's active head loaded from `DATA/heads`.
async fn open_models(
    config: &Config,
    backend: Arc<dyn InferenceBackend>,
    catalog: Arc<dyn Catalog>,
) -> Result<Arc<Models>, Error> {
    let heads = config.data.join("heads");
    let pretrained = ActiveModel::pretrained(backend);
    let dir = heads.clone();
    let models =
        tokio::task::spawn_blocking(move || Models::open(pretrained, catalog, HeadDir::open(dir)?))
            .await?
            .map_err(|source| Error::Models { heads, source })?;
    let active = models.active().get();
    info!(serving = %active.serving(), backbone = %active.info().backbone_version, "model loaded");
    Ok(Arc::new(models))
}

/// The bearer token: `token`, else the first line of `token_file`.
pub(crate) fn token(
    token: Option<&String>,
    token_file: Option<&PathBuf>,
) -> Result<Option<String>, Error> {
    match (token, token_file) {
        (Some(t), _) => Ok(Some(t.clone())),
        (None, Some(path)) => ndpipe_util::fs::read_secret(path)
            .map(Some)
            .map_err(|source| Error::TokenFile {
                path: path.clone(),
                source,
            }),
        (None, None) => Ok(None),
    }
}

/// Mutual TLS from the certificate, key and CA files, when all three are set.
pub(crate) fn tls(
    cert: Option<&Path>,
    key: Option<&Path>,
    ca: Option<&Path>,
) -> Result<Option<Tls>, Error> {
    Tls::from_files(cert, key, ca).map_err(|e| Error::Config {
        setting: "tls_cert, tls_key, tls_ca",
        reason: e.to_string(),
    })
}

/// The cluster secret: the first line of `file`, when set.
pub(crate) fn cluster_secret(file: Option<&PathBuf>) -> Result<Option<ClusterSecret>, Error> {
    let Some(path) = file else {
        return Ok(None);
    };
    let secret = ndpipe_util::fs::read_secret(path).map_err(|source| Error::SecretFile {
        path: path.clone(),
        source,
    })?;
    Ok(ClusterSecret::new(&secret))
}

/// `name`, else `pipestore-` and the name of the canonical data directory.
fn node_name(name: Option<&str>, data: &Path) -> String {
    name.map(str::to_string).unwrap_or_else(|| {
        let dir = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
        format!(
            "pipestore-{}",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("data")
        )
    })
}
