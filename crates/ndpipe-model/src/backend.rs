//! The inference interface every model backend implements, and the helpers around it.
//!
//! [`InferenceBackend`] is synchronous on purpose: it is driven from a dedicated inference thread,
//! never from the async runtime. A backend takes a batch of stored [`ImageTensor`]s (u8 RGB, HWC),
//! normalises them itself with a [`Normalizer`], and returns pooled features and logits.

use std::path::PathBuf;

use crate::manifest::{Layout, ModelManifest};
use crate::tensor::ImageTensor;

/// Errors from loading or running a model. Load-time variants name the file and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The manifest or its classes file is missing, malformed or inconsistent.
    #[error("model manifest {}: {reason}", path.display())]
    Manifest {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The ONNX file is missing, unreadable, or ONNX Runtime cannot load it.
    #[error("model file {}: {reason}", path.display())]
    ModelFile {
        /// The ONNX file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The ONNX graph does not match its manifest (names, element types or dimensions).
    #[error("model file {} does not match its manifest: {reason}", path.display())]
    Mismatch {
        /// The ONNX file.
        path: PathBuf,
        /// The first difference found.
        reason: String,
    },
    /// The ONNX Runtime library cannot be loaded: missing, not ONNX Runtime, or too old.
    #[error("ONNX Runtime library {}: {reason}", path.display())]
    Runtime {
        /// The configured library path.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A runtime setting is out of range.
    #[error("invalid runtime config: {0}")]
    Config(String),
    /// The configured execution provider is not available in the loaded ONNX Runtime.
    #[error("execution provider {provider}: {reason}")]
    ExecutionProvider {
        /// The provider's ONNX Runtime name.
        provider: &'static str,
        /// Why it could not be used.
        reason: String,
    },
    /// A tensor in the batch does not have the model's input shape.
    #[error(
        "batch item {index} is {height}x{width}x{channels}, the model takes {want_height}x{want_width}x3"
    )]
    InputShape {
        /// Position in the batch.
        index: usize,
        /// Its height.
        height: u32,
        /// Its width.
        width: u32,
        /// Its channels.
        channels: u32,
        /// The model's input height.
        want_height: u32,
        /// The model's input width.
        want_width: u32,
    },
    /// The batch holds more images than the backend's `max_batch`.
    #[error("batch of {len} images is over the limit of {max}")]
    BatchTooLarge {
        /// Images in the batch.
        len: usize,
        /// The backend's limit.
        max: usize,
    },
    /// Inference failed at run time.
    #[error("inference failed: {0}")]
    Inference(String),
}

/// What a loaded model is, as the rest of the system needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The manifest's model name.
    pub name: String,
    /// Identifies the backbone: the hex sha256 of the ONNX file. Features are stored under it.
    pub backbone_version: String,
    /// Input `[height, width]`.
    pub input_size: [u32; 2],
    /// Length of each feature vector.
    pub feature_dim: usize,
    /// Number of classes (length of each logits row).
    pub num_classes: usize,
    /// Class names in class-index order.
    pub class_names: Vec<String>,
}

impl ModelInfo {
    /// The name of class `index`, if it exists.
    pub fn class_name(&self, index: usize) -> Option<&str> {
        self.class_names.get(index).map(String::as_str)
    }

    /// The model version id of this backbone with its own classifier: its name and the backbone
    /// hash prefix. PipeStores register it at start, and the Tuner when a backbone is added.
    pub fn pretrained_version(&self) -> String {
        let short = &self.backbone_version[..self.backbone_version.len().min(12)];
        format!("{}-{short}", self.name)
    }
}

/// Features and logits for a batch, row-major: row `i` belongs to batch item `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    len: usize,
    feature_dim: usize,
    num_classes: usize,
    features: Vec<f32>,
    logits: Vec<f32>,
}

impl Outputs {
    /// Wraps `len` rows of features (`len * feature_dim` values) and logits (`len * num_classes`).
    pub fn new(
        len: usize,
        feature_dim: usize,
        num_classes: usize,
        features: Vec<f32>,
        logits: Vec<f32>,
    ) -> Result<Self, ModelError> {
        if features.len() != len * feature_dim || logits.len() != len * num_classes {
            return Err(ModelError::Inference(format!(
                "outputs for {len} images have {} feature and {} logit values, expected {} and {}",
                features.len(),
                logits.len(),
                len * feature_dim,
                len * num_classes
            )));
        }
        Ok(Outputs {
            len,
            feature_dim,
            num_classes,
            features,
            logits,
        })
    }

