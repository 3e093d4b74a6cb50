//! The cluster's processes: a Tuner and PipeStores of the real `ndpipe` binary, each on fixed
//! ports and a data directory of its own, so that a restart comes back as the same node.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a process may take to answer after it starts (a model load included).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// One `ndpipe` process that can be killed, stopped and started again.
pub(crate) struct Proc {
    /// "tuner" or the PipeStore's name.
    pub(crate) name: String,
    /// Its HTTP base URL.
    pub(crate) url: String,
    /// The path that answers 200 once it serves.
    ready_path: &'static str,
    exe: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

impl Proc {
    /// A process of `exe` with `args`, logging to `log`, serving HTTP at `url`; not started.
    pub(crate) fn new(
        name: &str,
        url: String,
        ready_path: &'static str,
        exe: &Path,
        args: Vec<OsString>,
        log: PathBuf,
    ) -> Self {
        Proc {
            name: name.to_string(),
            url,
            ready_path,
            exe: exe.to_path_buf(),
            args,
            log,
            child: None,
            stopped: false,
        }
    }

    /// Starts the process and waits until it serves.
    pub(crate) fn start(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new(&self.exe)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({})", self.name, self.exe.display()))?;
        self.child = Some(child);
        self.stopped = false;
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}{}", self.url, self.ready_path);
        while Instant::now() < deadline {
            if agent.get(&url).call().is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "{} exited with {status}; the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(5)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "{} did not answer {url} within {START_TIMEOUT:?}; see {}",
            self.name,
            self.log.display()
        )
    }

    /// SIGKILL: no chance to clean up.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stopped = false;
    }

    /// SIGSTOP: the process stays, silent.
    pub(crate) fn stop(&mut self) -> Result<()> {
        self.signal("STOP")?;
        self.stopped = true;
        Ok(())
    }

    /// SIGCONT after a [`Proc::stop`].
    pub(crate) fn cont(&mut self) -> Result<()> {
        if self.stopped {
            self.signal("CONT")?;
            self.stopped = false;
        }
        Ok(())
    }

    /// SIGTERM (a clean shutdown), then a start.
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.cont()?;
        if self.signal("TERM").is_ok()
            && let Some(mut c) = self.child.take()
        {
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.start()
    }

    /// Continues it if stopped and starts it if it is not running.
    pub(crate) fn recover(&mut self) -> Result<()> {
        self.cont()?;
        let running = match self.child.as_mut() {
            Some(c) => c.try_wait()?.is_none(),
            None => false,
        };
        if running { Ok(()) } else { self.start() }
    }

    /// The last lines of its log, for a report.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            bail!("{} is not running", self.name);
        };
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{signal} {pid} ({}) failed", self.name);
        }
        Ok(())
    }
}

/// Imports Fashion-MNIST photos `skip..skip + limit` (with their ground truth) from `dir` into
/// the store at `url` with `ndpipe import`.
pub(crate) fn import_fashion_mnist(
    exe: &Path,
    url: &str,
    dir: &Path,
    skip: usize,
    limit: usize,
) -> Result<()> {
    let out = Command::new(exe)
        .args(["import", "--server", url, "--quiet", "--fashion-mnist"])
        .arg("--fashion-mnist-dir")
        .arg(dir)
        .args(["--skip", &skip.to_string()])
        .args(["--limit", &limit.to_string()])
        .output()
        .context("running ndpipe import")?;
    if !out.status.success() {
        bail!(
            "ndpipe import into {url} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Runs `start` again (up to four more times) when it failed because a port it picked was
/// taken meanwhile by another process: free ports are only free until someone binds them.
pub(crate) fn retrying_taken_ports<T>(mut start: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 0;
    loop {
        match start() {
            Err(e) if attempt < 4 && format!("{e:#}").contains("Address already in use") => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.cont();
        self.kill9();
    }
}
