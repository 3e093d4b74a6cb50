//! A Tuner and N PipeStores in this process, booted through the libraries exactly as `ndpipe
//! tuner` and `ndpipe pipestore` boot them, on loopback ports and a temporary directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_store::PipeStore;
use ndpipe_tuner::Tuner;

/// A labelled photo to upload: PNG bytes, class name, split.
pub(crate) type Photo = (Vec<u8>, &'static str, &'static str);

/// Loopback with a free port.
pub(crate) fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A PipeStore's settings for a benchmark: `data`, free ports, the given model folder (or no
/// model).
pub(crate) fn store_config(data: PathBuf, model_dir: Option<&Path>) -> ndpipe_store::Config {
    ndpipe_store::Config {
        data,
        listen: any_port(),
        grpc_listen: any_port(),
        no_model: model_dir.is_none(),
        model_dir: model_dir.map_or_else(|| PathBuf::from(".cache/model"), Path::to_path_buf),
        // The benchmarks upload the same photos again and again to measure storing them: each
        // is stored (after the exact-duplicate lookup), not answered with the first copy.
        exact_duplicates: ndpipe_store::ExactDuplicates::Store,
        ..ndpipe_store::Config::default()
    }
}

/// A client for a store's HTTP API.
pub(crate) fn client(addr: SocketAddr) -> Result<Client> {
    Client::new(&ServerArgs {
        server: format!("http://{addr}"),
        token: None,
    })
}

/// The Tuner and its PipeStores.
pub(crate) struct Cluster {
    tuner: Arc<Tuner>,
    tuner_running: ndpipe_tuner::Running,
    nodes: Vec<ndpipe_store::Running>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the Tuner (with its own backbone, for conventional mode) and `n` PipeStores named
    /// `bench-0..n`, uploads `photos` round-robin and waits until they are labelled and the nodes
    /// registered.
    pub(crate) async fn start(n: usize, photos: &[Photo], model_dir: &Path) -> Result<Self> {
        Self::start_capped(n, photos, model_dir, 0.0).await
    }

    /// [`Cluster::start`] with each PipeStore's model capped at `model_rate_limit` images/s
    /// (0: no cap), an emulated slower accelerator.
    pub(crate) async fn start_capped(
        n: usize,
        photos: &[Photo],
        model_dir: &Path,
        model_rate_limit: f64,
    ) -> Result<Self> {
        Self::start_with_rates(photos, model_dir, &vec![model_rate_limit; n]).await
    }

    /// [`Cluster::start`] with one PipeStore per entry of `rates`, its model capped at that
    /// many images/s (0: no cap).
    pub(crate) async fn start_with_rates(
        photos: &[Photo],
        model_dir: &Path,
        rates: &[f64],
    ) -> Result<Self> {
        let n = rates.len();
        eprintln!(
            "starting a Tuner and {n} PipeStores, uploading {} photos...",
            photos.len()
        );
        let dir = tempfile::tempdir().context("creating the cluster's directory")?;
        let tuner_config = ndpipe_tuner::Config {
            data: dir.path().join("tuner"),
            listen: any_port(),
            grpc_listen: any_port(),
            model_dir: Some(model_dir.to_path_buf()),
            intra_threads: 2,
            ..ndpipe_tuner::Config::default()
        };
        let tuner = Arc::new(Tuner::open(&tuner_config).context("opening the Tuner")?);
        let keys = tuner.access_keys();
        let tuner_running = tuner
            .clone()
            .start(&tuner_config, |router| {
                ndpipe_store::guard_router(router, keys, None)
            })
            .await?;
        let grpc = format!("http://{}", tuner_running.grpc_addr());
        let mut nodes = Vec::new();
        for (i, &model_rate_limit) in rates.iter().enumerate() {
            let config = ndpipe_store::Config {
                intra_threads: 1,
                model_rate_limit,
                tuner: Some(grpc.clone()),
                name: Some(format!("bench-{i}")),
                ..store_config(dir.path().join(format!("node{i}")), Some(model_dir))
            };
            let store = PipeStore::open(config).await?;
            nodes.push(store.start(None, None).await?);
        }
        // Every node takes its share at once: a capped model labels slowly, and one batch of
        // it (32 photos) may take longer than the usual pause that counts as no progress.
        let slowest = rates.iter().copied().filter(|r| *r > 0.0).reduce(f64::min);
        let stall = slowest.map_or(STALL, |rate| {
            STALL.max(Duration::from_secs_f64(3.0 * 32.0 / rate))
        });
        let uploads = nodes.iter().enumerate().map(|(i, node)| async move {
            let client = client(node.http_addr())?;
            for (png, label, split) in photos.iter().skip(i).step_by(n) {
                client
                    .upload(
                        png.clone(),
                        Some(ndpipe::client::Truth {
                            label,
                            split,
                            task: None,
                        }),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("upload failed: {e:?}"))?;
            }
            let mine = photos.len().saturating_sub(i).div_ceil(n);
            wait_labelled_within(&client, mine, stall).await
        });
        futures::future::try_join_all(uploads).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while tuner.nodes()?.iter().filter(|n| n.live).count() < n {
            ensure!(Instant::now() < deadline, "PipeStores did not register");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Cluster {
            tuner,
            tuner_running,
            nodes,
            _dir: dir,
        })
    }

    /// The Tuner.
    pub(crate) fn tuner(&self) -> &Tuner {
        &self.tuner
    }

    /// How many PipeStores there are.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The HTTP address of PipeStore `i`.
    pub(crate) fn node_addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].http_addr()
    }

    /// Waits until PipeStore `i` has labelled `n` photos (or stopped making progress).
    pub(crate) async fn wait_labelled(&self, i: usize, n: usize) -> Result<()> {
        wait_labelled(&client(self.node_addr(i))?, n).await
    }

    /// Stops every PipeStore and the Tuner.
    pub(crate) async fn stop(self) -> Result<()> {
        for node in self.nodes {
            node.stop().await?;
        }
        self.tuner_running.stop().await?;
        Ok(())
    }
}

/// How long a node's labelling count may stand still before it counts as stopped.
const STALL: Duration = Duration::from_secs(2);

/// Waits until a node's online labelling has caught up with its uploads (or stopped making
/// progress, when its queue overflowed), so that it does not compete with the experiment.
pub(crate) async fn wait_labelled(client: &Client, n: usize) -> Result<()> {
    wait_labelled_within(client, n, STALL).await
}

/// [`wait_labelled`], counting labelling as stopped after `stall` without progress.
async fn wait_labelled_within(client: &Client, n: usize, stall: Duration) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut last, mut since) = (0usize, Instant::now());
    loop {
        let metrics = String::from_utf8(client.get_bytes("/metrics").await?)?;
        let labelled = metrics
            .lines()
            .find_map(|l| l.strip_prefix("ndpipe_store_labelled_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        let labelled = labelled as usize;
        if labelled >= n || (labelled == last && since.elapsed() > stall) {
            return Ok(());
        }
        if labelled != last {
            (last, since) = (labelled, Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "online labelling did not catch up ({labelled} of {n})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
