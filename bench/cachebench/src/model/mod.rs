//! The networks trained in every run, on candle's CPU backend with AdamW and
//! per-sample cross-entropy losses: a 784-256-128-10 ReLU MLP ([`Mlp`]) and
//! a small convolutional net on the 28x28 pixels ([`Cnn`]), SpiderCache's
//! own setting (a CNN's penultimate embedding). Both report their
//! penultimate activations as the embeddings the caches see.

mod cnn;
mod mlp;

use std::fmt;
use std::str::FromStr;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::SeedableRng;
use rand::distr::{Distribution, Uniform};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};
use spidercache::Label;

pub use cnn::{CNN_EMBEDDING_DIM, Cnn};
pub use mlp::{EMBEDDING_DIM, Mlp};

use crate::data::PIXELS;
use crate::error::Result;

/// Optimiser settings, the same for every policy.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Seed of the weight initialisation.
    pub seed: u64,
}

/// What one training step produced, per sample of the batch.
pub struct StepOutput {
    /// Cross-entropy losses, before the update.
    pub losses: Vec<f32>,
    /// Row-major `batch x dim` penultimate activations, before the update.
    pub embeddings: Vec<f32>,
}

/// Which network a run trains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// [`Mlp`].
    #[default]
    Mlp,
    /// [`Cnn`].
    Cnn,
}

impl ModelKind {
    /// Its name in tables, file names and flags.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
        }
    }

    /// Width of the embeddings it reports.
    pub fn embedding_dim(self) -> usize {
        match self {
            ModelKind::Mlp => EMBEDDING_DIM,
            ModelKind::Cnn => CNN_EMBEDDING_DIM,
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ModelKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "mlp" => Ok(ModelKind::Mlp),
            "cnn" => Ok(ModelKind::Cnn),
            other => Err(format!("unknown model {other:?} (mlp or cnn)")),
        }
    }
}

/// A network of either kind, with its optimiser.
pub enum Net {
    /// The MLP.
    Mlp(Mlp),
    /// The CNN.
    Cnn(Cnn),
}

impl Net {
    /// A fresh network of `kind`.
    pub fn new(kind: ModelKind, config: &ModelConfig) -> Result<Self> {
        Ok(match kind {
            ModelKind::Mlp => Net::Mlp(Mlp::new(config)?),
            ModelKind::Cnn => Net::Cnn(Cnn::new(config)?),
        })
    }

    /// One AdamW step on the mean cross-entropy of the batch (row-major pixels).
    pub fn train_step(&mut self, pixels: &[f32], labels: &[Label]) -> Result<StepOutput> {
        match self {
            Net::Mlp(m) => m.train_step(pixels, labels),
            Net::Cnn(m) => train_step(m, pixels, labels),
        }
    }

    /// Top-1 accuracy on row-major `pixels` with `labels`.
    pub fn accuracy(&self, pixels: &[f32], labels: &[Label]) -> Result<f64> {
        match self {
            Net::Mlp(m) => m.accuracy(pixels, labels),
            Net::Cnn(m) => accuracy(m, pixels, labels, 256),
        }
    }
}

/// PyTorch's default initialisation, uniform in `±1/sqrt(fan_in)`, for a
/// weight of `shape` (`shape[0]` outputs) and its bias, drawn from `rng`.
fn init_layer(
    rng: &mut Pcg64Mcg,
    shape: &[usize],
    fan_in: usize,
    device: &Device,
) -> Result<(Var, Var)> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let dist = Uniform::new(-bound, bound).expect("bound is positive");
    let mut draw = |n: usize| -> Vec<f32> { dist.sample_iter(&mut *rng).take(n).collect() };
    let weight = Var::from_slice(&draw(shape.iter().product()), shape, device)?;
    let bias = Var::from_slice(&draw(shape[0]), shape[0], device)?;
    Ok((weight, bias))
}

/// The seeded generator every network draws its weights from.
fn weights_rng(config: &ModelConfig) -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(config.seed)
}

/// AdamW over `layers` with `config`'s settings.
fn optimiser(layers: &[(Var, Var)], config: &ModelConfig) -> Result<AdamW> {
    let vars = layers
        .iter()
        .flat_map(|(w, b)| [w.clone(), b.clone()])
        .collect();
    Ok(AdamW::new(
        vars,
        ParamsAdamW {
            lr: config.lr,
            weight_decay: config.weight_decay,
            ..ParamsAdamW::default()
        },
    )?)
}

/// A network's weights, (weight, bias) per layer, with their optimiser.
struct Weights {
    layers: Vec<(Var, Var)>,
    opt: AdamW,
}

impl Weights {
    /// `layers` under AdamW with `config`'s settings.
    fn new(layers: Vec<(Var, Var)>, config: &ModelConfig) -> Result<Self> {
        let opt = optimiser(&layers, config)?;
        Ok(Self { layers, opt })
    }
}

/// What [`Mlp`] and [`Cnn`] differ in: their layers and the shape of their input.
trait Layers {
    /// (penultimate activations, logits) of a batch.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)>;
    /// The input shape `forward` takes for `n` images.
    fn input_shape(&self, n: usize) -> Vec<usize>;
    /// A batch of row-major `pixels` (on the CPU, as every layer is).
    fn input(&self, pixels: &[f32]) -> Result<Tensor> {
        let shape = self.input_shape(pixels.len() / PIXELS);
        Ok(Tensor::from_slice(pixels, shape, &Device::Cpu)?)
    }
    /// The weights and their optimiser.
    fn weights(&mut self) -> &mut Weights;
}

/// One step of `net` on the mean of the per-sample cross-entropies against
/// `labels`; returns the losses and the embeddings, flattened.
fn train_step(net: &mut impl Layers, pixels: &[f32], labels: &[Label]) -> Result<StepOutput> {
    let (embedding, logits) = net.forward(&net.input(pixels)?)?;
    let y = Tensor::from_slice(labels, labels.len(), logits.device())?;
    let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let losses = log_p.gather(&y.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    net.weights().opt.backward_step(&losses.mean_all()?)?;
    Ok(StepOutput {
        losses: losses.to_vec1()?,
        embeddings: embedding.flatten_all()?.to_vec1()?,
    })
}

/// Top-1 accuracy of `net` on row-major `pixels` with `labels`, `chunk` images at a time.
fn accuracy(net: &impl Layers, pixels: &[f32], labels: &[Label], chunk: usize) -> Result<f64> {
    if labels.is_empty() {
        return Ok(0.0);
    }
    let mut hits = 0usize;
    for (px, ls) in pixels.chunks(chunk * PIXELS).zip(labels.chunks(chunk)) {
        let (_, logits) = net.forward(&net.input(px)?)?;
        let predicted: Vec<u32> = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.to_vec1()?;
        hits += predicted.iter().zip(ls).filter(|(p, l)| p == l).count();
    }
    Ok(hits as f64 / labels.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_print_and_report_their_width() {
        for kind in [ModelKind::Mlp, ModelKind::Cnn] {
            assert_eq!(kind.name().parse::<ModelKind>().unwrap(), kind);
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
        }
        assert!("resnet".parse::<ModelKind>().is_err());
        assert_eq!(ModelKind::Mlp.embedding_dim(), 128);
        assert_eq!(ModelKind::Cnn.embedding_dim(), 64);
    }
}
