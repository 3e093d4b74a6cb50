//! `ndpipe cluster init DIR`: what a new cluster's processes share, so that the secure path is
//! the easy one: the cluster secret, the admin token, the access keys' master key (each mode
//! 0600) and a configuration file that names them, made from the example configuration. It
//! never overwrites a file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::config::EXAMPLE;

/// The files made, in DIR.
const SECRET: &str = "cluster-secret";
const TOKEN: &str = "token";
const MASTER: &str = "keys.master";
const CONFIG: &str = "ndpipe.toml";

/// Makes the cluster's files in `dir` (created when missing); refuses, writing nothing, when
/// any of them exists. Returns what to tell the operator.
pub(crate) fn init(dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let path = |name: &str| dir.join(name);
    let taken: Vec<PathBuf> = [SECRET, TOKEN, MASTER, CONFIG]
        .iter()
        .map(|n| path(n))
        .filter(|p| p.exists())
        .collect();
    if !taken.is_empty() {
        let names: Vec<String> = taken.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "{} already exists; ndpipe cluster init never overwrites a cluster's files",
            names.join(", ")
        );
    }
    ndpipe_store::create_secret_file(&path(SECRET)).context("making the cluster secret")?;
    ndpipe_store::create_secret_file(&path(TOKEN)).context("making the admin token")?;
    ndpipe_store::create_master_key(&path(MASTER)).context("making the keys' master key")?;
    let config = skeleton(&path(SECRET), &path(TOKEN), &path(MASTER));
    std::fs::write(path(CONFIG), config)
        .with_context(|| format!("writing {}", path(CONFIG).display()))?;
    Ok(format!(
        "made in {dir}:\n  {SECRET}   the cluster secret (every process: cluster_secret_file)\n  \
         {TOKEN}            the admin token (token_file; clients: NDPIPE_TOKEN=$(cat {TOKEN}))\n  \
         {MASTER}      the access keys' master key: copy it into every PipeStore's data \
         directory (DATA/{MASTER}) before its first start, and give it to gateways \
         (keys_master_file)\n  {CONFIG}      every setting, these files named; set catalog to \
         the cluster's postgres:// URL\nstart each process with --config {config}\n",
        dir = dir.display(),
        config = path(CONFIG).display(),
    ))
}

/// The example configuration with the cluster secret and token set in every section and the
/// master key in `[gateway]`.
fn skeleton(secret: &Path, token: &Path, master: &Path) -> String {
    let set = |key: &str, path: &Path| format!("{key} = {:?}", path.display().to_string());
    EXAMPLE
        .replace(
            "# cluster_secret_file = \"/etc/ndpipe/cluster-secret\"",
            &set("cluster_secret_file", secret),
        )
        .replace(
            "# token_file = \"/etc/ndpipe/token\"",
            &set("token_file", token),
        )
        .replace(
            "# keys_master_file = \"/etc/ndpipe/keys.master\"",
            &set("keys_master_file", master),
        )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn init_makes_private_files_and_a_config_naming_them_once() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("cluster");
        init(&at).unwrap();
        for name in [SECRET, TOKEN, MASTER] {
            let mode = std::fs::metadata(at.join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        assert_eq!(std::fs::read(at.join(MASTER)).unwrap().len(), 32);
        let text = std::fs::read_to_string(at.join(CONFIG)).unwrap();
        let parsed: toml::Value = toml::from_str(&text).unwrap();
        let secret = at.canonicalize().unwrap().join(SECRET);
        for section in ["pipestore", "tuner", "gateway"] {
            assert_eq!(
                parsed[section]["cluster_secret_file"].as_str(),
                secret.to_str(),
                "{section}"
            );
            assert!(parsed[section]["token_file"].is_str(), "{section}");
        }
        assert!(parsed["gateway"]["keys_master_file"].is_str());

        let before = std::fs::read(at.join(SECRET)).unwrap();
        let error = init(&at).unwrap_err().to_string();
        assert!(error.contains("never overwrites"), "{error}");
        assert_eq!(std::fs::read(at.join(SECRET)).unwrap(), before);
    }
}
