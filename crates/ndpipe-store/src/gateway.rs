//! A gateway: the cluster's front door as a process of its own, holding no photo. It places
//! each upload on `replicas` live PipeStores by the rendezvous hashing they use, has the
//! primary ingest it and copy it to the others (201 once every copy is durable and
//! catalogued), reads any copy with its checksum verified, and deletes behind a tombstone:
//! the same [`FrontDoor`] a replicated PipeStore runs, without the local shortcuts. With
//! `s3_listen` it serves the S3 API too: photo objects through the front door, plain objects
//! placed on `replicas` PipeStores the same way. Clients are checked as a PipeStore checks them
//! (bearer token, access keys' secrets by hash, S3 signatures with the cluster's
//! `keys.master`); calls to the PipeStores carry the cluster secret.

use std::net::SocketAddr;
use std::sync::Arc;

use ndpipe_catalog::{Catalog, PgCatalog, is_postgres_url};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::api::console::{self, Console};
use crate::api::http::{self, GatewayState};
use crate::config::GatewayConfig;
use crate::duplicates::exact::ExactCheck;
use crate::error::Error;
use crate::keys::KeyStore;
use crate::metrics::StoreMetrics;
use crate::pipestore::{cluster_secret, tls, token};
use crate::replication::{FrontDoor, FrontDoorConfig};
use crate::server::{S3Listen, bind, local_addr, start_s3};
use crate::similar::{ClusterAccess, SimilarError, SimilarFront, front_settings};

/// The name a gateway's catalog handle goes by (it owns no photos, jobs or ids).
const CATALOG_NODE: &str = "gateway";

/// A gateway, connected to the catalog and ready to serve.
pub struct Gateway {
    config: GatewayConfig,
    front: Arc<FrontDoor>,
    catalog: Arc<dyn Catalog>,
    keys: Arc<KeyStore>,
    metrics: Arc<StoreMetrics>,
    similar: Arc<SimilarFront>,
}

impl Gateway {
    /// Reads the token, cluster secret and TLS files of `config` and connects to its
    /// PostgreSQL catalog. Fails with [`Error::Config`] when `catalog` is not a `postgres://`
    /// URL or `replicas` is 0.
    pub async fn open(config: GatewayConfig) -> Result<Gateway, Error> {
        let url = match &config.catalog {
            Some(url) if is_postgres_url(url) => url.clone(),
            _ => {
                return Err(Error::Config {
                    setting: "catalog",
                    reason: "a gateway needs the cluster's postgres:// catalog".into(),
                });
            }
        };
        config
            .duplicates()
            .check()
            .map_err(|(setting, reason)| Error::Config { setting, reason })?;
        if config.replicas == 0 {
            return Err(Error::Config {
                setting: "replicas",
                reason: "at least one copy of each photo is needed".into(),
            });
        }
        let token = token(config.token.as_ref(), config.token_file.as_ref())?;
        let secret = cluster_secret(config.cluster_secret_file.as_ref())?;
        let tls = tls(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            config.tls_ca.as_deref(),
        )?;
        let what = ndpipe_catalog::describe(&url, std::path::Path::new(""));
        let options = crate::config::catalog_options(
            CATALOG_NODE,
            config.catalog_timeout_ms,
            config.catalog_checkout_ms,
        )
        .map_err(|(setting, reason)| Error::Config { setting, reason })?;
        let key_refresh = crate::config::key_refresh(config.key_refresh_ms)
            .map_err(|(setting, reason)| Error::Config { setting, reason })?;
        let pg = tokio::task::spawn_blocking(move || PgCatalog::connect_with(&url, &options))
            .await?
            .map_err(|source| Error::Catalog {
                what: what.clone(),
                source,
            })?;
        let pg = Arc::new(pg);
        crate::catalog_deadline::set(config.catalog_checkout_ms, config.catalog_timeout_ms);
        info!(catalog = %what, replicas = config.replicas, "gateway catalog open");
        let metrics = Arc::new(StoreMetrics::default());
        let similar = SimilarFront::new(
            front_settings(
                config.similar_timeout_ms,
                config.similar_default_k,
                config.similar_max_k,
            )
            .map_err(|e| match e {
                SimilarError::Config { setting, reason } => Error::Config { setting, reason },
                e => Error::Config {
                    setting: "similar_timeout_ms",
                    reason: e.to_string(),
                },
            })?,
            metrics.similar.clone(),
            None,
            Some(ClusterAccess {
                catalog: pg.clone(),
                secret: secret.clone(),
                tls: tls.clone(),
                max_message: config.max_upload_bytes.saturating_add(1 << 20),
            }),
        );
        let exact = ExactCheck::new(config.exact_duplicates, pg.clone());
        let front = FrontDoor::new(
            None,
            (pg.clone(), exact),
            metrics.clone(),
            (secret, tls),
            FrontDoorConfig::new(
                config.replicas,
                (config.peer_timeout_ms, config.copy_timeout_ms),
                config.max_upload_bytes,
            ),
        );
        Ok(Gateway {
            keys: Arc::new(KeyStore::without_data(
                pg.clone(),
                config.keys_master_file.as_deref(),
                token,
                key_refresh,
            )?),
            front: Arc::new(front),
            catalog: pg,
            metrics,
            similar: Arc::new(similar),
            config,
        })
    }

