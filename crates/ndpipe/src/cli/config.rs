//! `ndpipe.toml`: one file for every role, `[pipestore]`, `[tuner]` and `[gateway]`, each section the
//! library's own `Config`. Flags and `NDPIPE_*` variables override the file, which overrides the
//! defaults; `ndpipe config example` prints a fully commented file with every key.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The commented example printed by `ndpipe config example`; a test keeps it equal to the
/// defaults and complete.
pub(crate) const EXAMPLE: &str = include_str!("../../ndpipe.example.toml");

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct FileConfig {
    /// `ndpipe serve` and `ndpipe pipestore`.
    pub(crate) pipestore: ndpipe_store::Config,
    /// `ndpipe tuner`.
    pub(crate) tuner: ndpipe_tuner::Config,
    /// `ndpipe gateway`.
    pub(crate) gateway: ndpipe_store::GatewayConfig,
}

/// The `--config` flag shared by the server commands.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConfigFlag {
    /// Configuration file (TOML; see `ndpipe config example`). Flags and NDPIPE_* variables
    /// override its keys.
    #[arg(long, short = 'c', env = "NDPIPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
}

impl ConfigFlag {
    /// The defaults, overridden by the file (when given), overridden by `section`'s `overrides`
    /// (flags and environment variables, only those that were set).
    pub(crate) fn resolve(&self, section: &str, overrides: &impl Serialize) -> Result<FileConfig> {
        let mut figment = Figment::from(Serialized::defaults(FileConfig::default()));
        if let Some(path) = &self.config {
            figment = figment.merge(Toml::file_exact(file(path)?));
        }
        figment
            .merge(Serialized::default(section, overrides))
            .extract()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| match &self.config {
                Some(p) => format!("reading the configuration (file {})", p.display()),
                None => "reading the configuration (flags and NDPIPE_* variables)".to_string(),
            })
    }
}

fn file(path: &Path) -> Result<&Path> {
    if !path.is_file() {
        bail!("configuration file {} does not exist", path.display());
    }
    Ok(path)
}

/// Flags of `ndpipe config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Print a fully commented configuration file with every key at its default.
    Example,
    /// Read a configuration file as the servers do (a misspelt key is an error) and print the
    /// settings it gives (defaults filled in).
    Check {
        /// The file.
        file: PathBuf,
        /// Also check that the files and folders it names exist (secret, token, TLS and key
        /// files, the model folder and library).
        #[arg(long)]
        files: bool,
        /// With --files, check only this role's section (the others may name files that only
        /// exist on other hosts).
        #[arg(long, value_enum, requires = "files")]
        role: Option<Role>,
    },
}

/// A section of the file, by the server role that reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    Pipestore,
    Tuner,
    Gateway,
}

/// Runs `ndpipe config`.
pub(crate) fn run(args: ConfigArgs) -> Result<()> {
    match args.action {
        Action::Example => print!("{EXAMPLE}"),
        Action::Check { file, files, role } => {
            let flag = ConfigFlag {
                config: Some(file.clone()),
            };
            let config = flag.resolve("pipestore", &serde_json::json!({}))?;
            if files {
                check_files(&config, role)
                    .with_context(|| format!("checking the files {} names", file.display()))?;
            }
            print!(
                "{}",
                toml::to_string(&config).context("printing the configuration")?
            );
        }
    }
    Ok(())
}

/// A path one key names, and whether it must be a folder.
struct Named {
    key: String,
    path: PathBuf,
    folder: bool,
}

/// The paths `config` names in `role`'s section (every section when `None`): the ones a
/// server opens at start. Keys left unset name nothing.
fn named(config: &FileConfig, role: Option<Role>) -> Vec<Named> {
    let mut out = Vec::new();
    let mut add = |section: &str, key: &str, path: Option<&PathBuf>, folder: bool| {
        if let Some(path) = path {
            out.push(Named {
                key: format!("{section}.{key}"),
                path: path.clone(),
                folder,
            });
        }
    };
    let wanted = |r: Role| role.is_none_or(|w| w == r);
    if wanted(Role::Pipestore) {
        let c = &config.pipestore;
        for (key, path) in [
            ("token_file", &c.token_file),
            ("cluster_secret_file", &c.cluster_secret_file),
            ("tls_cert", &c.tls_cert),
            ("tls_key", &c.tls_key),
            ("tls_ca", &c.tls_ca),
            ("ort_lib", &c.ort_lib),
        ] {
            add("pipestore", key, path.as_ref(), false);
        }
        add(
            "pipestore",
            "model_dir",
            Some(&c.model_dir).filter(|_| !c.no_model),
            true,
        );
    }
    if wanted(Role::Tuner) {
        let c = &config.tuner;
        for (key, path) in [
            ("token_file", &c.token_file),
            ("cluster_secret_file", &c.cluster_secret_file),
            ("tls_cert", &c.tls_cert),
            ("tls_key", &c.tls_key),
            ("tls_ca", &c.tls_ca),
            ("ort_lib", &c.ort_lib),
        ] {
            add("tuner", key, path.as_ref(), false);
        }
        add("tuner", "model_dir", c.model_dir.as_ref(), true);
    }
    if wanted(Role::Gateway) {
        let c = &config.gateway;
        for (key, path) in [
            ("token_file", &c.token_file),
            ("cluster_secret_file", &c.cluster_secret_file),
            ("tls_cert", &c.tls_cert),
            ("tls_key", &c.tls_key),
            ("tls_ca", &c.tls_ca),
            ("keys_master_file", &c.keys_master_file),
        ] {
            add("gateway", key, path.as_ref(), false);
        }
    }
    out
}

