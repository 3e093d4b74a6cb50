//! `ndpipe.toml`: one file for every role, `[pipestore]`, `[tuner]` and `[gateway]`, each section the
//! library's own `Config`. Flags and `NDPIPE_*` variables override the file, which overrides the
//! defaults; `ndpipe config example` prints a fully commented file with every key.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
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
    /// Read a configuration file and print the settings it gives (defaults filled in).
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// Runs `ndpipe config`.
pub(crate) fn run(args: ConfigArgs) -> Result<()> {
    match args.action {
        Action::Example => print!("{EXAMPLE}"),
        Action::Check { file } => {
            let flag = ConfigFlag { config: Some(file) };
            let config = flag.resolve("pipestore", &serde_json::json!({}))?;
            print!(
                "{}",
                toml::to_string(&config).context("printing the configuration")?
            );
        }
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
}
