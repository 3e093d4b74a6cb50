//! A 784-256-128-10 ReLU MLP; the 128-wide penultimate activations are the
//! embeddings.

use candle_core::{Device, Tensor};
use spidercache::Label;

use super::{Layers, ModelConfig, StepOutput, Weights, init_layer, weights_rng};
use crate::data::PIXELS;
use crate::error::Result;

/// Layer widths, input first.
const WIDTHS: [usize; 4] = [PIXELS, 256, 128, 10];
/// Width of the embedding the MLP reports to the caches (the penultimate layer).
pub const EMBEDDING_DIM: usize = WIDTHS[2];

/// The MLP with its optimiser state.
pub struct Mlp {
    weights: Weights,
}

impl Mlp {
    /// A fresh network: PyTorch's default `Linear` initialisation
    /// (uniform in `±1/sqrt(fan_in)`), drawn from `config.seed`.
    pub fn new(config: &ModelConfig) -> Result<Self> {
        let device = Device::Cpu;
        let mut rng = weights_rng(config);
        let layers = WIDTHS
            .windows(2)
            .map(|w| init_layer(&mut rng, &[w[1], w[0]], w[0], &device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            weights: Weights::new(layers, config)?,
        })
    }

    /// One AdamW step on the mean cross-entropy of the batch.
    pub fn train_step(&mut self, pixels: &[f32], labels: &[Label]) -> Result<StepOutput> {
        super::train_step(self, pixels, labels)
    }

    /// Top-1 accuracy on row-major `pixels` with `labels`.
    pub fn accuracy(&self, pixels: &[f32], labels: &[Label]) -> Result<f64> {
        super::accuracy(self, pixels, labels, 1024)
    }
}

impl Layers for Mlp {
    /// (penultimate activations, logits) of a `batch x PIXELS` input.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        let mut embedding = None;
        for (i, (w, b)) in self.weights.layers.iter().enumerate() {
            h = h
                .matmul(&w.as_tensor().t()?)?
                .broadcast_add(b.as_tensor())?;
            if i + 1 < self.weights.layers.len() {
                h = h.relu()?;
                embedding = Some(h.clone());
            }
        }
        Ok((embedding.expect("the net has hidden layers"), h))
    }

    fn input_shape(&self, n: usize) -> Vec<usize> {
        vec![n, PIXELS]
    }

    fn weights(&mut self) -> &mut Weights {
        &mut self.weights
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
