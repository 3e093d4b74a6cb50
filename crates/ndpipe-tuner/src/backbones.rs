//! Backbones the Tuner keeps for rollouts: ONNX files with their manifests, verified when they
//! are added (ONNX Runtime loads the file, and its input, outputs and dimensions are the
//! manifest's) and kept durably in `DATA/backbones/<sha256>/` (`model.json`, `model.onnx`,
//! `classes.txt`), each recorded in the model registry as its pretrained version.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64_simd::STANDARD as BASE64;
use ndpipe_catalog::{ModelVersion, TaskName};
use ndpipe_model::manifest::MANIFEST_FILE;
use ndpipe_model::{InferenceBackend, ModelError, ModelManifest, OrtBackend, RuntimeConfig};
use ndpipe_util::fs::sync_dir;
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::TunerError;
use crate::registry::Registry;

/// Names of directories being filled, removed at start (left over from a crash).
const INCOMING: &str = ".incoming-";

/// A backbone as `ndpipe models add` uploads it (`POST /v1/tuner/backbones`): the manifest,
/// its class names, and the ONNX file in base64 (the manifest's file names are replaced).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackboneUpload {
    /// The model's manifest (`model.json`).
    pub manifest: ModelManifest,
    /// Class names in class-index order, as the manifest's classes file lists them.
    pub classes: Vec<String>,
    /// The ONNX file, standard base64.
    pub onnx_base64: String,
}

impl BackboneUpload {
    /// The upload of a loaded manifest and the bytes of its ONNX file.
    pub fn new(manifest: ModelManifest, onnx: &[u8]) -> BackboneUpload {
        BackboneUpload {
            classes: manifest.class_names().to_vec(),
            manifest,
            onnx_base64: BASE64.encode_to_string(onnx),
        }
    }
}

/// A backbone the Tuner keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackboneView {
    /// The hex sha256 of the ONNX file: the backbone version features are stored under.
    pub backbone: String,
    /// The manifest's model name.
    pub name: String,
    /// The model version of the backbone with its own classifier, in the registry.
    pub model_version: String,
    /// Length of its feature vectors.
    pub feature_dim: usize,
    /// Classes of its own classifier.
    pub num_classes: usize,
    /// Size of the ONNX file.
    pub bytes: u64,
}

/// A kept backbone's files, as a rollout sends them to the nodes.
pub(crate) struct BackboneFiles {
    /// The hex sha256 of the ONNX file.
    pub(crate) sha256: String,
    /// Its pretrained model version.
    pub(crate) version: String,
    /// `model.json` as kept.
    pub(crate) manifest_json: String,
    /// The class names.
    pub(crate) classes: Vec<String>,
    /// Its feature vectors' length.
    pub(crate) feature_dim: usize,
    /// The ONNX file.
    pub(crate) onnx: Vec<u8>,
}

/// The backbones in `DATA/backbones`.
pub(crate) struct Backbones {
    dir: PathBuf,
    runtime: RuntimeConfig,
    max_bytes: usize,
    next: AtomicU64,
}

