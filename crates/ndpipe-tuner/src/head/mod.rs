//! The classifier head: trained on the Tuner from features, deployed to PipeStores. Its file
//! format is in [`mod@file`].

use std::collections::HashSet;
use std::time::Instant;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use ndpipe_model::{Acceptance, HeadWeights};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};

use crate::TunerError;
use crate::schedule::learning_rate;

mod file;
mod streaming;

pub(crate) use streaming::StreamingRun;

/// Feature dimension of the EfficientNet-Lite0 backbone.
const DEFAULT_INPUT_DIM: usize = 1280;
/// NDPipe's epochs per run.
const DEFAULT_EPOCHS: usize = 30;
/// NDPipe's training batch size.
const DEFAULT_BATCH: usize = 1024;
/// NDPipe's L2 coefficient (weights, biases and activities).
const DEFAULT_L2: f64 = 0.002;

const ADAM_BETA1: f64 = 0.9;
const ADAM_BETA2: f64 = 0.999;
const ADAM_EPS: f64 = 1e-7;
/// Rows per forward pass when predicting or evaluating.
const EVAL_ROWS: usize = 8192;

// Tags that separate the random streams derived from one seed.
const STREAM_INIT: u64 = 1;
const STREAM_SHUFFLE: u64 = 2;
const STREAM_GROW: u64 = 3;

/// Shape and training settings of a head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadConfig {
    /// Feature dimension the head reads (the backbone's output size).
    pub input_dim: usize,
    /// Width of an optional hidden ReLU layer; `None` is NDPipe's single Dense layer.
    pub hidden: Option<usize>,
    /// Class names; label `i` is `classes[i]`.
    pub classes: Vec<String>,
    /// Default epochs per run.
    pub epochs: usize,
    /// Training batch size.
    pub batch: usize,
    /// L2 coefficient on weights, biases and output activities.
    pub l2: f64,
    /// Seed of every random choice in initialisation and training.
    pub seed: u64,
}

impl HeadConfig {
    /// NDPipe's settings (1280-d input, no hidden layer, 30 epochs, batch 1024, L2 0.002, seed 0)
    /// for `classes`.
    pub fn new(classes: Vec<String>) -> Self {
        Self {
            input_dim: DEFAULT_INPUT_DIM,
            hidden: None,
            classes,
            epochs: DEFAULT_EPOCHS,
            batch: DEFAULT_BATCH,
            l2: DEFAULT_L2,
            seed: 0,
        }
    }

    fn validate(&self) -> Result<(), TunerError> {
        let invalid = |m: &str| Err(TunerError::InvalidArgument(m.into()));
        if self.input_dim == 0 {
            return invalid("input_dim must be at least 1");
        }
        if self.hidden == Some(0) {
            return invalid("hidden width must be at least 1");
        }
        if self.classes.is_empty() {
            return invalid("a head needs at least one class");
        }
        if u32::try_from(self.classes.len()).is_err() {
            return invalid("too many classes for u32 labels");
        }
        if self.epochs == 0 || self.batch == 0 {
            return invalid("epochs and batch must be at least 1");
        }
        if !self.l2.is_finite() || self.l2 < 0.0 {
            return invalid("l2 must be finite and non-negative");
        }
        let mut seen = HashSet::new();
        for class in &self.classes {
            if !seen.insert(class) {
                return Err(TunerError::DuplicateClass(class.clone()));
            }
        }
        Ok(())
    }
}

/// What one training run did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Run index, from 0.
    pub run: usize,
    /// Number of runs of the job.
    pub runs: usize,
    /// Training rows of this run.
    pub rows: usize,
    /// Epochs trained.
    pub epochs: usize,
    /// Learning rate of each epoch.
    pub learning_rates: Vec<f64>,
    /// Mean training objective (cross-entropy plus penalties) of each epoch.
    pub losses: Vec<f32>,
    /// Wall-clock seconds of the run, including the copy of the features.
    pub seconds: f64,
}

