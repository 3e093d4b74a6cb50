//! Serving a PipeStore: the HTTP API and the Tuner-facing gRPC service until [`Running::stop`],
//! and membership in a Tuner's cluster (`membership`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ndpipe_catalog::Catalog;
use ndpipe_util::serve::HttpLimits;

use ndpipe_proto::transport::{self, ClusterSecret, Tls};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::api::console::{self, Console};
use crate::api::grpc::PipeStoreService;
use crate::api::http::{self, AppState};
use crate::api::replication::ReplicationService;
use crate::api::s3;
use crate::api::similar::SimilarService;
use crate::duplicates::hasher::HashWorker;
use crate::error::Error;
use crate::ingest::Ingestor;
use crate::jobs::Jobs;
use crate::keys::KeyStore;
use crate::membership::{self, Member, Readiness};
use crate::node::PipeStoreNode;
use crate::objects::{Local, Replicated, SharedObjects};
use crate::pipestore::PipeStore;
use crate::similar::{IndexPairs, NodeSimilar};
use crate::storage::PhotoStore;
use crate::words::Words;

impl PipeStore {
    /// Binds `config.listen` (HTTP), `config.s3_listen` (S3) when set and, when a model is
    /// loaded, `config.grpc_listen` (gRPC), and serves them until [`Running::stop`]. Every
    /// HTTP call (the merged routes included) and every S3 call is checked against the access
    /// keys and the token.
    ///
    /// `extra_http` is merged into the HTTP router (an embedded Tuner's `/v1/tuner` routes), and
    /// `extra_grpc` is served next to the node's service (an embedded Tuner's service). Without
    /// a model there is no node service and no gRPC server at all, so `extra_grpc` is not
    /// served either (a warning says so). When `config.tuner` is set and the node service runs,
    /// the node joins that Tuner's cluster in the background (see [`Running::join`]).
    pub async fn start(
        self,
        extra_http: Option<axum::Router>,
        extra_grpc: Option<tonic::service::Routes>,
    ) -> Result<Running, Error> {
        let PipeStore {
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
        } = self;
        let (shutdown, stopped) = watch::channel(false);
        let mut grpc = None;
        let mut grpc_url = None;
        match &node {
            Some(node) => {
                let listener = bind("gRPC", config.grpc_listen).await?;
                let addr = local_addr("gRPC", &listener, config.grpc_listen)?;
                let mut routes =
                    extra_grpc
                        .unwrap_or_default()
                        .add_service(PipeStoreService::server(
                            node.clone(),
                            cluster_secret.clone(),
                        ));
                if let Some(replication) = &replication {
                    routes = routes.add_service(ReplicationService::server(
                        replication.clone(),
                        cluster_secret.clone(),
                    ));
                }
                if let (Some(index), Some(embedder)) = (&similar.index, &similar.embedder) {
                    routes = routes.add_service(SimilarService::server(
                        index.clone(),
                        embedder.clone(),
                        store.clone(),
                        metrics.similar.clone(),
                        (cluster_secret.clone(), similar.max_message),
                    ));
                }
                let server = transport::server(tls.as_ref()).map_err(|e| Error::Config {
                    setting: "tls_cert, tls_key, tls_ca",
                    reason: e.to_string(),
                })?;
                grpc = Some(tokio::spawn(serve_grpc(
                    server,
                    listener,
                    routes,
                    stopped.clone(),
                )));
                let url = config.advertise_url.clone().unwrap_or_else(|| {
                    let scheme = if tls.is_some() { "https" } else { "http" };
                    format!("{scheme}://{addr}")
                });
                info!(%url, "gRPC service listening");
                grpc_url = Some(url);
            }
            None if extra_grpc.is_some() => {
                warn!("no model: no gRPC server runs, so the extra gRPC services are not served");
            }
            None => {}
        }
        let readiness = Arc::new(Readiness::default());
        let objects: SharedObjects = match &replication {
            Some(r) => Arc::new(Replicated::new(
                r.clone(),
                ingestor.clone(),
                catalog.clone(),
            )),
            None => Arc::new(Local::new(
                ingestor.clone(),
                store.clone(),
                blobs.clone(),
                catalog.clone(),
            )),
        };
        let s3 = match config.s3_listen {
            Some(addr) => Some(
                start_s3(
                    S3Listen {
                        addr,
                        domain: &config.s3_domain,
                        staging: config.data.join("s3-uploads"),
                        max_upload_bytes: config.max_upload_bytes,
                        limits: config.http_limits(),
                    },
                    objects.clone(),
                    catalog.clone(),
                    keys.clone(),
                    &stopped,
                )
                .await?,
            ),
            None => None,
        };
        let words = models.as_ref().map(|m| {
            Words::start(
                config.words_model_dir(),
                config.data.join("words"),
                config.words_options(),
                &m.active().get(),
            )
        });
        let catalog_for_hashes = catalog.clone();
        let state = AppState::new(
            (ingestor.clone(), objects),
            store.clone(),
            catalog,
            jobs.clone(),
            metrics.clone(),
            keys.clone(),
        )
        .named(&name)
        .with_readiness(readiness.clone(), node.is_some())
        .with_insecure_cluster(cluster_secret.is_none() && tls.is_none())
        .with_models(models.clone(), words)
        .with_similar(similar.front.clone())
        .with_duplicates(
            config.duplicates(),
            similar.front.clone().map(IndexPairs::source),
        );
        let hashing = HashWorker::new(
            store.clone(),
            catalog_for_hashes,
            config.near_hash,
            ingestor.hash_queue(),
        )
        .map_err(|source| Error::Thread {
            what: "perceptual hashing",
            source,
        })?;
        tokio::spawn(hashing.run(stopped.clone()));
        if let Some(replication) = replication {
            tokio::spawn(replication.run_worker(stopped.clone()));
            info!("replication worker started (repair, scrub, free-space reports)");
        }
        let guard = http::Guard {
            keys: keys.clone(),
            metrics: Some(metrics),
            metrics_open: config.metrics_open,
        };
        // The console calls the Tuner in-process behind the same guard as `/v1/tuner`, so its
        // key decides exactly as it would there.
        let guarded_tuner = extra_http.clone().map(|tuner| {
            tuner.layer(axum::middleware::from_fn_with_state(
                guard.clone(),
                http::authorize,
            ))
        });
        let console =
            Console::node(&state, keys.clone(), config.console()).with_tuner(guarded_tuner);
        let mut app = http::router(
            state,
            config.max_upload_bytes,
            config.max_uploads_per_client,
        )
        .merge(console::router(console));
        if let Some(extra) = extra_http {
            app = app.merge(extra);
        }
        let app = app.layer(axum::middleware::from_fn_with_state(guard, http::authorize));
        let listener = bind("HTTP", config.listen).await?;
        let http_addr = local_addr("HTTP", &listener, config.listen)?;
        let mut http_stopped = stopped;
        let limits = config.http_limits();
        let http = tokio::spawn(ndpipe_util::serve::serve(
            listener,
            app,
            limits,
            async move {
                let _ = http_stopped.wait_for(|s| *s).await;
            },
        ));
        info!(%http_addr, "listening");
        let (s3_addr, s3) = s3.unzip();
        let mut running = Running {
            http_addr,
            s3_addr,
            s3,
            name,
            grpc_url,
            node,
            shutdown,
            http,
            grpc,
            membership: None,
            cluster_secret,
            tls,
            readiness,
            jobs,
            ingestor,
            store,
            similar,
            replicas: config.replicas(),
        };
        if let Some(tuner) = config.tuner {
            running.join(tuner);
        }
        Ok(running)
    }
}

