//! A head on disk: [`ndpipe_model::HeadFile`], the one head format of ndpipe, with the head's
//! [`HeadConfig`] as its `config`.
//!
//! Files written before that format put the configuration's fields next to `version` in the
//! `ndpipe.head` metadata instead of under `config`; `HeadFile` (and so [`Head::load`]) still
//! reads them.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor, Var};
use ndpipe_model::{Acceptance, HeadError, HeadFile, HeadVersion};

use super::{Dense, Head, HeadConfig};
use crate::TunerError;

impl Head {
    /// Writes the head as a safetensors head file (`output.weight` `[C, in]`, `output.bias` `[C]`,
    /// and `hidden.weight`/`hidden.bias` when present) with its [`HeadConfig`] as JSON metadata.
    /// A crash leaves either the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<(), TunerError> {
        self.save_as(path, None)
    }

    /// [`Head::save`], labelled with the model version the head belongs to.
    pub(crate) fn save_as(
        &self,
        path: &Path,
        version: Option<HeadVersion>,
    ) -> Result<(), TunerError> {
        let mut config =
            serde_json::to_value(&self.config).map_err(|e| TunerError::InvalidHeadFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        config["floor"] = serde_json::json!(self.acceptance.floor);
        let mut tensors = BTreeMap::new();
        let mut put = |name: &str, tensor: &Tensor| -> Result<(), TunerError> {
            let values = tensor.flatten_all()?.to_vec1::<f32>()?;
            tensors.insert(name.to_string(), (tensor.dims().to_vec(), values));
            Ok(())
        };
        put("output.weight", self.output.weight.as_tensor())?;
        put("output.bias", self.output.bias.as_tensor())?;
        if let Some(hidden) = &self.hidden {
            put("hidden.weight", hidden.weight.as_tensor())?;
            put("hidden.bias", hidden.bias.as_tensor())?;
        }
        if let Some(n) = &self.acceptance.novelty {
            config["min_cosine"] = serde_json::json!(n.min_cosine);
            let dim = self.config.input_dim;
            tensors.insert("accept.center".into(), (vec![dim], n.center.clone()));
            tensors.insert(
                "accept.centroids".into(),
                (vec![self.classes().len(), dim], n.centroids.clone()),
            );
        }
        HeadFile {
            config,
            tensors,
            version,
        }
        .write(path)
        .map_err(|e| from_head_error(e, path))
    }

    /// Reads a head written by [`Head::save`] (or by an earlier version of ndpipe), checking its
    /// format version, its configuration and every tensor's dtype and shape.
    pub fn load(path: &Path) -> Result<Self, TunerError> {
        let bytes = std::fs::read(path).map_err(|source| TunerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| TunerError::InvalidHeadFile {
            path: path.to_path_buf(),
            reason,
        };
        let file = HeadFile::from_bytes(&bytes).map_err(|e| from_head_error(e, path))?;
        let config: HeadConfig =
            serde_json::from_value(file.config.clone()).map_err(|e| invalid(e.to_string()))?;
        config
            .validate()
            .map_err(|e| invalid(format!("bad metadata: {e}")))?;
        let take = |name: &str, shape: &[usize]| -> Result<Var, TunerError> {
            let values = file
                .tensor(name, shape)
                .map_err(|e| from_head_error(e, path))?;
            Ok(Var::from_vec(values.to_vec(), shape, &Device::Cpu)?)
        };
        let hidden = match config.hidden {
            Some(h) => Some(Dense {
                weight: take("hidden.weight", &[h, config.input_dim])?,
                bias: take("hidden.bias", &[h])?,
            }),
            None => None,
        };
        let fan_in = config.hidden.unwrap_or(config.input_dim);
        let classes = config.classes.len();
        let output = Dense {
            weight: take("output.weight", &[classes, fan_in])?,
            bias: take("output.bias", &[classes])?,
        };
        let known: &[&str] = match hidden {
            Some(_) => &[
                "hidden.weight",
                "hidden.bias",
                "output.weight",
                "output.bias",
            ],
            None => &[
                "output.weight",
                "output.bias",
                "accept.center",
                "accept.centroids",
            ],
        };
        if let Some(extra) = file.tensors.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(invalid(format!("unexpected tensor {extra}")));
        }
        let acceptance = match hidden {
            Some(_) => Acceptance::default(),
            None => file
                .to_linear()
                .map_err(|e| from_head_error(e, path))?
                .acceptance()
                .clone(),
        };
        Ok(Self {
            config,
            hidden,
            output,
            acceptance,
        })
    }
}

