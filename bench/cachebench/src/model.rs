//! The network trained in every run: a 784-256-128-10 ReLU MLP on candle's
//! CPU backend, AdamW, per-sample cross-entropy losses, and the 128-wide
//! penultimate activations as the embeddings the caches see.

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::SeedableRng;
use rand::distr::{Distribution, Uniform};
use rand_pcg::Pcg64Mcg;
use spidercache::Label;

use crate::data::PIXELS;
use crate::error::Result;

/// Layer widths, input first.
const WIDTHS: [usize; 4] = [PIXELS, 256, 128, 10];
/// Width of the embedding reported to the caches (the penultimate layer).
pub const EMBEDDING_DIM: usize = WIDTHS[2];

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
    /// Row-major `batch x EMBEDDING_DIM` penultimate activations, before the update.
    pub embeddings: Vec<f32>,
}

/// The MLP with its optimiser state.
pub struct Mlp {
    layers: Vec<(Var, Var)>,
    opt: AdamW,
    device: Device,
}

impl Mlp {
    /// A fresh network: PyTorch's default `Linear` initialisation
    /// (uniform in `±1/sqrt(fan_in)`), drawn from `config.seed`.
    pub fn new(config: &ModelConfig) -> Result<Self> {
        let device = Device::Cpu;
        let mut rng = Pcg64Mcg::seed_from_u64(config.seed);
        let mut layers = Vec::new();
        for w in WIDTHS.windows(2) {
            let (fan_in, fan_out) = (w[0], w[1]);
            let bound = 1.0 / (fan_in as f32).sqrt();
            let dist = Uniform::new(-bound, bound).expect("bound is positive");
            let mut draw = |n: usize| -> Vec<f32> { dist.sample_iter(&mut rng).take(n).collect() };
            let weight = Var::from_slice(&draw(fan_in * fan_out), (fan_out, fan_in), &device)?;
            let bias = Var::from_slice(&draw(fan_out), fan_out, &device)?;
            layers.push((weight, bias));
        }
        let vars = layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect();
        let opt = AdamW::new(
            vars,
            ParamsAdamW {
                lr: config.lr,
                weight_decay: config.weight_decay,
                ..ParamsAdamW::default()
            },
        )?;
        Ok(Self {
            layers,
            opt,
            device,
        })
    }

    /// (penultimate activations, logits) of a `batch x PIXELS` input.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        let mut embedding = None;
        for (i, (w, b)) in self.layers.iter().enumerate() {
            h = h
                .matmul(&w.as_tensor().t()?)?
                .broadcast_add(b.as_tensor())?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
                embedding = Some(h.clone());
            }
        }
        Ok((embedding.expect("the net has hidden layers"), h))
    }

    fn input(&self, pixels: &[f32]) -> Result<Tensor> {
        Ok(Tensor::from_slice(
            pixels,
            (pixels.len() / PIXELS, PIXELS),
            &self.device,
        )?)
    }

    /// One AdamW step on the mean cross-entropy of the batch.
    pub fn train_step(&mut self, pixels: &[f32], labels: &[Label]) -> Result<StepOutput> {
        let x = self.input(pixels)?;
        let y = Tensor::from_slice(labels, labels.len(), &self.device)?;
        let (embedding, logits) = self.forward(&x)?;
        let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let losses = log_p.gather(&y.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
        self.opt.backward_step(&losses.mean_all()?)?;
        Ok(StepOutput {
            losses: losses.to_vec1()?,
            embeddings: embedding.flatten_all()?.to_vec1()?,
        })
    }

    /// Top-1 accuracy on row-major `pixels` with `labels`.
    pub fn accuracy(&self, pixels: &[f32], labels: &[Label]) -> Result<f64> {
        if labels.is_empty() {
            return Ok(0.0);
        }
        let mut correct = 0usize;
        for (px, ls) in pixels.chunks(1024 * PIXELS).zip(labels.chunks(1024)) {
            let (_, logits) = self.forward(&self.input(px)?)?;
            let predicted: Vec<u32> = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.to_vec1()?;
            correct += predicted.iter().zip(ls).filter(|(p, l)| p == l).count();
        }
        Ok(correct as f64 / labels.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_steps_and_learning_happens() {
        let config = ModelConfig {
            lr: 1e-3,
            weight_decay: 0.0,
            seed: 3,
        };
        // Two separable classes: bright or dark images.
        let pixels: Vec<f32> = (0..32)
            .flat_map(|i| std::iter::repeat_n(if i % 2 == 0 { 1.0 } else { -1.0 }, PIXELS))
            .collect();
        let labels: Vec<Label> = (0..32).map(|i| i % 2).collect();
        let mut a = Mlp::new(&config).unwrap();
        let mut b = Mlp::new(&config).unwrap();
        let first = a.train_step(&pixels, &labels).unwrap();
        assert_eq!(first.losses, b.train_step(&pixels, &labels).unwrap().losses);
        assert_eq!(first.embeddings.len(), 32 * EMBEDDING_DIM);
        for _ in 0..20 {
            a.train_step(&pixels, &labels).unwrap();
        }
        assert_eq!(a.accuracy(&pixels, &labels).unwrap(), 1.0);
    }
}
