//! Classifier heads over backbone features: inference, and the one head file format.
//!
//! A fine-tuned model is the frozen backbone plus a head trained on the Tuner. PipeStores run the
//! head with [`HeadWeights`] (a matrix multiply per photo, no framework), and both sides keep
//! heads in one file format, [`HeadFile`]: safetensors holding the layers (`output.weight`
//! `[C, in]`, `output.bias` `[C]`, and `hidden.weight`/`hidden.bias` for a head with a hidden
//! layer) and its rules for keeping labels ([`Acceptance`]: `accept.center` `[in]` and
//! `accept.centroids` `[C, in]` when it has a novelty check), with JSON metadata under
//! [`HEAD_METADATA_KEY`] (`{"version": 1, "config": {...}}`, where `config` holds at least
//! `classes`, `input_dim` and `hidden`, and `floor` and `min_cosine` for the label rules) and,
//! when the file belongs to a registered model version, [`MODEL_METADATA_KEY`] ([`HeadVersion`]). Files of the Tuner from
//! before this format kept the config's fields beside `version` (`{"version": 1, "classes": ...}`);
//! they are read too.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};

use crate::accept::{Acceptance, Novelty, OTHER};
use crate::backend::top_k;

/// Metadata key of the head's layout and settings.
pub const HEAD_METADATA_KEY: &str = "ndpipe.head";
/// Metadata key of the model version a head file belongs to.
pub const MODEL_METADATA_KEY: &str = "ndpipe.model";
/// The version of the head file format this build writes and reads.
pub const HEAD_FORMAT_VERSION: u32 = 1;

/// Why a head or head file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeadError {
    /// Shapes, class names or metadata do not hold together.
    #[error("invalid head{}: {reason}", path.as_ref().map(|p| format!(" file {}", p.display())).unwrap_or_default())]
    Invalid {
        /// The file, when the head came from one.
        path: Option<PathBuf>,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing the file failed.
    #[error("head file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn invalid(reason: impl Into<String>) -> HeadError {
    HeadError::Invalid {
        path: None,
        reason: reason.into(),
    }
}

/// A linear classifier head as PipeStores run it: `logits = weights · features + bias`, with
/// its rules for keeping labels ([`Acceptance`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadWeights {
    classes: Vec<String>,
    input_dim: usize,
    weights: Vec<f32>,
    bias: Vec<f32>,
    acceptance: Acceptance,
}

impl HeadWeights {
    /// A head over `input_dim`-d features with row-major `[classes x input_dim]` weights and
    /// `[classes]` bias; fails when the lengths disagree.
    pub fn new(
        classes: Vec<String>,
        input_dim: usize,
        weights: Vec<f32>,
        bias: Vec<f32>,
    ) -> Result<Self, HeadError> {
        let c = classes.len();
        if c == 0 || input_dim == 0 || weights.len() != c * input_dim || bias.len() != c {
            return Err(invalid(format!(
                "{} weights and {} biases for {c} classes of {input_dim} inputs",
                weights.len(),
                bias.len()
            )));
        }
        Ok(HeadWeights {
            classes,
            input_dim,
            weights,
            bias,
            acceptance: Acceptance::default(),
        })
    }

    /// The head with `acceptance` as its rules for keeping labels; fails when the novelty
    /// check's shapes do not match the head's.
    pub fn with_acceptance(mut self, acceptance: Acceptance) -> Result<Self, HeadError> {
        if let Some(n) = &acceptance.novelty
            && (n.center.len() != self.input_dim
                || n.centroids.len() != self.classes.len() * self.input_dim)
        {
            return Err(invalid(format!(
                "novelty check of {} + {} values for {} classes of {} inputs",
                n.center.len(),
                n.centroids.len(),
                self.classes.len(),
                self.input_dim
            )));
        }
        if !acceptance.floor.is_finite() || !(0.0..=1.0).contains(&acceptance.floor) {
            return Err(invalid(format!(
                "floor {} is not a probability",
                acceptance.floor
            )));
        }
        self.acceptance = acceptance;
        Ok(self)
    }

    /// The head's rules for keeping labels.
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Class names, in output order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Length of the feature vectors the head takes.
    pub fn input_dim(&self) -> usize {
        self.input_dim
    }