    /// Binds `config.listen` and serves the client API until [`RunningGateway::stop`].
    pub async fn start(self) -> Result<RunningGateway, Error> {
        let Gateway {
            config,
            front,
            catalog,
            keys,
            metrics,
            similar,
        } = self;
        let state = GatewayState::new(front.clone(), catalog.clone(), metrics.clone(), similar)
            // Semantic pairs come from the PipeStores' indexes, each over its own photos; a
            // gateway holds none, so `level=semantic` is refused here and asked of a PipeStore.
            .with_duplicates(config.duplicates(), None)
            .with_insecure_cluster(
                config.cluster_secret_file.is_none() && config.tls_cert.is_none(),
            );
        let objects = state.objects();
        let console = Console::gateway(
            axum::extract::FromRef::from_ref(&state),
            state.similar(),
            keys.clone(),
            config.console(),
        );
        let guard = http::Guard {
            keys: keys.clone(),
            metrics: Some(metrics),
            metrics_open: config.metrics_open,
        };
        let app = http::gateway_router(
            state,
            config.max_upload_bytes,
            config.max_uploads_per_client,
        )
        .merge(console::router(console))
        .layer(axum::middleware::from_fn_with_state(guard, http::authorize));
        let listener = bind("HTTP", config.listen).await?;
        let http_addr = local_addr("HTTP", &listener, config.listen)?;
        let (shutdown, stopped) = watch::channel(false);
        let s3 = match config.s3_listen {
            Some(addr) => Some(
                start_s3(
                    S3Listen {
                        addr,
                        domain: &config.s3_domain,
                        staging: config.s3_staging.clone().unwrap_or_else(|| {
                            std::env::temp_dir().join("ndpipe-gateway-s3-uploads")
                        }),
                        max_upload_bytes: config.max_upload_bytes,
                        limits: config.http_limits(),
                    },
                    objects,
                    catalog,
                    keys,
                    &stopped,
                )
                .await?,
            ),
            None => None,
        };
        let mut stop = stopped.clone();
        let http = tokio::spawn(ndpipe_util::serve::serve(
            listener,
            app,
            config.http_limits(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ));
        info!(%http_addr, "gateway listening");
        Ok(RunningGateway {
            http_addr,
            s3,
            shutdown,
            http,
        })
    }
}

/// A gateway serving in this process.
pub struct RunningGateway {
    http_addr: SocketAddr,
    s3: Option<(SocketAddr, JoinHandle<()>)>,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<()>,
}

impl RunningGateway {
    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound address of the S3 API (`None` when `s3_listen` is unset).
    pub fn s3_addr(&self) -> Option<SocketAddr> {
        self.s3.as_ref().map(|(addr, _)| *addr)
    }

    /// Stops accepting requests and drains those in flight.
    pub async fn stop(self) -> Result<(), Error> {
        let _ = self.shutdown.send(true);
        self.http.await?;
        if let Some((_, s3)) = self.s3 {
            s3.await?;
        }
        info!("gateway stopped");
        Ok(())
    }
}