/// Top-1 class of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Class index into [`Head::classes`].
    pub class: usize,
    /// Softmax probability of that class.
    pub prob: f32,
}

/// One dense layer, `y = x Wᵀ + b`, with `W` of shape `[out, in]` (a row per output).
#[derive(Debug)]
struct Dense {
    weight: Var,
    bias: Var,
}

impl Dense {
    /// Glorot-uniform weights and zero bias, Keras' `Dense` defaults.
    fn glorot(out: usize, input: usize, rng: &mut Pcg64Mcg) -> Result<Self, TunerError> {
        let weight = glorot_values(out, input, out + input, rng);
        Ok(Self {
            weight: Var::from_vec(weight, (out, input), &Device::Cpu)?,
            bias: Var::zeros(out, DType::F32, &Device::Cpu)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)
    }

    /// `|W|² + |b|²`.
    fn squared_norm(&self) -> candle_core::Result<Tensor> {
        self.weight.sqr()?.sum_all()? + self.bias.sqr()?.sum_all()?
    }
}

/// A classifier head over backbone features.
///
/// The model is NDPipe's head (`ndpipe.md` §2.2): `Dense(input_dim -> C)` with a softmax, or, with
/// [`HeadConfig::hidden`], `Dense(input_dim -> H) -> ReLU -> Dense(H -> C)`. Training minimises
///
/// ```text
/// cross_entropy(softmax(z), y)
///   + l2 * Σ over layers (|W|² + |b|²)      // Keras kernel_regularizer and bias_regularizer
///   + l2 * (|z|² + |softmax(z)|²) / batch    // Keras activity_regularizer on Dense and Softmax
/// ```
///
/// where `z` are the logits of a batch, as NDPipe's Keras head does (L2 0.002 on kernel, bias and
/// activity of the output Dense and activity of the Softmax; Keras divides activity penalties by the
/// batch size). The hidden layer, which NDPipe does not have, gets the same weight penalty and no
/// activity penalty. The optimiser is Adam (β 0.9/0.999, ε 1e-7 as in Keras) in fp32; each run starts
/// with fresh Adam moments from the current weights, and its learning rate follows NDPipe's step
/// schedule (five steps over a run's epochs, from 0.015 down to 0.0015) scaled by `(r - k/2) / r`
/// for run `k` of `r`.
///
/// Everything random (initial weights, per-epoch shuffles, rows for new classes) comes from a PCG
/// stream derived from [`HeadConfig::seed`], so the same seed and data give bit-identical weights.
#[derive(Debug)]
pub struct Head {
    config: HeadConfig,
    hidden: Option<Dense>,
    output: Dense,
    /// Its rules for keeping labels, calibrated after training.
    acceptance: Acceptance,
}

impl Head {
    /// A freshly initialised head.
    pub fn new(config: HeadConfig) -> Result<Self, TunerError> {
        config.validate()?;
        let mut rng = stream(config.seed, STREAM_INIT, 0);
        let hidden = config
            .hidden
            .map(|h| Dense::glorot(h, config.input_dim, &mut rng))
            .transpose()?;
        let fan_in = config.hidden.unwrap_or(config.input_dim);
        let output = Dense::glorot(config.classes.len(), fan_in, &mut rng)?;
        Ok(Self {
            config,
            hidden,
            output,
            acceptance: Acceptance::default(),
        })
    }

    /// The head's rules for keeping labels (a floor, a novelty check).
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Sets the head's rules for keeping labels; fails when the novelty check does not fit the
    /// head's classes and input.
    pub fn set_acceptance(&mut self, acceptance: Acceptance) -> Result<(), TunerError> {
        if let Some(n) = &acceptance.novelty
            && (n.center.len() != self.input_dim()
                || n.centroids.len() != self.classes().len() * self.input_dim())
        {
            return Err(TunerError::Internal(format!(
                "a novelty check of {} classes for a head of {}",
                n.centroids.len() / n.center.len().max(1),
                self.classes().len()
            )));
        }
        self.acceptance = acceptance;
        Ok(())
    }

