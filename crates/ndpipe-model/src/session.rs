//! [`OrtBackend`]: the model run by ONNX Runtime, loaded from a shared library at run time.
//!
//! Loading checks everything that could otherwise fail later: the library (present, really ONNX
//! Runtime, C API >= 31), the model file (present, parseable), and the ONNX graph against its
//! manifest (input name and shape, output names, feature and class dimensions, checked on a probe
//! batch). Each problem is a [`ModelError`] naming the file at fault.
//!
//! ONNX Runtime is process-global: the first [`OrtBackend::load`] loads the library, and later loads
//! must name the same library. Any number of sessions can share it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ort::environment::Environment;
use ort::ep::{self, ExecutionProvider as _};
use ort::session::Session;
use ort::value::{TensorElementType, TensorRef, ValueType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::{InferenceBackend, ModelError, ModelInfo, Normalizer, Outputs, check_batch};
use crate::manifest::{Layout, ModelManifest};
use crate::tensor::ImageTensor;

/// Where inference runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// ONNX Runtime's CPU kernels (always available).
    #[default]
    Cpu,
    /// NVIDIA CUDA; needs the `onnxruntime-gpu` library and CUDA/cuDNN on the host.
    Cuda,
    /// NVIDIA TensorRT, with CUDA for the nodes TensorRT does not take.
    #[serde(rename = "tensorrt")]
    TensorRt,
}

/// How to run models with ONNX Runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// The ONNX Runtime shared library (`libonnxruntime.so.1.x`, C API 31 or newer). A bare file
    /// name is looked up on the dynamic loader's search path.
    pub dylib: PathBuf,
    /// Threads per inference call; 0 lets ONNX Runtime choose (one per physical core).
    pub intra_threads: usize,
    /// The largest batch handed to one run.
    pub max_batch: usize,
    /// Where inference runs.
    pub execution_provider: ExecutionProvider,
}

impl ExecutionProvider {
    /// ONNX Runtime's name for the provider.
    pub fn ort_name(self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => ep::CPU::NAME,
            ExecutionProvider::Cuda => ep::CUDA::NAME,
            ExecutionProvider::TensorRt => ep::TensorRT::NAME,
        }
    }
}

impl std::str::FromStr for ExecutionProvider {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(ExecutionProvider::Cpu),
            "cuda" => Ok(ExecutionProvider::Cuda),
            "tensorrt" => Ok(ExecutionProvider::TensorRt),
            other => Err(ModelError::Config(format!(
                "unknown execution provider {other:?}: use cpu, cuda or tensorrt"
            ))),
        }
    }
}

impl RuntimeConfig {
    /// The settings for a model folder made by the setup step, whose ONNX Runtime library is
    /// `lib/libonnxruntime.so` inside it.
    pub fn for_model_dir(dir: &Path) -> Self {
        RuntimeConfig {
            dylib: dir.join("lib/libonnxruntime.so"),
            ..RuntimeConfig::default()
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            dylib: PathBuf::from("libonnxruntime.so"),
            intra_threads: 0,
            max_batch: 32,
            execution_provider: ExecutionProvider::Cpu,
        }
    }
}

/// The library this process has loaded, and its environment.
static RUNTIME: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

/// Loads the library at `dylib` once per process and returns the shared environment.
fn environment(dylib: &Path) -> Result<Environment, ModelError> {
    let err = |reason: String| ModelError::Runtime {
        path: dylib.to_path_buf(),
        reason,
    };
    let mut runtime = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((loaded, env)) = runtime.as_ref() {
        return if same_file(loaded, dylib) {
            Ok(env.clone())
        } else {
            Err(err(format!(
                "this process already uses ONNX Runtime from {}; one process can load only one",
                loaded.display()
            )))
        };
    }
    // A bare file name is left to the dynamic loader's search path.
    let has_dir = dylib.parent().is_some_and(|p| !p.as_os_str().is_empty());
    if has_dir && !dylib.is_file() {
        return Err(err("no such file".into()));
    }
    let env = ort::init_from(dylib)
        .map_err(|e| err(load_error(&e)))?
        .with_name("ndpipe")
        .with_telemetry(false)
        .build()
        .map_err(|e| err(format!("cannot create the environment: {e}")))?;
    *runtime = Some((dylib.to_path_buf(), env.clone()));
    Ok(env)
}