    /// Number of batch items.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Length of one feature row.
    pub fn feature_dim(&self) -> usize {
        self.feature_dim
    }

    /// Length of one logits row.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// The feature vector of item `i`. Panics if `i >= len()`.
    pub fn features(&self, i: usize) -> &[f32] {
        &self.features[i * self.feature_dim..(i + 1) * self.feature_dim]
    }

    /// The logits of item `i`. Panics if `i >= len()`.
    pub fn logits(&self, i: usize) -> &[f32] {
        &self.logits[i * self.num_classes..(i + 1) * self.num_classes]
    }

    /// All features, `[len, feature_dim]` row-major.
    pub fn all_features(&self) -> &[f32] {
        &self.features
    }

    /// All logits, `[len, num_classes]` row-major.
    pub fn all_logits(&self) -> &[f32] {
        &self.logits
    }
}

/// A model that turns a batch of image tensors into features and logits.
///
/// Implementations are synchronous and may block for the duration of a batch; call them from a
/// dedicated thread.
pub trait InferenceBackend: Send + Sync {
    /// The loaded model.
    fn info(&self) -> &ModelInfo;

    /// The largest batch [`InferenceBackend::run`] accepts.
    fn max_batch(&self) -> usize;

    /// Runs a probe through the model; an error means the backend cannot serve.
    fn health(&self) -> Result<(), ModelError>;

    /// Runs one batch (at most [`InferenceBackend::max_batch`] images of the model's input size).
    /// An empty batch gives empty outputs.
    fn run(&self, batch: &[ImageTensor]) -> Result<Outputs, ModelError>;
}

/// Checks a batch against the model's input size and the batch limit.
pub fn check_batch(
    info: &ModelInfo,
    max_batch: usize,
    batch: &[ImageTensor],
) -> Result<(), ModelError> {
    if batch.len() > max_batch {
        return Err(ModelError::BatchTooLarge {
            len: batch.len(),
            max: max_batch,
        });
    }
    let [want_height, want_width] = info.input_size;
    for (index, t) in batch.iter().enumerate() {
        if t.height() != want_height || t.width() != want_width || t.channels() != 3 {
            return Err(ModelError::InputShape {
                index,
                height: t.height(),
                width: t.width(),
                channels: t.channels(),
                want_height,
                want_width,
            });
        }
    }
    Ok(())
}

/// Softmax over one logits row, then the `k` most probable classes as `(class index, probability)`,
/// most probable first (ties: lower index first).
pub fn top_k(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    let mut scored: Vec<(usize, f32)> = logits
        .iter()
        .map(|&l| (l - max).exp() / sum)
        .enumerate()
        .collect();
    let by_prob = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = k.min(scored.len());
    if k < scored.len() && k > 0 {
        scored.select_nth_unstable_by(k - 1, by_prob);
    }
    scored.truncate(k);
    scored.sort_unstable_by(by_prob);
    scored
}

/// Turns u8 HWC tensors into the model's normalised f32 input, `(p / 255 - mean) / std`, in the
/// manifest's layout: one pass over the pixels through a per-channel lookup table.
#[derive(Debug, Clone)]
pub struct Normalizer {
    lut: [[f32; 256]; 3],
    height: usize,
    width: usize,
    layout: Layout,
}

impl Normalizer {
    /// A normaliser for the manifest's input size, layout, mean and std.
    pub fn new(manifest: &ModelManifest) -> Self {
        let mut lut = [[0.0f32; 256]; 3];
        for (c, table) in lut.iter_mut().enumerate() {
            for (p, v) in table.iter_mut().enumerate() {
                *v = (p as f32 / 255.0 - manifest.mean[c]) / manifest.std[c];
            }
        }
        let [height, width] = manifest.input_size;
        Normalizer {
            lut,
            height: height as usize,
            width: width as usize,
            layout: manifest.layout,
        }
    }