/// A PipeStore serving in this process.
pub struct Running {
    http_addr: SocketAddr,
    s3_addr: Option<SocketAddr>,
    s3: Option<JoinHandle<()>>,
    name: String,
    grpc_url: Option<String>,
    node: Option<Arc<PipeStoreNode>>,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<()>,
    grpc: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    membership: Option<JoinHandle<()>>,
    cluster_secret: Option<ClusterSecret>,
    tls: Option<Tls>,
    readiness: Arc<Readiness>,
    jobs: Arc<Jobs>,
    ingestor: Arc<Ingestor>,
    store: Arc<PhotoStore>,
    /// Similar photos: the index is saved at stop.
    similar: NodeSimilar,
    /// Copies of each photo (`config.replicas()`), told to the Tuner.
    replicas: u32,
}

impl Running {
    /// The bound HTTP address (the real port when `config.listen` asked for port 0).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound address of the S3 API (`None` when `config.s3_listen` is unset).
    pub fn s3_addr(&self) -> Option<SocketAddr> {
        self.s3_addr
    }

    /// The URL the Tuner reaches this node's gRPC service at (`config.advertise_url`, else
    /// `http://` (`https://` with TLS) and the bound address); `None` when no model is loaded,
    /// so no gRPC runs.
    pub fn grpc_url(&self) -> Option<&str> {
        self.grpc_url.as_deref()
    }