/// Fails, naming every key whose file or folder is missing (or of the wrong kind).
fn check_files(config: &FileConfig, role: Option<Role>) -> Result<()> {
    let missing: Vec<String> = named(config, role)
        .into_iter()
        .filter(|n| {
            if n.folder {
                !n.path.is_dir()
            } else {
                !n.path.is_file()
            }
        })
        .map(|n| {
            let kind = if n.folder { "folder" } else { "file" };
            format!("{} = {} (no such {kind})", n.key, n.path.display())
        })
        .collect();
    if !missing.is_empty() {
        bail!("missing: {}", missing.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_the_defaults_and_names_every_key() {
        let parsed: FileConfig = toml::from_str(EXAMPLE).expect("the example parses");
        assert_eq!(
            parsed,
            FileConfig::default(),
            "example values differ from the defaults"
        );
        let defaults = serde_json::to_value(FileConfig::default()).unwrap();
        for (section, keys) in defaults.as_object().unwrap() {
            assert!(EXAMPLE.contains(&format!("[{section}]")), "no [{section}]");
            for key in keys.as_object().unwrap().keys() {
                let set = format!("\n{key} = ");
                let commented = format!("\n# {key} = ");
                assert!(
                    EXAMPLE.contains(&set) || EXAMPLE.contains(&commented),
                    "the example does not mention {section}.{key}"
                );
            }
        }
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ndpipe.toml");
        std::fs::write(
            &path,
            "[pipestore]\ndata = \"/srv/photos\"\nmax_batch = 8\n[tuner]\nintra_threads = 3\n",
        )
        .unwrap();
        let flag = ConfigFlag {
            config: Some(path.clone()),
        };
        let c = flag
            .resolve("pipestore", &serde_json::json!({"max_batch": 16}))
            .unwrap();
        assert_eq!(c.pipestore.data, PathBuf::from("/srv/photos"));
        assert_eq!(c.pipestore.max_batch, 16);
        assert_eq!(c.pipestore.label_wait_ms, 5);
        assert_eq!(c.tuner.intra_threads, 3);

        std::fs::write(&path, "[pipestore]\nmax_bach = 8\n").unwrap();
        let err = format!(
            "{:#}",
            flag.resolve("pipestore", &serde_json::json!({}))
                .unwrap_err()
        );
        assert!(err.contains("max_bach"), "{err}");
        let missing = ConfigFlag {
            config: Some(dir.path().join("nope.toml")),
        };
        assert!(
            missing
                .resolve("pipestore", &serde_json::json!({}))
                .is_err()
        );
    }

    #[test]
    fn check_files_names_each_missing_file_and_only_the_role_asked() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("cluster-secret");
        std::fs::write(&secret, "s\n").unwrap();
        let mut config = FileConfig::default();
        config.pipestore.no_model = true;
        config.pipestore.cluster_secret_file = Some(secret.clone());
        config.tuner.cluster_secret_file = Some(secret);
        config.tuner.model_dir = Some(dir.path().to_path_buf());
        config.gateway.keys_master_file = Some(dir.path().join("keys.master"));
        check_files(&config, Some(Role::Pipestore)).unwrap();
        check_files(&config, Some(Role::Tuner)).unwrap();
        let err = check_files(&config, None).unwrap_err().to_string();
        assert!(err.contains("gateway.keys_master_file"), "{err}");
        assert!(!err.contains("cluster_secret_file"), "{err}");

        config.pipestore.no_model = false;
        config.pipestore.model_dir = dir.path().join("cluster-secret");
        let err = check_files(&config, Some(Role::Pipestore))
            .unwrap_err()
            .to_string();
        assert!(err.contains("pipestore.model_dir"), "{err}");
        assert!(err.contains("no such folder"), "{err}");
    }
}
