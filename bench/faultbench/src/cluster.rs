//! A Tuner and `nodes` PipeStores of the real binary, with photos imported, ready for rounds.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::FaultConfig;
use crate::api::TunerApi;
use crate::netns::Net;
use crate::procs::Proc;

/// The running cluster: `procs[0]` is the Tuner, the PipeStores follow.
pub(crate) struct Cluster {
    pub(crate) procs: Vec<Proc>,
    pub(crate) tuner: TunerApi,
}

/// A port that was free a moment ago.
pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn args(parts: &[&str]) -> Vec<OsString> {
    parts.iter().map(OsString::from).collect()
}

impl Cluster {
    /// Starts the Tuner and the PipeStores in `dir`, imports `photos_per_node` Fashion-MNIST
    /// photos into each (different ones), and waits until every node is registered and live.
    pub(crate) fn start(config: &FaultConfig, exe: &Path, dir: &Path) -> Result<Self> {
        let (timeout, lease) = (
            config.node_timeout_ms.to_string(),
            config.node_lease_ms.to_string(),
        );
        let mut tuner = vec!["--node-timeout-ms", &timeout, "--node-lease-ms", &lease];
        // One copy of each photo, as the faults are measured without replication.
        let mut node = vec!["--replicas", "1"];
        if let Some(url) = &config.catalog {
            tuner.extend(["--catalog", url.as_str()]);
            node.extend(["--catalog", url.as_str()]);
        }
        let spec = Spec {
            nodes: config.nodes,
            prefix: "ps",
            model_dir: &config.model_dir,
            tuner: &tuner,
            node: if config.catalog.is_some() { &node } else { &[] },
            net: None,
        };
        let mut procs = processes(exe, dir, &spec)?;
        let tuner_url = procs[0].url.clone();
        for p in &mut procs {
            p.start()?;
        }
        let cluster = Cluster {
            procs,
            tuner: TunerApi::new(&tuner_url),
        };
        for (i, node) in cluster.procs[1..].iter().enumerate() {
            import(config, exe, &node.url, i * config.photos_per_node)?;
        }
        cluster.wait_live(config.nodes, Duration::from_secs(90))?;
        Ok(cluster)
    }

    /// Waits until `n` nodes are registered with a live lease.
    fn wait_live(&self, n: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let live = self
                .tuner
                .nodes()
                .map(|nodes| nodes.iter().filter(|n| n["live"] == true).count())
                .unwrap_or(0);
            if live >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("only {live} of {n} nodes live after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// What the processes of a cluster are started with, besides their ports, data directories, the
/// model and a cluster secret.
pub(crate) struct Spec<'a> {
    /// PipeStores.
    pub(crate) nodes: usize,
    /// Their names: the prefix, a dash and their number.
    pub(crate) prefix: &'a str,
    /// The model folder of the PipeStores.
    pub(crate) model_dir: &'a Path,
    /// More flags of the Tuner.
    pub(crate) tuner: &'a [&'a str],
    /// More flags of every PipeStore.
    pub(crate) node: &'a [&'a str],
    /// The private network whose host 0 runs the Tuner and host `1 + i` PipeStore `i`, each on
    /// fixed ports of its address (default: every process on loopback, on free ports).
    pub(crate) net: Option<&'a Net>,
}

/// Fixed ports of a process in a namespace of its own.
const NS_HTTP_PORT: u16 = 8080;
const NS_GRPC_PORT: u16 = 7070;

impl Spec<'_> {
    /// The address, HTTP port and gRPC port of process `i` (0: the Tuner).
    fn place(&self, i: usize) -> Result<(String, u16, u16)> {
        match self.net {
            Some(net) => Ok((net.hosts[i].addr.clone(), NS_HTTP_PORT, NS_GRPC_PORT)),
            None => Ok(("127.0.0.1".into(), free_port()?, free_port()?)),
        }
    }

    /// The program and arguments that run `exe args` as process `i`.
    fn launch(&self, i: usize, exe: &Path, args: Vec<OsString>) -> (PathBuf, Vec<OsString>) {
        match self.net {
            Some(net) => {
                let (ip, prefix) = net.exec_in(i, exe);
                let mut all: Vec<OsString> = prefix.into_iter().map(OsString::from).collect();
                all.extend(args);
                (ip, all)
            }
            None => (exe.to_path_buf(), args),
        }
    }
}

/// The Tuner (first) and the PipeStores of `spec` in `dir`, on free ports, not started.
pub(crate) fn processes(exe: &Path, dir: &Path, spec: &Spec<'_>) -> Result<Vec<Proc>> {
    let secret = dir.join("cluster-secret");
    std::fs::write(&secret, "fault-injection-secret\n").context("writing the secret")?;
    let secret = secret.to_string_lossy().to_string();
    let (tuner_ip, http, grpc) = spec.place(0)?;
    let tuner_data = dir.join("tuner").to_string_lossy().to_string();
    let mut tuner_args = args(&[
        "tuner",
        "--data",
        &tuner_data,
        "--listen",
        &format!("{tuner_ip}:{http}"),
        "--grpc-listen",
        &format!("{tuner_ip}:{grpc}"),
        "--cluster-secret-file",
        &secret,
    ]);
    tuner_args.extend(args(spec.tuner));
    let (program, tuner_args) = spec.launch(0, exe, tuner_args);
    let mut procs = vec![Proc::new(
        "tuner",
        format!("http://{tuner_ip}:{http}"),
        "/v1/tuner/nodes",
        &program,
        tuner_args,
        dir.join("tuner.log"),
    )];
    let model_dir = spec.model_dir.to_string_lossy().to_string();
    for i in 0..spec.nodes {
        let name = format!("{}-{i}", spec.prefix);
        let (ip, port, grpc_port) = spec.place(1 + i)?;
        let data = dir.join(&name).to_string_lossy().to_string();
        let mut ps_args = args(&[
            "pipestore",
            "--data",
            &data,
            "--listen",
            &format!("{ip}:{port}"),
            "--grpc-listen",
            &format!("{ip}:{grpc_port}"),
            "--tuner",
            &format!("http://{tuner_ip}:{grpc}"),
            "--name",
            &name,
            "--model-dir",
            &model_dir,
            "--intra-threads",
            "1",
            "--cluster-secret-file",
            &secret,
        ]);
        ps_args.extend(args(spec.node));
        let (program, ps_args) = spec.launch(1 + i, exe, ps_args);
        procs.push(Proc::new(
            &name,
            format!("http://{ip}:{port}"),
            "/healthz",
            &program,
            ps_args,
            dir.join(format!("{name}.log")),
        ));
    }
    Ok(procs)
}

/// Imports Fashion-MNIST photos `skip..skip + photos_per_node` into the PipeStore at `url`.
fn import(config: &FaultConfig, exe: &Path, url: &str, skip: usize) -> Result<()> {
    crate::procs::import_fashion_mnist(
        exe,
        url,
        &config.fashion_mnist_dir,
        skip,
        config.photos_per_node,
    )
}
