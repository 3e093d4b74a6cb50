//! PostgreSQL (Debian's) in a namespace of the private network, for the partition harness: a
//! throw-away cluster owned by the `postgres` user (initdb refuses root), listening on the
//! namespace's address with trust for the private network, fsync off. Stopped and deleted
//! when dropped.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::netns::Net;

/// The port of the server in its namespace.
const PORT: u16 = 5432;

/// A running server.
pub(crate) struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    /// The URL processes of the private network use.
    pub(crate) url: String,
}

/// The newest `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context(
            "PostgreSQL is not installed (no /usr/lib/postgresql): apt-get install postgresql",
        )?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
    });
    dirs.pop()
        .context("no /usr/lib/postgresql/*/bin/initdb: apt-get install postgresql")
}

/// Runs `cmd`, failing with its output when it fails.
fn check(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl Postgres {
    /// Initialises and starts a server in host `i` of `net`, its files in a new folder of the
    /// system's temporary directory (the `postgres` user must reach it).
    pub(crate) fn start(net: &Net, i: usize) -> Result<Self> {
        let bin = bin_dir()?;
        let dir = std::env::temp_dir().join(format!("ndpipe-partition-pg-{}", net.hosts[i].ns));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let server = Postgres {
            bin,
            dir,
            url: format!("postgres://ndpipe@{}:{PORT}/postgres", net.hosts[i].addr),
        };
        check(
            Command::new("chown").arg("postgres").arg(&server.dir),
            "chown postgres",
        )?;
        let data = server.dir.join("data");
        check(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(server.bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "ndpipe", "-E", "UTF8", "--no-locale", "--auth=trust"])
                .arg("--no-sync"),
            "initdb",
        )?;
        let hba = data.join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).context("reading pg_hba.conf")?;
        rules.push_str("host all all 10.77.0.0/16 trust\n");
        std::fs::write(&hba, rules).context("writing pg_hba.conf")?;
        let options = format!(
            "-p {PORT} -k {} -c listen_addresses={} -c max_connections=300 -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off",
            server.dir.display(),
            net.hosts[i].addr
        );
        let (ip, mut args) = net.exec_in(i, &PathBuf::from("runuser"));
        args.extend(["-u", "postgres", "--"].map(String::from));
        check(
            Command::new(ip)
                .args(args)
                .arg(server.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.join("server.log"))
                .args(["-w", "-t", "60", "-o", &options, "start"]),
            "pg_ctl start",
        )?;
        Ok(server)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