    /// Row-major `[classes x input_dim]` weights.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// `[classes]` bias.
    pub fn bias(&self) -> &[f32] {
        &self.bias
    }

    /// The logits of one feature vector (of length `input_dim`).
    pub fn logits(&self, features: &[f32]) -> Vec<f32> {
        self.weights
            .chunks_exact(self.input_dim)
            .zip(&self.bias)
            .map(|(row, b)| row.iter().zip(features).map(|(w, x)| w * x).sum::<f32>() + b)
            .collect()
    }

    /// The `k` most probable classes of one feature vector, as (class name, probability).
    pub fn top_k(&self, features: &[f32], k: usize) -> Vec<(&str, f32)> {
        top_k(&self.logits(features), k)
            .into_iter()
            .map(|(class, p)| (self.classes[class].as_str(), p))
            .collect()
    }

    /// The labels a photo gets: its `k` most probable classes with at least `floor` (the
    /// head's own when `None`), or [`OTHER`] alone (scored `1 - ` the best probability) when
    /// none reaches it or the photo is novel to the head.
    pub fn label(&self, features: &[f32], k: usize, floor: Option<f32>) -> Vec<(&str, f32)> {
        let top = self.top_k(features, k.max(1));
        let best = top.first().map_or(0.0, |t| t.1);
        let novel = self
            .acceptance
            .novelty
            .as_ref()
            .is_some_and(|n| n.is_novel(features));
        let floor = floor.unwrap_or(self.acceptance.floor);
        let kept: Vec<(&str, f32)> = top.into_iter().filter(|t| t.1 >= floor).collect();
        if novel || kept.is_empty() {
            vec![(OTHER, 1.0 - best)]
        } else {
            kept
        }
    }
}

/// The model version a head file belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadVersion {
    /// The version id.
    pub id: String,
    /// The task the head labels for (files from before tasks: the `default` task).
    #[serde(default = "default_task")]
    pub task: String,
    /// The backbone it was trained on (sha256 of its ONNX file).
    pub backbone: String,
    /// The version it was derived from.
    pub parent: Option<String>,
    /// Its metrics (accuracy, ...), as the registry keeps them.
    pub metrics: serde_json::Value,
}

fn default_task() -> String {
    "default".to_string()
}

/// The layout every head file's `config` holds; other settings ride along untouched.
#[derive(Deserialize)]
struct Layout {
    classes: Vec<String>,
    input_dim: usize,
    #[serde(default)]
    hidden: Option<usize>,
    /// Files from before label rules keep every top-k label.
    #[serde(default)]
    floor: f32,
    #[serde(default)]
    min_cosine: Option<f32>,
}

#[derive(Serialize, Deserialize)]
struct Descriptor {
    version: u32,
    config: serde_json::Value,
}

impl Descriptor {
    /// Parses the descriptor, in today's nested layout or the older flat one.
    fn parse(json: &str) -> Result<Self, HeadError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| invalid(format!("metadata: {e}")))?;
        let serde_json::Value::Object(mut fields) = value else {
            return Err(invalid("metadata is not a JSON object"));
        };
        let version = fields
            .remove("version")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| invalid("metadata has no format version"))?;
        let config = match fields.remove("config") {
            Some(config) => config,
            None => serde_json::Value::Object(fields),
        };
        Ok(Descriptor { version, config })
    }
}

/// A head as stored on disk: its settings, its layers and, optionally, its model version.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadFile {
    /// The head's settings as JSON: `classes`, `input_dim` and `hidden` (read by every reader),
    /// plus whatever the trainer keeps (epochs, seed, ...).
    pub config: serde_json::Value,
    /// The layers by name: (shape, row-major values).
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// The model version, when the file belongs to one.
    pub version: Option<HeadVersion>,
}

impl HeadFile {
    /// The file of a linear head, with its rules for keeping labels (`config.floor`,
    /// `config.min_cosine`, tensors `accept.center` and `accept.centroids`).
    pub fn from_linear(head: &HeadWeights, version: Option<HeadVersion>) -> Self {
        let c = head.classes.len();
        let mut tensors = BTreeMap::from([
            (
                "output.weight".to_string(),
                (vec![c, head.input_dim], head.weights.clone()),
            ),
            ("output.bias".to_string(), (vec![c], head.bias.clone())),
        ]);
        let mut config = serde_json::json!({
            "classes": head.classes,
            "input_dim": head.input_dim,
            "hidden": null,
            "floor": head.acceptance.floor,
        });
        if let Some(n) = &head.acceptance.novelty {
            config["min_cosine"] = serde_json::json!(n.min_cosine);
            tensors.insert(
                "accept.center".to_string(),
                (vec![head.input_dim], n.center.clone()),
            );
            tensors.insert(
                "accept.centroids".to_string(),
                (vec![c, head.input_dim], n.centroids.clone()),
            );
        }
        HeadFile {
            config,
            tensors,
            version,
        }
    }