/// The loader's message, with the system's reason when `dlopen` itself failed.
fn load_error(e: &ort::LoadDynamicError) -> String {
    let mut reason = e.to_string();
    if let ort::LoadDynamicError::Dlopen { error, .. } = e {
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
    }
    reason
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The execution providers to register for `kind`, after checking the library has them.
fn execution_providers(
    kind: ExecutionProvider,
    dylib: &Path,
) -> Result<Vec<ep::ExecutionProviderDispatch>, ModelError> {
    let require = |name: &'static str, available: ort::Result<bool>| match available {
        Ok(true) => Ok(()),
        Ok(false) => Err(ModelError::ExecutionProvider {
            provider: name,
            reason: format!(
                "the ONNX Runtime library {} was not built with it (use the onnxruntime-gpu build, or execution_provider = \"cpu\")",
                dylib.display()
            ),
        }),
        Err(e) => Err(ModelError::ExecutionProvider {
            provider: name,
            reason: e.to_string(),
        }),
    };
    Ok(match kind {
        ExecutionProvider::Cpu => Vec::new(),
        ExecutionProvider::Cuda => {
            require(ep::CUDA::NAME, ep::CUDA::is_available())?;
            vec![ep::CUDA::default().build().error_on_failure()]
        }
        ExecutionProvider::TensorRt => {
            require(ep::TensorRT::NAME, ep::TensorRT::is_available())?;
            require(ep::CUDA::NAME, ep::CUDA::is_available())?;
            vec![
                ep::TensorRT::default().build().error_on_failure(),
                ep::CUDA::default().build().error_on_failure(),
            ]
        }
    })
}

struct SessionState {
    session: Session,
    /// The normalised input, reused across batches.
    input: Vec<f32>,
}

/// An [`InferenceBackend`] running an ONNX model with ONNX Runtime.
pub struct OrtBackend {
    state: Mutex<SessionState>,
    manifest: ModelManifest,
    info: ModelInfo,
    normalizer: Normalizer,
    max_batch: usize,
}

impl std::fmt::Debug for OrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtBackend")
            .field("model", &self.info.name)
            .field("backbone_version", &self.info.backbone_version)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl OrtBackend {
    /// Loads the manifest in `model_dir` and the model it names.
    pub fn load(model_dir: impl AsRef<Path>, config: &RuntimeConfig) -> Result<Self, ModelError> {
        Self::from_manifest(ModelManifest::load(model_dir)?, config)
    }

    /// Loads the model of an already loaded manifest, and checks the graph against it.
    ///
    /// The file is read once: its sha256 becomes the backbone version and the same bytes are
    /// handed to ONNX Runtime, so the version always names what runs. (Models with external
    /// weight files are therefore not supported.)
    pub fn from_manifest(
        manifest: ModelManifest,
        config: &RuntimeConfig,
    ) -> Result<Self, ModelError> {
        if config.max_batch == 0 {
            return Err(ModelError::Config("max_batch must be at least 1".into()));
        }
        let env = environment(&config.dylib)?;
        let path = manifest.model_path();
        let file_err = |reason: String| ModelError::ModelFile {
            path: path.clone(),
            reason,
        };
        let bytes = fs::read(&path).map_err(|e| file_err(format!("cannot read: {e}")))?;
        let backbone_version = hex::encode(Sha256::digest(&bytes));
        let providers = execution_providers(config.execution_provider, &config.dylib)?;
        let session = Session::builder(&env)
            .map_err(|e| file_err(format!("cannot create a session: {e}")))?
            .with_intra_threads(config.intra_threads)
            .map_err(|e| file_err(format!("cannot set {} threads: {e}", config.intra_threads)))?
            .with_execution_providers(providers)
            .map_err(|e| ModelError::ExecutionProvider {
                provider: config.execution_provider.ort_name(),
                reason: e.to_string(),
            })?
            .commit_from_memory(&bytes)
            .map_err(|e| file_err(format!("ONNX Runtime cannot load it: {e}")))?;
        check_graph(&session, &manifest)?;
        let backend = OrtBackend {
            info: ModelInfo {
                name: manifest.name.clone(),
                backbone_version,
                input_size: manifest.input_size,
                feature_dim: manifest.feature_dim,
                num_classes: manifest.num_classes,
                class_names: manifest.class_names().to_vec(),
            },
            normalizer: Normalizer::new(&manifest),
            state: Mutex::new(SessionState {
                session,
                input: Vec::new(),
            }),
            manifest,
            max_batch: config.max_batch,
        };
        backend.probe().map_err(|e| ModelError::Mismatch {
            path: path.clone(),
            reason: format!("a probe batch of one image failed: {e}"),
        })?;
        Ok(backend)
    }

    /// The hex sha256 of the ONNX file: the backbone version that features are stored under.
    pub fn backbone_version(&self) -> &str {
        &self.info.backbone_version
    }

    /// The manifest the model was loaded with.
    pub fn manifest(&self) -> &ModelManifest {
        &self.manifest
    }

    /// Runs one mid-grey image; the outputs must have the manifest's dimensions and be finite.
    fn probe(&self) -> Result<(), ModelError> {
        let [h, w] = self.info.input_size;
        let grey = ImageTensor::new(h, w, 3, vec![128; (h * w * 3) as usize])
            .map_err(|e| ModelError::Inference(e.to_string()))?;
        let out = self.run(&[grey])?;
        if out
            .all_features()
            .iter()
            .chain(out.all_logits())
            .all(|v| v.is_finite())
        {
            Ok(())
        } else {
            Err(ModelError::Inference(
                "the outputs hold NaN or infinity".into(),
            ))
        }
    }
}

