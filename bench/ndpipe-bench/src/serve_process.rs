//! `ndpipe serve` as a child process of a benchmark, so that its memory is its own: start,
//! health, liveness, RSS and a graceful stop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ndpipe::client::Client;

/// `ndpipe serve` as a child process, so that its RSS is its own.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: std::net::SocketAddr,
    log: PathBuf,
}

impl Server {
    pub(crate) fn start(
        data: &Path,
        model_dir: &Path,
        dir: &Path,
        flags: &[String],
    ) -> Result<Self> {
        Self::start_with_env(data, model_dir, dir, flags, &[])
    }

    /// [`Server::start`] with `env` added to the server's environment.
    pub(crate) fn start_with_env(
        data: &Path,
        model_dir: &Path,
        dir: &Path,
        flags: &[String],
        env: &[(String, String)],
    ) -> Result<Self> {
        let me = std::env::current_exe().context("locating ndpipe-bench")?;
        let bin = me.with_file_name("ndpipe");
        ensure!(
            bin.is_file(),
            "no ndpipe binary at {} (make build-bench)",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.join("serve.log");
        let out = std::fs::File::create(&log).context("creating the server's log")?;
        let child = Command::new(&bin)
            .arg("serve")
            .arg("--data")
            .arg(data)
            .arg("--listen")
            .arg(addr.to_string())
            .args(["--s3-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            // Photo i is Fashion-MNIST image i mod 60000: past 60000 the same bytes are stored
            // again (as before exact duplicates were looked up), so that the node fills to N.
            .args(["--exact-duplicates", "store"])
            .arg("--model-dir")
            .arg(model_dir)
            .args(flags)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Server { child, addr, log })
    }

    /// Waits (a bounded number of polls) until the server answers `/healthz`.
    pub(crate) async fn wait_healthy(&mut self, client: &Client) -> Result<()> {
        for _ in 0..600 {
            self.check_alive()?;
            if client.get_bytes("/healthz").await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "ndpipe serve did not answer /healthz in 60 s; its log: {}",
            self.log.display()
        )
    }

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("ndpipe serve exited with {status}; its log:\n{log}");
        }
        Ok(())
    }

    /// A `/proc/PID/status` field in kB (`VmRSS` now, `VmHWM` the peak).
    pub(crate) fn rss_kb(&self, field: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .context("reading the server's /proc status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {field} in /proc status"))
    }

    /// SIGTERM (a graceful stop), then waits for the process.
    pub(crate) fn stop(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("stopping the server")?;
        self.child.wait().context("waiting for the server")?;
        Ok(())
    }
}
