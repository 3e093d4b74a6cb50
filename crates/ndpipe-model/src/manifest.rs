//! The model manifest (`model.json`): what a model directory holds and how to feed the model.
//!
//! Any ONNX image classifier with one image input, a pooled-feature output and a logits output can
//! be used by writing a manifest next to it:
//!
//! ```json
//! {
//!   "name": "efficientnet-lite0",
//!   "model_file": "efficientnet-lite0.onnx",
//!   "input": "input",
//!   "input_size": [224, 224],
//!   "layout": "NCHW",
//!   "mean": [0.5, 0.5, 0.5],
//!   "std": [0.5, 0.5, 0.5],
//!   "outputs": { "features": "features", "logits": "logits" },
//!   "feature_dim": 1280,
//!   "num_classes": 1000,
//!   "classes_file": "imagenet_classes.txt"
//! }
//! ```
//!
//! File names are relative to the manifest's directory. `mean` and `std` are per RGB channel on the
//! 0..1 pixel scale: the model sees `(p / 255 - mean) / std`.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::ModelError;

/// The manifest's file name inside a model directory.
pub const MANIFEST_FILE: &str = "model.json";

/// Memory order of the model's input tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// `[N, 3, H, W]`: one plane per channel (PyTorch exports).
    #[serde(rename = "NCHW")]
    Nchw,
    /// `[N, H, W, 3]`: channels interleaved (TensorFlow exports).
    #[serde(rename = "NHWC")]
    Nhwc,
}

/// Names of the model's two outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputNames {
    /// The pooled feature vector, `[N, feature_dim]`.
    pub features: String,
    /// The class scores before softmax, `[N, num_classes]`.
    pub logits: String,
}

/// A validated `model.json` together with the class names it points to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelManifest {
    /// Human-readable model name.
    pub name: String,
    /// The ONNX file, relative to the manifest's directory.
    pub model_file: PathBuf,
    /// Name of the image input.
    pub input: String,
    /// Input `[height, width]` in pixels.
    pub input_size: [u32; 2],
    /// Memory order of the input tensor.
    pub layout: Layout,
    /// Per-channel (RGB) mean on the 0..1 scale.
    pub mean: Vec<f32>,
    /// Per-channel (RGB) standard deviation on the 0..1 scale.
    pub std: Vec<f32>,
    /// Output names.
    pub outputs: OutputNames,
    /// Length of the feature vector.
    pub feature_dim: usize,
    /// Number of classes, and of lines in the classes file.
    pub num_classes: usize,
    /// Class names, one per line in class-index order, relative to the manifest's directory.
    pub classes_file: PathBuf,
    #[serde(skip)]
    dir: PathBuf,
    #[serde(skip)]
    classes: Vec<String>,
}

impl ModelManifest {
    /// Reads `dir/model.json` and the classes file it names, and validates both.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::load_file(dir.as_ref().join(MANIFEST_FILE))
    }

    /// Reads the manifest at `path` (of any name) and the classes file it names, relative to
    /// the manifest's directory, and validates both.
    pub fn load_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let dir = path.parent().unwrap_or(Path::new("."));
        let err = |reason: String| ModelError::Manifest {
            path: path.to_path_buf(),
            reason,
        };
        let text = fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut manifest: ModelManifest =
            serde_json::from_str(&text).map_err(|e| err(format!("invalid: {e}")))?;
        manifest.validate().map_err(err)?;
        manifest.dir = dir.to_path_buf();
        manifest.classes = read_classes(&manifest.classes_path(), manifest.num_classes)?;
        Ok(manifest)
    }

    /// Checks the fields that do not need other files.
    fn validate(&self) -> Result<(), String> {
        let names = [
            ("name", &self.name),
            ("input", &self.input),
            ("outputs.features", &self.outputs.features),
            ("outputs.logits", &self.outputs.logits),
        ];
        if let Some((field, _)) = names.iter().find(|(_, v)| v.trim().is_empty()) {
            return Err(format!("`{field}` is empty"));
        }
        if self.outputs.features == self.outputs.logits {
            return Err(format!(
                "`outputs.features` and `outputs.logits` are both `{}`",
                self.outputs.features
            ));
        }
        if self.input_size.contains(&0) {
            return Err(format!(
                "`input_size` {:?} has a zero side",
                self.input_size
            ));
        }
        for (field, values) in [("mean", &self.mean), ("std", &self.std)] {
            if values.len() != 3 {
                return Err(format!(
                    "`{field}` has {} values, expected 3 (R, G, B)",
                    values.len()
                ));
            }
            if values.iter().any(|v| !v.is_finite()) {
                return Err(format!("`{field}` {values:?} is not finite"));
            }
        }
        if self.std.iter().any(|&s| s <= 0.0) {
            return Err(format!("`std` {:?} must be > 0", self.std));
        }
        if self.feature_dim == 0 || self.num_classes == 0 {
            return Err("`feature_dim` and `num_classes` must be > 0".into());
        }
        Ok(())
    }

    /// The directory the manifest was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Full path of the ONNX file.
    pub fn model_path(&self) -> PathBuf {
        self.dir.join(&self.model_file)
    }

    /// Full path of the classes file.
    pub fn classes_path(&self) -> PathBuf {
        self.dir.join(&self.classes_file)
    }

    /// Class names in class-index order (`num_classes` of them).
    pub fn class_names(&self) -> &[String] {
        &self.classes
    }

    /// Writes a model folder into `dir` (which must exist), each file durably: the ONNX file as
    /// `model.onnx`, `classes` one per line as `classes.txt`, and this manifest, naming those
    /// two, as `model.json`. How a Tuner and a PipeStore keep a backbone sent to them.
    pub fn write_dir(
        mut self,
        dir: &Path,
        classes: &[String],
        onnx: &[u8],
    ) -> Result<(), ModelError> {
        const ONNX_FILE: &str = "model.onnx";
        const CLASSES_FILE: &str = "classes.txt";
        self.model_file = ONNX_FILE.into();
        self.classes_file = CLASSES_FILE.into();
        let json = serde_json::to_vec_pretty(&self).map_err(|e| ModelError::Manifest {
            path: dir.join(MANIFEST_FILE),
            reason: e.to_string(),
        })?;
        let classes = classes.join("\n") + "\n";
        for (name, bytes) in [
            (ONNX_FILE, onnx),
            (CLASSES_FILE, classes.as_bytes()),
            (MANIFEST_FILE, &json[..]),
        ] {
            let path = dir.join(name);
            ndpipe_util::fs::write_durably(&path, bytes).map_err(|e| ModelError::ModelFile {
                path: path.clone(),
                reason: format!("cannot write: {e}"),
            })?;
        }
        Ok(())
    }
}

fn read_classes(path: &Path, num_classes: usize) -> Result<Vec<String>, ModelError> {
    let err = |reason: String| ModelError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let text =
        fs::read_to_string(path).map_err(|e| err(format!("cannot read classes file: {e}")))?;
    let classes: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
    if let Some(i) = classes.iter().position(String::is_empty) {
        return Err(err(format!(
            "line {} is empty; every class needs a name",
            i + 1
        )));
    }
    if classes.len() != num_classes {
        return Err(err(format!(
            "has {} class names, the manifest's `num_classes` is {num_classes}",
            classes.len()
        )));
    }
    Ok(classes)
}