    /// The head as PipeStores run it; fails for a head with a hidden layer.
    pub fn to_linear(&self) -> Result<HeadWeights, HeadError> {
        let layout = self.layout()?;
        if layout.hidden.is_some() {
            return Err(invalid(
                "a head with a hidden layer cannot run as a linear head",
            ));
        }
        let c = layout.classes.len();
        let weights = self.tensor("output.weight", &[c, layout.input_dim])?;
        let bias = self.tensor("output.bias", &[c])?;
        let novelty = match layout.min_cosine {
            Some(min_cosine) => Some(Novelty {
                center: self.tensor("accept.center", &[layout.input_dim])?.to_vec(),
                centroids: self
                    .tensor("accept.centroids", &[c, layout.input_dim])?
                    .to_vec(),
                min_cosine,
            }),
            None => None,
        };
        HeadWeights::new(
            layout.classes,
            layout.input_dim,
            weights.to_vec(),
            bias.to_vec(),
        )?
        .with_acceptance(Acceptance {
            floor: layout.floor,
            novelty,
        })
    }

    /// The values of tensor `name`, checked to have `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<&[f32], HeadError> {
        match self.tensors.get(name) {
            Some((s, values)) if s == shape => Ok(values),
            Some((s, _)) => Err(invalid(format!(
                "tensor {name} has shape {s:?}, expected {shape:?}"
            ))),
            None => Err(invalid(format!("missing tensor {name}"))),
        }
    }

    fn layout(&self) -> Result<Layout, HeadError> {
        serde_json::from_value(self.config.clone()).map_err(|e| invalid(format!("config: {e}")))
    }

    /// The file's bytes (safetensors).
    pub fn to_bytes(&self) -> Result<Vec<u8>, HeadError> {
        let mut metadata = HashMap::new();
        let descriptor = Descriptor {
            version: HEAD_FORMAT_VERSION,
            config: self.config.clone(),
        };
        metadata.insert(
            HEAD_METADATA_KEY.to_string(),
            serde_json::to_string(&descriptor).map_err(|e| invalid(e.to_string()))?,
        );
        if let Some(v) = &self.version {
            metadata.insert(
                MODEL_METADATA_KEY.to_string(),
                serde_json::to_string(v).map_err(|e| invalid(e.to_string()))?,
            );
        }
        let raw: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(name, (shape, values))| {
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name.clone(), shape.clone(), bytes)
            })
            .collect();
        let views = raw
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.as_str(), v))
                    .map_err(|e| invalid(format!("tensor {name}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize(views, Some(metadata)).map_err(|e| invalid(e.to_string()))
    }

    /// Parses a file's bytes, checking the format version, that every tensor is f32 and that
    /// the config names a layout.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, HeadError> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| invalid(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let descriptor = meta
            .get(HEAD_METADATA_KEY)
            .ok_or_else(|| invalid(format!("no {HEAD_METADATA_KEY:?} metadata")))
            .and_then(|j| Descriptor::parse(j))?;
        if descriptor.version != HEAD_FORMAT_VERSION {
            return Err(invalid(format!(
                "format version {} (this build reads {HEAD_FORMAT_VERSION})",
                descriptor.version
            )));
        }
        let version = meta
            .get(MODEL_METADATA_KEY)
            .map(|j| serde_json::from_str(j).map_err(|e| invalid(e.to_string())))
            .transpose()?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| invalid(e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            if view.dtype() != Dtype::F32 {
                return Err(invalid(format!(
                    "tensor {name} is {:?}, not F32",
                    view.dtype()
                )));
            }
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        let file = HeadFile {
            config: descriptor.config,
            tensors,
            version,
        };
        file.layout()?;
        Ok(file)
    }

    /// Writes the file durably (a crash leaves the old file or the new one).
    pub fn write(&self, path: &Path) -> Result<(), HeadError> {
        let bytes = self.to_bytes().map_err(|e| with_path(e, path))?;
        ndpipe_util::fs::write_durably(path, &bytes).map_err(|source| HeadError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads a file written by [`HeadFile::write`].
    pub fn read(path: &Path) -> Result<Self, HeadError> {
        let bytes = std::fs::read(path).map_err(|source| HeadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|e| with_path(e, path))
    }
}

fn with_path(e: HeadError, path: &Path) -> HeadError {
    match e {
        HeadError::Invalid { reason, .. } => HeadError::Invalid {
            path: Some(path.to_path_buf()),
            reason,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> HeadWeights {
        HeadWeights::new(
            vec!["cat".into(), "cup".into()],
            2,
            vec![1.0, 0.0, 0.0, 1.0],
            vec![0.5, -0.5],
        )
        .unwrap()
    }

    #[test]
    fn linear_head_ranks_classes() {
        let h = head();
        assert_eq!(h.logits(&[2.0, 1.0]), vec![2.5, 0.5]);
        let top = h.top_k(&[0.0, 3.0], 2);
        assert_eq!(top[0].0, "cup");
        assert!(top[0].1 > top[1].1);
        assert!(HeadWeights::new(vec!["a".into()], 2, vec![1.0], vec![0.0]).is_err());
    }

    #[test]
    fn files_round_trip_with_their_version_and_reject_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.safetensors");
        let version = HeadVersion {
            task: "default".into(),
            id: "v1".into(),
            backbone: "b".repeat(64),
            parent: Some("v0".into()),
            metrics: serde_json::json!({"val_top1": 0.9}),
        };
        HeadFile::from_linear(&head(), Some(version.clone()))
            .write(&path)
            .unwrap();
        let back = HeadFile::read(&path).unwrap();
        assert_eq!(back.version, Some(version));
        assert_eq!(back.to_linear().unwrap(), head());

        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        assert!(HeadFile::from_bytes(&bytes).is_err());
        let mut wrong = HeadFile::from_linear(&head(), None);
        wrong.config["input_dim"] = serde_json::json!(3);
        assert!(wrong.to_linear().is_err());
        assert!(HeadFile::from_bytes(b"not a head").is_err());
    }

    #[test]
    fn labels_keep_the_floor_and_send_novel_photos_to_other() {
        let novelty = Novelty {
            center: vec![0.0, 0.0],
            centroids: vec![1.0, 0.0, 0.0, 1.0],
            min_cosine: 0.5,
        };
        let h = head()
            .with_acceptance(Acceptance {
                floor: 0.6,
                novelty: Some(novelty),
            })
            .unwrap();
        assert_eq!(h.label(&[5.0, 0.1], 2, None)[0].0, "cat");
        assert_eq!(
            h.label(&[5.0, 0.1], 2, None).len(),
            1,
            "cup is below the floor"
        );
        assert_eq!(
            h.label(&[5.0, 0.1], 2, Some(0.0)).len(),
            2,
            "a task's own floor wins"
        );
        assert_eq!(
            h.label(&[1.0, 1.6], 2, None)[0].0,
            OTHER,
            "no class reaches 0.6"
        );
        assert_eq!(h.label(&[-3.0, -3.0], 2, Some(0.0))[0].0, OTHER, "novel");
        let back = HeadFile::from_bytes(&HeadFile::from_linear(&h, None).to_bytes().unwrap())
            .unwrap()
            .to_linear()
            .unwrap();
        assert_eq!(back, h, "the rules are kept in the file");
        assert!(
            head()
                .with_acceptance(Acceptance {
                    floor: 2.0,
                    novelty: None
                })
                .is_err()
        );
    }

    #[test]
    fn the_older_flat_descriptor_is_read() {
        let flat = Descriptor::parse(
            r#"{"version": 1, "classes": ["a"], "input_dim": 2, "hidden": null, "epochs": 30}"#,
        )
        .unwrap();
        assert_eq!(flat.version, 1);
        assert_eq!(flat.config["epochs"], 30);
        assert_eq!(flat.config["input_dim"], 2);
        assert!(flat.config.get("version").is_none());
        assert!(Descriptor::parse(r#"{"classes": []}"#).is_err());
    }
}