impl Backbones {
    /// The backbones in `data/backbones` (created if absent; directories a crash left half
    /// filled are removed), verified with `runtime`, each ONNX file at most `max_bytes`.
    pub(crate) fn open(
        data: &Path,
        runtime: RuntimeConfig,
        max_bytes: usize,
    ) -> Result<Self, TunerError> {
        let dir = data.join("backbones");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TunerError::Io { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            if file_name(&path).starts_with(INCOMING) {
                std::fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
        Ok(Backbones {
            dir,
            runtime,
            max_bytes,
            next: AtomicU64::new(0),
        })
    }

    /// The directory of backbone `sha256` (its `model.json` loads with [`ModelManifest::load`]),
    /// if the Tuner keeps it.
    pub(crate) fn dir_of(&self, sha256: &str) -> Option<PathBuf> {
        let valid = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
        let dir = self.dir.join(sha256);
        (valid && dir.join(MANIFEST_FILE).is_file()).then_some(dir)
    }

    /// Verifies and keeps `upload` (blocking: ONNX Runtime loads it), and records its pretrained
    /// version in `registry`. Returns the backbone and whether it is new (adding a kept one
    /// again changes nothing).
    pub(crate) fn add(
        &self,
        upload: BackboneUpload,
        registry: &Registry,
    ) -> Result<(BackboneView, bool), TunerError> {
        let invalid = |m: String| TunerError::InvalidBackbone(m);
        if upload.onnx_base64.len() / 4 * 3 > self.max_bytes + 3 {
            return Err(invalid(format!(
                "the ONNX file is over the limit of {} bytes (max_backbone_bytes)",
                self.max_bytes
            )));
        }
        let onnx = BASE64
            .decode_to_vec(upload.onnx_base64.as_bytes())
            .map_err(|e| invalid(format!("onnx_base64 is not base64: {e}")))?;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let incoming = self
            .dir
            .join(format!("{INCOMING}{}-{n}", std::process::id()));
        let kept = self.verify_and_keep(&incoming, upload, &onnx, registry);
        if incoming.exists() {
            std::fs::remove_dir_all(&incoming).map_err(|source| TunerError::Io {
                path: incoming.clone(),
                source,
            })?;
        }
        kept
    }

    fn verify_and_keep(
        &self,
        incoming: &Path,
        upload: BackboneUpload,
        onnx: &[u8],
        registry: &Registry,
    ) -> Result<(BackboneView, bool), TunerError> {
        let io = |path: PathBuf| move |source| TunerError::Io { path, source };
        std::fs::create_dir(incoming).map_err(io(incoming.to_path_buf()))?;
        upload.manifest.write_dir(incoming, &upload.classes, onnx)?;
        let backend = OrtBackend::load(incoming, &self.runtime).map_err(|e| match e {
            ModelError::Runtime { .. }
            | ModelError::Config(_)
            | ModelError::ExecutionProvider { .. } => TunerError::Model(e),
            other => TunerError::InvalidBackbone(
                other
                    .to_string()
                    .replace(&format!("{}/", incoming.display()), ""),
            ),
        })?;
        let info = backend.info().clone();
        let dir = self.dir.join(&info.backbone_version);
        let created = !dir.exists();
        if created {
            std::fs::rename(incoming, &dir).map_err(io(dir.clone()))?;
            sync_dir(&self.dir).map_err(io(self.dir.clone()))?;
        }
        registry.record(&ModelVersion {
            task: TaskName::general(),
            id: info.pretrained_version(),
            backbone: info.backbone_version.clone(),
            parent: None,
            metrics: serde_json::json!({"head": "pretrained", "name": info.name, "classes": info.num_classes}),
            created_ms: ndpipe_util::time::now_ms(),
            active: false,
        })?;
        info!(backbone = %info.backbone_version, name = %info.name, created, "backbone added");
        Ok((view(&dir, &info.backbone_version)?, created))
    }

    /// The files of kept backbone `sha256`, read whole (blocking);
    /// [`TunerError::UnknownBackbone`] when there is none.
    pub(crate) fn files(&self, sha256: &str) -> Result<BackboneFiles, TunerError> {
        let dir = self
            .dir_of(sha256)
            .ok_or_else(|| TunerError::UnknownBackbone(sha256.to_string()))?;
        let manifest = ModelManifest::load(&dir)?;
        let read =
            |path: PathBuf| std::fs::read(&path).map_err(|source| TunerError::Io { path, source });
        let manifest_json = String::from_utf8_lossy(&read(dir.join(MANIFEST_FILE))?).into_owned();
        let view = view(&dir, sha256)?;
        Ok(BackboneFiles {
            sha256: sha256.to_string(),
            version: view.model_version,
            manifest_json,
            classes: manifest.class_names().to_vec(),
            feature_dim: manifest.feature_dim,
            onnx: read(manifest.model_path())?,
        })
    }

    /// Every kept backbone, by name then version.
    pub(crate) fn list(&self) -> Result<Vec<BackboneView>, TunerError> {
        let io = |source| TunerError::Io {
            path: self.dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = file_name(&path);
            if let Some(dir) = self.dir_of(&name) {
                out.push(view(&dir, &name)?);
            }
        }
        out.sort_by(|a, b| (&a.name, &a.backbone).cmp(&(&b.name, &b.backbone)));
        Ok(out)
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The view of the backbone kept in `dir`.
fn view(dir: &Path, sha256: &str) -> Result<BackboneView, TunerError> {
    let manifest = ModelManifest::load(dir)?;
    let onnx = manifest.model_path();
    let bytes = std::fs::metadata(&onnx)
        .map_err(|source| TunerError::Io { path: onnx, source })?
        .len();
    let pretrained = ndpipe_model::ModelInfo {
        name: manifest.name.clone(),
        backbone_version: sha256.to_string(),
        input_size: manifest.input_size,
        feature_dim: manifest.feature_dim,
        num_classes: manifest.num_classes,
        class_names: Vec::new(),
    };
    Ok(BackboneView {
        backbone: sha256.to_string(),
        model_version: pretrained.pretrained_version(),
        name: manifest.name,
        feature_dim: manifest.feature_dim,
        num_classes: manifest.num_classes,
        bytes,
    })
}