/// Checks the session's input and outputs against the manifest, as far as static shapes allow.
fn check_graph(session: &Session, manifest: &ModelManifest) -> Result<(), ModelError> {
    let err = |reason: String| ModelError::Mismatch {
        path: manifest.model_path(),
        reason,
    };
    let names = |outlets: &[ort::value::Outlet]| {
        outlets
            .iter()
            .map(|o| o.name().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let inputs = session.inputs();
    let input = match inputs {
        [only] if only.name() == manifest.input => only,
        _ => {
            return Err(err(format!(
                "the manifest's input is `{}`, the model's inputs are [{}] (exactly one is supported)",
                manifest.input,
                names(inputs)
            )));
        }
    };
    let [h, w] = manifest.input_size.map(i64::from);
    let want = match manifest.layout {
        Layout::Nchw => [-1, 3, h, w],
        Layout::Nhwc => [-1, h, w, 3],
    };
    let shape = float_tensor_shape(input.dtype()).ok_or_else(|| {
        err(format!(
            "input `{}` is {}, expected an f32 tensor",
            input.name(),
            input.dtype()
        ))
    })?;
    let fits = shape.len() == 4
        && shape
            .iter()
            .zip(want)
            .skip(1)
            .all(|(&got, want)| got < 0 || got == want);
    if !fits {
        return Err(err(format!(
            "input `{}` has shape {shape:?}, the manifest ({:?}, input_size {:?}) needs {want:?}",
            input.name(),
            manifest.layout,
            manifest.input_size
        )));
    }
    for (name, dim, field) in [
        (
            &manifest.outputs.features,
            manifest.feature_dim,
            "feature_dim",
        ),
        (
            &manifest.outputs.logits,
            manifest.num_classes,
            "num_classes",
        ),
    ] {
        let output = session
            .outputs()
            .iter()
            .find(|o| o.name() == name)
            .ok_or_else(|| {
                err(format!(
                    "the manifest names output `{name}`, the model's outputs are [{}]",
                    names(session.outputs())
                ))
            })?;
        let shape = float_tensor_shape(output.dtype()).ok_or_else(|| {
            err(format!(
                "output `{name}` is {}, expected an f32 tensor",
                output.dtype()
            ))
        })?;
        let fits = shape.len() == 2 && (shape[1] < 0 || shape[1] == dim as i64);
        if !fits {
            return Err(err(format!(
                "output `{name}` has shape {shape:?}, the manifest's {field} = {dim} needs [N, {dim}]"
            )));
        }
    }
    Ok(())
}

fn float_tensor_shape(dtype: &ValueType) -> Option<Vec<i64>> {
    match dtype {
        ValueType::Tensor {
            ty: TensorElementType::Float32,
            shape,
            ..
        } => Some(shape.iter().copied().collect()),
        _ => None,
    }
}

impl InferenceBackend for OrtBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn health(&self) -> Result<(), ModelError> {
        self.probe()
    }

    fn run(&self, batch: &[ImageTensor]) -> Result<Outputs, ModelError> {
        check_batch(&self.info, self.max_batch, batch)?;
        let (dim, classes) = (self.info.feature_dim, self.info.num_classes);
        if batch.is_empty() {
            return Outputs::new(0, dim, classes, Vec::new(), Vec::new());
        }
        let run_err = |e: ort::Error| ModelError::Inference(e.to_string());
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let SessionState { session, input } = &mut *state;
        self.normalizer.fill(batch, input);
        let tensor =
            TensorRef::from_array_view((self.normalizer.shape(batch.len()), input.as_slice()))
                .map_err(run_err)?;
        let outputs = session
            .run(ort::inputs![self.manifest.input.as_str() => tensor])
            .map_err(run_err)?;
        let take = |name: &str, width: usize| -> Result<Vec<f32>, ModelError> {
            let value = outputs
                .get(name)
                .ok_or_else(|| ModelError::Inference(format!("output `{name}` is missing")))?;
            let (shape, data) = value.try_extract_tensor::<f32>().map_err(run_err)?;
            if shape.len() != 2 || shape[0] != batch.len() as i64 || shape[1] != width as i64 {
                return Err(ModelError::Inference(format!(
                    "output `{name}` has shape {:?}, expected [{}, {width}]",
                    shape.iter().collect::<Vec<_>>(),
                    batch.len()
                )));
            }
            Ok(data.to_vec())
        };
        let features = take(&self.manifest.outputs.features, dim)?;
        let logits = take(&self.manifest.outputs.logits, classes)?;
        Outputs::new(batch.len(), dim, classes, features, logits)
    }
}