    /// Joins the cluster of the Tuner whose gRPC service is at `tuner` (an embedded Tuner's is
    /// this node's own [`Running::grpc_url`]): registers in the background, then renews the
    /// node's lease with a heartbeat, registering again whenever the Tuner forgot the node and
    /// retrying while it is unreachable. Replaces an earlier membership; does nothing without a
    /// model (no node service).
    pub fn join(&mut self, tuner: String) {
        let (Some(node), Some(url)) = (&self.node, &self.grpc_url) else {
            return;
        };
        let member = Member {
            tuner,
            name: self.name.clone(),
            url: url.clone(),
            node: node.clone(),
            secret: self.cluster_secret.clone(),
            tls: self.tls.clone(),
            readiness: self.readiness.clone(),
            replicas: self.replicas,
        };
        self.readiness.start_joining();
        if let Some(old) = self.membership.take() {
            old.abort();
        }
        let stopped = self.shutdown.subscribe();
        self.membership = Some(tokio::spawn(membership::run(member, stopped)));
    }

    /// Stops accepting requests, drains those in flight and joins the HTTP and gRPC servers and
    /// the membership loop; then stops the running job at its next batch (it resumes at the
    /// next start), online labelling, the similarity index (saved) and the store writer. Every step runs even when one
    /// fails; the first failure is returned.
    pub async fn stop(self) -> Result<(), Error> {
        let _ = self.shutdown.send(true);
        let mut first: Option<Error> = None;
        let mut keep = |result: Result<(), Error>| {
            if let Err(e) = result
                && first.is_none()
            {
                first = Some(e);
            }
        };
        keep(self.http.await.map_err(Into::into));
        if let Some(s3) = self.s3 {
            keep(s3.await.map_err(Into::into));
        }
        if let Some(grpc) = self.grpc {
            keep(match grpc.await {
                Ok(served) => served.map_err(Error::Grpc),
                Err(e) => Err(e.into()),
            });
        }
        if let Some(membership) = self.membership {
            keep(membership.await.map_err(Error::from));
        }
        let (jobs, ingestor, store, similar) = (self.jobs, self.ingestor, self.store, self.similar);
        keep(
            tokio::task::spawn_blocking(move || {
                jobs.shutdown();
                ingestor.stop_labeler();
                similar.stop();
                store.close();
            })
            .await
            .map_err(Error::from),
        );
        info!("PipeStore stopped");
        first.map_or(Ok(()), Err)
    }
}

/// Where and how an S3 API listens.
pub(crate) struct S3Listen<'a> {
    pub(crate) addr: SocketAddr,
    /// Domain of virtual-host-style requests.
    pub(crate) domain: &'a str,
    /// Folder of the multipart uploads in progress.
    pub(crate) staging: PathBuf,
    pub(crate) max_upload_bytes: usize,
    pub(crate) limits: HttpLimits,
}