/// `e` about the file at `path`, as the Tuner reports it.
fn from_head_error(e: HeadError, path: &Path) -> TunerError {
    match e {
        HeadError::Io { path, source } => TunerError::Io { path, source },
        other => TunerError::InvalidHeadFile {
            path: path.to_path_buf(),
            reason: match other {
                HeadError::Invalid { reason, .. } => reason,
                other => other.to_string(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A head file exactly as `Head::save` wrote it before the shared head format.
    fn legacy_bytes(head: &Head, version: u32) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Legacy<'a> {
            version: u32,
            #[serde(flatten)]
            config: &'a HeadConfig,
        }
        let metadata = serde_json::to_string(&Legacy {
            version,
            config: &head.config,
        })
        .unwrap();
        let mut tensors: BTreeMap<&str, &Tensor> = BTreeMap::new();
        tensors.insert("output.weight", head.output.weight.as_tensor());
        tensors.insert("output.bias", head.output.bias.as_tensor());
        if let Some(hidden) = &head.hidden {
            tensors.insert("hidden.weight", hidden.weight.as_tensor());
            tensors.insert("hidden.bias", hidden.bias.as_tensor());
        }
        safetensors::serialize(
            tensors,
            Some(HashMap::from([(
                ndpipe_model::head::HEAD_METADATA_KEY.to_string(),
                metadata,
            )])),
        )
        .unwrap()
    }

    fn head(hidden: Option<usize>) -> Head {
        Head::new(HeadConfig {
            input_dim: 6,
            hidden,
            seed: 5,
            ..HeadConfig::new(vec!["a".into(), "b".into(), "c".into()])
        })
        .unwrap()
    }

    #[test]
    fn files_written_by_the_old_code_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let x: Vec<f32> = (0..12).map(|i| i as f32 / 7.0 - 0.5).collect();
        for hidden in [None, Some(4)] {
            let head = head(hidden);
            let path = dir.path().join(format!("old-{hidden:?}.safetensors"));
            std::fs::write(&path, legacy_bytes(&head, 1)).unwrap();
            let loaded = Head::load(&path).unwrap();
            assert_eq!(loaded.config(), head.config());
            assert_eq!(loaded.logits(&x).unwrap(), head.logits(&x).unwrap());
        }
    }

    #[test]
    fn new_files_are_shared_head_files_with_the_config_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.safetensors");
        let head = head(None);
        let version = HeadVersion {
            task: "default".into(),
            id: "v".into(),
            backbone: "b".repeat(64),
            parent: None,
            metrics: serde_json::json!({"val_top1": 0.5}),
        };
        head.save_as(&path, Some(version.clone())).unwrap();
        let file = HeadFile::read(&path).unwrap();
        assert_eq!(file.version, Some(version));
        assert_eq!(file.config["seed"], 5);
        let linear = file.to_linear().unwrap();
        assert_eq!(linear, head.weights().unwrap());
        assert_eq!(Head::load(&path).unwrap().config(), head.config());
    }

    #[test]
    fn an_old_file_of_another_version_or_with_extra_tensors_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let head = head(None);
        let ok = dir.path().join("ok.safetensors");
        head.save(&ok).unwrap();
        let mut extra = HeadFile::read(&ok).unwrap();
        extra.tensors.insert("stray".into(), (vec![1], vec![0.0]));
        let path = dir.path().join("extra.safetensors");
        extra.write(&path).unwrap();
        let err = Head::load(&path).unwrap_err();
        assert!(
            matches!(&err, TunerError::InvalidHeadFile { reason, .. } if reason.contains("stray")),
            "{err}"
        );

        let path = dir.path().join("v7.safetensors");
        std::fs::write(&path, legacy_bytes(&head, 7)).unwrap();
        let err = Head::load(&path).unwrap_err();
        let TunerError::InvalidHeadFile { reason, .. } = &err else {
            panic!("{err}");
        };
        assert!(reason.contains("version 7"), "{err}");
    }
}