    /// The input tensor shape for a batch of `n`.
    pub fn shape(&self, n: usize) -> [usize; 4] {
        match self.layout {
            Layout::Nchw => [n, 3, self.height, self.width],
            Layout::Nhwc => [n, self.height, self.width, 3],
        }
    }

    /// Values per image.
    pub fn image_len(&self) -> usize {
        self.height * self.width * 3
    }

    /// Fills `out` (resized to fit, capacity reused) with the normalised batch. The tensors must
    /// already have the input shape; see [`check_batch`].
    pub fn fill(&self, batch: &[ImageTensor], out: &mut Vec<f32>) {
        let len = self.image_len();
        out.clear();
        out.resize(batch.len() * len, 0.0);
        for (tensor, dst) in batch.iter().zip(out.chunks_exact_mut(len)) {
            let pixels = tensor.data().chunks_exact(3);
            let [lr, lg, lb] = &self.lut;
            match self.layout {
                Layout::Nchw => {
                    let plane = self.height * self.width;
                    let (r, rest) = dst.split_at_mut(plane);
                    let (g, b) = rest.split_at_mut(plane);
                    for (((p, r), g), b) in pixels.zip(r).zip(g).zip(b) {
                        *r = lr[usize::from(p[0])];
                        *g = lg[usize::from(p[1])];
                        *b = lb[usize::from(p[2])];
                    }
                }
                Layout::Nhwc => {
                    for (p, d) in pixels.zip(dst.chunks_exact_mut(3)) {
                        d[0] = lr[usize::from(p[0])];
                        d[1] = lg[usize::from(p[1])];
                        d[2] = lb[usize::from(p[2])];
                    }
                }
            }
        }
    }
}

#[cfg(feature = "testing")]
pub use fake::FakeBackend;

#[cfg(feature = "testing")]
mod fake {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use super::{InferenceBackend, ModelError, ModelInfo, Outputs, check_batch};
    use crate::tensor::ImageTensor;

    /// Side of the grid of cells whose colour means make up the fake's base statistics.
    const GRID: usize = 4;

    /// A deterministic stand-in for a real model, for tests of the rest of the system.
    ///
    /// Features are pixel statistics: the mean of each channel in each cell of a 4x4 grid plus the
    /// whole-image mean and standard deviation per channel, repeated with a per-repeat scale to
    /// `feature_dim`. Similar images get similar features. Logits are a fixed pseudo-random linear
    /// map of the features. The same pixels always give bit-identical outputs, alone or in a batch.
    #[derive(Debug)]
    pub struct FakeBackend {
        info: ModelInfo,
        max_batch: usize,
        latency: Duration,
        failing: AtomicBool,
        batches: AtomicU64,
    }

    impl FakeBackend {
        /// A fake with `feature_dim` features and `num_classes` classes (`class 0`, `class 1`, ...),
        /// a 224x224 input and `max_batch` 32.
        pub fn new(feature_dim: usize, num_classes: usize) -> Self {
            FakeBackend {
                info: ModelInfo {
                    name: "fake".into(),
                    backbone_version: format!("fake-{feature_dim}x{num_classes}"),
                    input_size: [224, 224],
                    feature_dim,
                    num_classes,
                    class_names: (0..num_classes).map(|i| format!("class {i}")).collect(),
                },
                max_batch: 32,
                latency: Duration::ZERO,
                failing: AtomicBool::new(false),
                batches: AtomicU64::new(0),
            }
        }

        /// Replaces the model description (input size, version, class names).
        pub fn with_info(mut self, info: ModelInfo) -> Self {
            self.info = info;
            self
        }

        /// Sets the batch limit.
        pub fn with_max_batch(mut self, max_batch: usize) -> Self {
            self.max_batch = max_batch;
            self
        }

        /// Sleeps this long per batch, to stand in for inference time.
        pub fn with_latency(mut self, latency: Duration) -> Self {
            self.latency = latency;
            self
        }

        /// While set, `run` and `health` fail with [`ModelError::Inference`].
        pub fn set_failing(&self, failing: bool) {
            self.failing.store(failing, Ordering::SeqCst);
        }