/// Opens the S3 API's multipart staging, binds `listen.addr` and serves `objects` (rows in
/// `catalog`) until `stopped`; signatures and roles are checked against
/// `keys`.
pub(crate) async fn start_s3(
    listen: S3Listen<'_>,
    objects: SharedObjects,
    catalog: Arc<dyn Catalog>,
    keys: Arc<KeyStore>,
    stopped: &watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), Error> {
    let uploads = s3::Uploads::open(listen.staging.clone()).map_err(|source| Error::Io {
        path: listen.staging.clone(),
        source,
    })?;
    let state = Arc::new(s3::S3State {
        objects,
        catalog,
        uploads: Arc::new(uploads),
        max_upload_bytes: listen.max_upload_bytes,
    });
    let listener = bind("S3", listen.addr).await?;
    let bound = local_addr("S3", &listener, listen.addr)?;
    let service = s3::service(state, listen.domain, keys);
    info!(s3_addr = %bound, "S3 API listening");
    Ok((
        bound,
        tokio::spawn(s3::serve(listener, service, listen.limits, stopped.clone())),
    ))
}

/// A listener on `addr`; failing, an error naming `what` it was for.
pub(crate) async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { what, addr, source })
}

/// The address `listener` is bound to (the real port when `addr` asked for port 0).
pub(crate) fn local_addr(
    what: &'static str,
    listener: &TcpListener,
    addr: SocketAddr,
) -> Result<SocketAddr, Error> {
    listener
        .local_addr()
        .map_err(|source| Error::Bind { what, addr, source })
}