    /// The head's configuration (its classes grow with [`Head::grow_classes`]).
    pub fn config(&self) -> &HeadConfig {
        &self.config
    }

    /// Class names, indexed by label.
    pub fn classes(&self) -> &[String] {
        &self.config.classes
    }

    /// Feature dimension the head reads.
    pub fn input_dim(&self) -> usize {
        self.config.input_dim
    }

    /// Refuses a head that does not read `expected`-dimensional features (e.g. before deploying
    /// it behind a backbone).
    pub fn check_input_dim(&self, expected: usize) -> Result<(), TunerError> {
        if self.config.input_dim == expected {
            Ok(())
        } else {
            Err(TunerError::InputDimMismatch {
                expected,
                found: self.config.input_dim,
            })
        }
    }

    /// Trains run `run` (from 0) of `runs` for `epochs` epochs on `features` (row-major,
    /// `labels.len() × input_dim`), starting from the current weights.
    ///
    /// Rows are shuffled every epoch; the learning rate is NDPipe's step schedule scaled for the run.
    pub fn train_run(
        &mut self,
        features: &[f32],
        labels: &[u32],
        run: usize,
        runs: usize,
        epochs: usize,
    ) -> Result<RunReport, TunerError> {
        if run >= runs {
            return Err(TunerError::InvalidArgument(format!(
                "run {run} is not below the number of runs {runs}"
            )));
        }
        if epochs == 0 {
            return Err(TunerError::InvalidArgument(
                "epochs must be at least 1".into(),
            ));
        }
        let rows = self.check_labelled(features, labels)?;
        if rows == 0 {
            return Err(TunerError::EmptyData);
        }
        let row_count = u32::try_from(rows).map_err(|_| {
            TunerError::InvalidArgument(format!("{rows} rows exceed the u32 row index"))
        })?;
        let mut order: Vec<u32> = (0..row_count).collect();

        let start = Instant::now();
        let xs = Tensor::from_slice(features, (rows, self.config.input_dim), &Device::Cpu)?;
        let ys = Tensor::from_slice(labels, rows, &Device::Cpu)?;
        let mut optimizer = self.adam(learning_rate(0, epochs, run, runs))?;
        let mut rng = stream(self.config.seed, STREAM_SHUFFLE, run as u64);
        let mut learning_rates = Vec::with_capacity(epochs);
        let mut losses = Vec::with_capacity(epochs);
        for epoch in 0..epochs {
            let lr = learning_rate(epoch, epochs, run, runs);
            optimizer.set_learning_rate(lr);
            order.shuffle(&mut rng);
            let mut total = 0.0f64;
            for batch in order.chunks(self.config.batch) {
                let index = Tensor::from_slice(batch, batch.len(), &Device::Cpu)?;
                let x = xs.index_select(&index, 0)?;
                let y = ys.index_select(&index, 0)?;
                let loss = self.objective(&x, &y)?;
                optimizer.backward_step(&loss)?;
                total += f64::from(loss.to_scalar::<f32>()?) * batch.len() as f64;
            }
            learning_rates.push(lr);
            losses.push((total / rows as f64) as f32);
        }
        Ok(RunReport {
            run,
            runs,
            rows,
            epochs,
            learning_rates,
            losses,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Starts run `run` of `runs` (of `epochs` epochs) fed batch by batch, for training data that
    /// does not fit in memory: the caller draws each batch (e.g. through a cache).
    pub(crate) fn streaming(
        &mut self,
        run: usize,
        runs: usize,
        epochs: usize,
    ) -> Result<StreamingRun<'_>, TunerError> {
        if run >= runs || epochs == 0 {
            return Err(TunerError::InvalidArgument(format!(
                "run {run} of {runs} with {epochs} epochs"
            )));
        }
        let optimizer = self.adam(learning_rate(0, epochs, run, runs))?;
        Ok(StreamingRun {
            head: self,
            optimizer,
            run,
            runs,
            epochs,
            epoch_loss: (0.0, 0),
        })
    }

    /// A fresh Adam (Keras constants, no decoupled weight decay: the L2 is in the objective).
    fn adam(&self, lr: f64) -> Result<AdamW, TunerError> {
        Ok(AdamW::new(
            self.vars(),
            ParamsAdamW {
                lr,
                beta1: ADAM_BETA1,
                beta2: ADAM_BETA2,
                eps: ADAM_EPS,
                weight_decay: 0.0,
            },
        )?)
    }

    /// The training objective (cross-entropy plus penalties) over all of `features`, without training.
    pub fn loss(&self, features: &[f32], labels: &[u32]) -> Result<f32, TunerError> {
        let rows = self.check_labelled(features, labels)?;
        if rows == 0 {
            return Err(TunerError::EmptyData);
        }
        let x = Tensor::from_slice(features, (rows, self.config.input_dim), &Device::Cpu)?;
        let y = Tensor::from_slice(labels, rows, &Device::Cpu)?;
        Ok(self.objective(&x, &y)?.to_scalar::<f32>()?)
    }

    /// Logits, row-major `rows × classes`.
    pub fn logits(&self, features: &[f32]) -> Result<Vec<f32>, TunerError> {
        let rows = self.rows(features)?;
        let mut out = Vec::with_capacity(rows * self.config.classes.len());
        for chunk in features.chunks(EVAL_ROWS * self.config.input_dim) {
            let n = chunk.len() / self.config.input_dim;
            let x = Tensor::from_slice(chunk, (n, self.config.input_dim), &Device::Cpu)?;
            out.extend(self.forward(&x)?.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// Top-1 class and its probability for each row.
    pub fn predict(&self, features: &[f32]) -> Result<Vec<Prediction>, TunerError> {
        let classes = self.config.classes.len();
        Ok(self
            .logits(features)?
            .chunks(classes)
            .map(|row| {
                let (class, max) = argmax(row);
                let denominator: f32 = row.iter().map(|z| (z - max).exp()).sum();
                Prediction {
                    class,
                    prob: 1.0 / denominator,
                }
            })
            .collect())
    }

    /// Top-1 accuracy on labelled features, in `[0, 1]`.
    pub fn evaluate(&self, features: &[f32], labels: &[u32]) -> Result<f32, TunerError> {
        let rows = self.check_labelled(features, labels)?;
        if rows == 0 {
            return Err(TunerError::EmptyData);
        }
        let classes = self.config.classes.len();
        let correct = self
            .logits(features)?
            .chunks(classes)
            .zip(labels)
            .filter(|(row, label)| argmax(row).0 == **label as usize)
            .count();
        Ok(correct as f32 / rows as f32)
    }

    /// Appends `new_classes` to the head: the output rows of the existing classes are kept, so
    /// their logits do not change, and each new class gets a fresh Glorot row and zero bias.
    pub fn grow_classes(&mut self, new_classes: Vec<String>) -> Result<(), TunerError> {
        if new_classes.is_empty() {
            return Ok(());
        }
        let old = self.config.classes.len();
        let mut grown = self.config.clone();
        grown.classes.extend(new_classes);
        grown.validate()?;

        let added = grown.classes.len() - old;
        let fan_in = grown.hidden.unwrap_or(grown.input_dim);
        let mut rng = stream(grown.seed, STREAM_GROW, old as u64);
        let rows = glorot_values(added, fan_in, grown.classes.len() + fan_in, &mut rng);
        let rows = Tensor::from_vec(rows, (added, fan_in), &Device::Cpu)?;
        let weight = Tensor::cat(&[self.output.weight.as_tensor(), &rows], 0)?;
        let bias = Tensor::cat(
            &[
                self.output.bias.as_tensor(),
                &Tensor::zeros(added, DType::F32, &Device::Cpu)?,
            ],
            0,
        )?;
        self.output = Dense {
            weight: Var::from_tensor(&weight)?,
            bias: Var::from_tensor(&bias)?,
        };
        self.config = grown;
        // The class means no longer cover every class; training calibrates them again.
        self.acceptance = Acceptance::default();
        Ok(())
    }

    /// The head as PipeStores run it (row-major `[classes x input_dim]` weights and `[classes]`
    /// bias). Fails for a head with a hidden layer, which PipeStores cannot run.
    pub(crate) fn weights(&self) -> Result<HeadWeights, TunerError> {
        if self.hidden.is_some() {
            return Err(TunerError::InvalidArgument(
                "a head with a hidden layer cannot be deployed as a linear head".into(),
            ));
        }
        let weights = self
            .output
            .weight
            .as_tensor()
            .flatten_all()?
            .to_vec1::<f32>()?;
        let bias = self.output.bias.as_tensor().to_vec1::<f32>()?;
        HeadWeights::new(self.classes().to_vec(), self.input_dim(), weights, bias)
            .and_then(|h| h.with_acceptance(self.acceptance.clone()))
            .map_err(|e| TunerError::Internal(format!("the head's own layers: {e}")))
    }

    fn vars(&self) -> Vec<Var> {
        let mut vars = Vec::with_capacity(4);
        if let Some(hidden) = &self.hidden {
            vars.extend([hidden.weight.clone(), hidden.bias.clone()]);
        }
        vars.extend([self.output.weight.clone(), self.output.bias.clone()]);
        vars
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.hidden {
            Some(hidden) => self.output.forward(&hidden.forward(x)?.relu()?),
            None => self.output.forward(x),
        }
    }

    /// Mean cross-entropy plus the L2 penalties described in the module docs.
    fn objective(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let logits = self.forward(x)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let cross_entropy = candle_nn::loss::nll(&log_probs, y)?;
        let l2 = self.config.l2;
        let activity = (logits.sqr()?.sum_all()? + log_probs.exp()?.sqr()?.sum_all()?)?
            .affine(l2 / x.dim(0)? as f64, 0.0)?;
        let mut weights = self.output.squared_norm()?;
        if let Some(hidden) = &self.hidden {
            weights = (weights + hidden.squared_norm()?)?;
        }
        cross_entropy + activity + weights.affine(l2, 0.0)?
    }

    /// Number of rows in `features`, which must be whole rows of `input_dim`.
    fn rows(&self, features: &[f32]) -> Result<usize, TunerError> {
        let input_dim = self.config.input_dim;
        if !features.len().is_multiple_of(input_dim) {
            return Err(TunerError::FeatureShape {
                len: features.len(),
                input_dim,
            });
        }
        Ok(features.len() / input_dim)
    }

    /// Number of rows, after checking that there is one valid label per row.
    fn check_labelled(&self, features: &[f32], labels: &[u32]) -> Result<usize, TunerError> {
        let rows = self.rows(features)?;
        if labels.len() != rows {
            return Err(TunerError::LabelCount {
                rows,
                labels: labels.len(),
            });
        }
        let classes = self.config.classes.len();
        if let Some((row, &label)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &l)| l as usize >= classes)
        {
            return Err(TunerError::LabelOutOfRange {
                row,
                label,
                classes,
            });
        }
        Ok(rows)
    }
}

/// Index and value of the largest element (the first on ties); `row` is never empty.
fn argmax(row: &[f32]) -> (usize, f32) {
    row.iter()
        .copied()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, z)| {
            if z > best.1 { (i, z) } else { best }
        })
}

/// `rows × cols` values uniform in ±sqrt(6 / fans).
fn glorot_values(rows: usize, cols: usize, fans: usize, rng: &mut Pcg64Mcg) -> Vec<f32> {
    let limit = (6.0 / fans as f64).sqrt() as f32;
    (0..rows * cols)
        .map(|_| rng.random_range(-limit..limit))
        .collect()
}

/// An independent random stream for (`seed`, purpose `tag`, `index`).
fn stream(seed: u64, tag: u64, index: u64) -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(seed ^ tag.rotate_right(8) ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}