        /// Batches run so far (including empty ones).
        pub fn batches(&self) -> u64 {
            self.batches.load(Ordering::SeqCst)
        }

        fn check_failing(&self) -> Result<(), ModelError> {
            if self.failing.load(Ordering::SeqCst) {
                Err(ModelError::Inference("fake backend set to fail".into()))
            } else {
                Ok(())
            }
        }

        /// The fake's features for one image, appended to `out`.
        fn features(&self, tensor: &ImageTensor, out: &mut Vec<f32>) {
            let (h, w) = (tensor.height() as usize, tensor.width() as usize);
            let mut cells = [[0.0f64; 3]; GRID * GRID];
            let mut counts = [0u32; GRID * GRID];
            let mut sum = [0.0f64; 3];
            let mut sq = [0.0f64; 3];
            for (i, p) in tensor.data().chunks_exact(3).enumerate() {
                let cell = (i / w) * GRID / h * GRID + (i % w) * GRID / w;
                counts[cell] += 1;
                for c in 0..3 {
                    let v = f64::from(p[c]) / 255.0;
                    cells[cell][c] += v;
                    sum[c] += v;
                    sq[c] += v * v;
                }
            }
            let n = (h * w) as f64;
            let mut base = Vec::with_capacity(GRID * GRID * 3 + 6);
            for (cell, count) in cells.iter().zip(counts) {
                base.extend(cell.iter().map(|s| s / f64::from(count.max(1))));
            }
            for c in 0..3 {
                let mean = sum[c] / n;
                base.push(mean);
                base.push((sq[c] / n - mean * mean).max(0.0).sqrt());
            }
            out.extend((0..self.info.feature_dim).map(|j| {
                let scale = 1.0 + (j / base.len()) as f64 * 0.25;
                (base[j % base.len()] * scale) as f32
            }));
        }
    }

    /// A fixed weight in -1..1 for (class, feature), from a 64-bit mix of the pair.
    fn weight(class: usize, feature: usize) -> f32 {
        let mut x = (class as u64) << 32 | feature as u64;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    impl InferenceBackend for FakeBackend {
        fn info(&self) -> &ModelInfo {
            &self.info
        }

        fn max_batch(&self) -> usize {
            self.max_batch
        }

        fn health(&self) -> Result<(), ModelError> {
            self.check_failing()
        }

        fn run(&self, batch: &[ImageTensor]) -> Result<Outputs, ModelError> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.check_failing()?;
            check_batch(&self.info, self.max_batch, batch)?;
            std::thread::sleep(self.latency);
            let (dim, classes) = (self.info.feature_dim, self.info.num_classes);
            let mut features = Vec::with_capacity(batch.len() * dim);
            for tensor in batch {
                self.features(tensor, &mut features);
            }
            let mut logits = Vec::with_capacity(batch.len() * classes);
            for row in features.chunks_exact(dim.max(1)) {
                logits.extend((0..classes).map(|k| {
                    row.iter()
                        .enumerate()
                        .map(|(j, f)| f * weight(k, j))
                        .sum::<f32>()
                }));
            }
            Outputs::new(batch.len(), dim, classes, features, logits)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_softmax() {
        let top = top_k(&[1.0, 3.0, 2.0, 3.0], 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let all: f32 = top_k(&[1.0, 3.0, 2.0, 3.0], 10).iter().map(|t| t.1).sum();
        assert!((all - 1.0).abs() < 1e-6);
        assert!((top[0].1 - top[1].1).abs() < 1e-7);
        assert!(top_k(&[1.0, 2.0], 0).is_empty());
        assert!(top_k(&[1000.0, -1000.0], 1)[0].1.is_finite());
    }

    #[test]
    fn outputs_check_their_lengths() {
        assert!(Outputs::new(2, 3, 1, vec![0.0; 6], vec![0.0; 2]).is_ok());
        assert!(Outputs::new(2, 3, 1, vec![0.0; 5], vec![0.0; 2]).is_err());
        let out = Outputs::new(2, 2, 1, vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0]).unwrap();
        assert_eq!(out.features(1), &[3.0, 4.0]);
        assert_eq!(out.logits(1), &[6.0]);
    }
}