/// Serves `routes` with `server` on `listener` until `stopped` turns true (or its sender is
/// gone).
async fn serve_grpc(
    mut server: tonic::transport::Server,
    listener: TcpListener,
    routes: tonic::service::Routes,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    server
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use ndpipe_model::{FakeBackend, HeadWeights};
    use ndpipe_proto::pb;
    use ndpipe_proto::pb::pipe_store_client::PipeStoreClient;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::Config;
    use crate::testing::png;

    /// One HTTP/1.1 request on its own connection: (status, body).
    async fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        conn.write_all(body).await.unwrap();
        let mut out = Vec::new();
        conn.read_to_end(&mut out).await.unwrap();
        let status = std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap();
        let start = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (status, out[start..].to_vec())
    }

    async fn json(addr: SocketAddr, path: &str) -> serde_json::Value {
        let (status, body) = request(addr, "GET", path, b"").await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    fn config(data: &Path) -> Config {
        Config {
            data: data.to_path_buf(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..Config::default()
        }
    }

    #[tokio::test]
    async fn without_a_model_a_node_stores_photos_and_runs_no_grpc() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            no_model: true,
            token: Some("s3cret".into()),
            ..config(&dir.path().join("plain"))
        };
        let node = PipeStore::open(config).await.unwrap();
        assert_eq!(node.name(), "pipestore-plain");
        assert!(node.backbone().is_none());
        let running = node.start(None, None).await.unwrap();
        assert!(running.grpc_url().is_none());
        let addr = running.http_addr();
        let (status, body) = request(addr, "POST", "/v1/photos", &png(1)).await;
        assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
        let health = json(addr, "/healthz").await;
        assert_eq!(
            (health["status"].as_str(), health["photos"].as_u64()),
            (Some("ok"), Some(0))
        );
        let (status, body) = request(addr, "GET", "/v1/nothing", b"").await;
        assert_eq!(status, 404);
        let error: ndpipe_util::http::ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(error.error, "no_route");
        running.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_node_serves_both_apis_deploys_a_head_and_keeps_it_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        let fake: Arc<dyn ndpipe_model::InferenceBackend> = Arc::new(FakeBackend::new(16, 10));
        let open = || PipeStore::with_backend(config(&data), Some(fake.clone()));

        let running = open().await.unwrap().start(None, None).await.unwrap();
        let addr = running.http_addr();
        let (status, body) = request(addr, "POST", "/v1/photos?label=cat", &png(3)).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let reply: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let id = reply["id"].as_u64().unwrap();
        let labels = loop {
            let labels = json(addr, &format!("/v1/photos/{id}/labels")).await;
            if labels.as_array().is_some_and(|l| !l.is_empty()) {
                break labels;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let pretrained = labels[0]["model_version"].as_str().unwrap().to_string();
        let models = json(addr, "/v1/models").await;
        assert_eq!(models[0]["id"], pretrained.as_str());
        assert_eq!(models[0]["active"], true, "the first model becomes active");

        let url = running.grpc_url().unwrap().to_string();
        let mut client = PipeStoreClient::connect(url).await.unwrap();
        let inventory = client
            .inventory(pb::InventoryRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (inventory.node_id, inventory.feature_dim),
            (0, 16),
            "no Tuner gave an id"
        );
        assert_eq!(inventory.classes[0].label, "cat");
        assert!(inventory.task_known);
        assert_eq!(inventory.active_version, format!("general={pretrained}"));

        let head = HeadWeights::new(
            vec!["cat".into(), "dog".into()],
            16,
            vec![0.01; 32],
            vec![1.0, 0.0],
        )
        .unwrap();
        let mut stage = pb::StageHeadRequest {
            version: "ft-1-abc".into(),
            backbone_version: inventory.backbone_version.clone(),
            parent: pretrained.clone(),
            metrics_json: "{}".into(),
            ..Default::default()
        };
        ndpipe_proto::put_head(&mut stage, &head);
        let wrong = pb::StageHeadRequest {
            backbone_version: "another".into(),
            ..stage.clone()
        };
        let err = client.stage_head(wrong).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        client.stage_head(stage.clone()).await.unwrap();
        assert!(data.join("heads/staged/ft-1-abc.safetensors").exists());
        for _ in 0..2 {
            client
                .commit_head(pb::CommitHeadRequest {
                    version: "ft-1-abc".into(),
                })
                .await
                .expect("a commit is idempotent");
        }
        assert!(!data.join("heads/staged/ft-1-abc.safetensors").exists());
        let mut events = client
            .relabel(pb::RelabelRequest {
                version: "ft-1-abc".into(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut progress = Vec::new();
        let relabel = loop {
            match events.message().await.unwrap().unwrap().event.unwrap() {
                pb::relabel_event::Event::Progress(p) => progress.push((p.done, p.total)),
                pb::relabel_event::Event::Done(reply) => break reply,
            }
        };
        assert_eq!(progress, [(1, 1)]);
        assert_eq!((relabel.mode.as_str(), relabel.photos), ("head", 1));
        assert_eq!((relabel.compared, relabel.changed), (1, 1));
        let search = json(addr, "/v1/search?label=cat&task=default").await;
        assert_eq!(search["model_version"], "ft-1-abc");
        assert_eq!(search["hits"][0]["id"], id);
        assert_eq!(search["hits"][0]["task"], "default");
        running.stop().await.unwrap();
        assert!(data.join("heads/ft-1-abc.safetensors").exists());

        // A restart loads the committed head; so does one that finds only an old-format file.
        for legacy in [false, true] {
            if legacy {
                std::fs::remove_file(data.join("heads/ft-1-abc.safetensors")).unwrap();
                std::fs::write(
                    data.join("heads/ft-1-abc.head"),
                    prost::Message::encode_to_vec(&stage),
                )
                .unwrap();
            }
            let running = open().await.unwrap().start(None, None).await.unwrap();
            let mut client = PipeStoreClient::connect(running.grpc_url().unwrap().to_string())
                .await
                .unwrap();
            let inventory = client
                .inventory(pb::InventoryRequest::default())
                .await
                .unwrap()
                .into_inner();
            assert_eq!(
                inventory.active_version,
                format!("default=ft-1-abc,general={pretrained}"),
                "legacy file: {legacy}"
            );
            running.stop().await.unwrap();
        }
    }
}
