//! Secure by default: the processes of a cluster (`pipestore`, `tuner`, `gateway`) refuse to
//! run gRPC without a cluster secret or mutual TLS unless told `--insecure-cluster`, which is
//! then said at start and every hour; `ndpipe serve` makes its own secret.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tracing::warn;

/// How often a process running an insecure cluster says so again.
const WARN_EVERY: Duration = Duration::from_secs(3600);

/// The file `ndpipe serve` keeps its own cluster secret in, in its data directory.
pub(crate) const SERVE_SECRET_FILE: &str = "cluster.secret";

/// How a process's gRPC is secured, from its settings.
pub(crate) struct GrpcSecurity<'a> {
    /// `cluster_secret_file`.
    pub(crate) secret: Option<&'a Path>,
    /// `tls_cert` (clap and the libraries check that the key and CA come with it).
    pub(crate) tls: bool,
    /// `insecure_cluster`.
    pub(crate) insecure: bool,
}

/// Refuses to run `ndpipe ROLE` without a cluster secret or mutual TLS, unless
/// `--insecure-cluster` is given: then warns now and every hour for as long as it runs.
/// Needs a Tokio runtime.
pub(crate) fn require_secure(role: &'static str, security: &GrpcSecurity<'_>) -> Result<()> {
    if security.secret.is_some() || security.tls {
        return Ok(());
    }
    if !security.insecure {
        bail!(
            "ndpipe {role} refuses to start without a cluster secret: give --cluster-secret-file \
             FILE (`ndpipe cluster init DIR` makes one) or mutual TLS (--tls-cert, --tls-key, \
             --tls-ca); --insecure-cluster runs gRPC open to anyone who can reach it"
        );
    }
    tokio::spawn(async move {
        let mut every = tokio::time::interval(WARN_EVERY);
        loop {
            every.tick().await;
            warn!(
                role,
                "insecure cluster (--insecure-cluster): gRPC runs without a cluster secret or \
                 mutual TLS, so anyone who can reach its port can call it"
            );
        }
    });
    Ok(())
}

/// `ndpipe serve`'s own cluster secret: `DATA/cluster.secret`, made (256 random bits, mode
/// 0600) at the first start and reused after.
pub(crate) fn serve_secret(data: &Path) -> Result<PathBuf> {
    let path = data.join(SERVE_SECRET_FILE);
    if !path.exists() {
        std::fs::create_dir_all(data)
            .with_context(|| format!("creating the data directory {}", data.display()))?;
        ndpipe_store::create_secret_file(&path).context("making the cluster secret")?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn serve_makes_its_secret_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let path = serve_secret(&data).unwrap();
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.trim().len(), 64, "{first}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(serve_secret(&data).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first, "reused");
    }

    #[tokio::test]
    async fn an_insecure_start_is_refused_unless_asked_for() {
        let open = GrpcSecurity {
            secret: None,
            tls: false,
            insecure: false,
        };
        let error = require_secure("tuner", &open).unwrap_err().to_string();
        assert!(error.contains("--insecure-cluster"), "{error}");
        let secret = GrpcSecurity {
            secret: Some(Path::new("s")),
            ..open
        };
        assert!(require_secure("tuner", &secret).is_ok());
        let asked = GrpcSecurity {
            insecure: true,
            ..open
        };
        assert!(require_secure("tuner", &asked).is_ok());
    }
}
