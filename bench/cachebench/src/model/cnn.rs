//! A small convolutional net on the 28x28 pixels: two 3x3 convolutions (8
//! and 16 channels, ReLU, 2x2 max-pooling each), a 64-wide ReLU layer whose
//! activations are the embeddings, and a 10-way output. About 52 k weights;
//! a step on a batch of 128 costs about ten MLP steps (candle's CPU
//! convolution backward is the cost; 5x5 kernels cost half as much again).

use candle_core::{Device, Tensor, Var};

use super::{Layers, ModelConfig, Weights, init_layer, weights_rng};
use crate::data::SIDE;
use crate::error::Result;

/// Channels of the two convolutions.
const CHANNELS: [usize; 2] = [8, 16];
/// Side of the square kernels (padded to keep the image size).
const KERNEL: usize = 3;
/// Width of the embedding the CNN reports to the caches (the penultimate layer).
pub const CNN_EMBEDDING_DIM: usize = 64;
/// Inputs of the first dense layer: 16 channels of 7x7 after two poolings.
const FLAT: usize = CHANNELS[1] * (SIDE / 4) * (SIDE / 4);

/// The CNN with its optimiser state. Its layers are, in order, the two
/// convolutions and the two dense layers. It trains through [`Net`](super::Net).
pub struct Cnn {
    weights: Weights,
}

impl Cnn {
    /// A fresh network: PyTorch's default initialisation (uniform in
    /// `±1/sqrt(fan_in)`), drawn from `config.seed`.
    pub fn new(config: &ModelConfig) -> Result<Self> {
        let device = Device::Cpu;
        let mut rng = weights_rng(config);
        let k2 = KERNEL * KERNEL;
        let layers = vec![
            init_layer(&mut rng, &[CHANNELS[0], 1, KERNEL, KERNEL], k2, &device)?,
            init_layer(
                &mut rng,
                &[CHANNELS[1], CHANNELS[0], KERNEL, KERNEL],
                CHANNELS[0] * k2,
                &device,
            )?,
            init_layer(&mut rng, &[CNN_EMBEDDING_DIM, FLAT], FLAT, &device)?,
            init_layer(
                &mut rng,
                &[10, CNN_EMBEDDING_DIM],
                CNN_EMBEDDING_DIM,
                &device,
            )?,
        ];
        Ok(Self {
            weights: Weights::new(layers, config)?,
        })
    }
}

impl Layers for Cnn {
    /// (penultimate activations, logits) of a `batch x 1 x 28 x 28` input.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        for (w, b) in &self.weights.layers[..2] {
            let bias = b.as_tensor().reshape((1, (), 1, 1))?;
            h = h
                .conv2d(w.as_tensor(), KERNEL / 2, 1, 1, 1)?
                .broadcast_add(&bias)?
                .relu()?
                .max_pool2d(2)?;
        }
        let h = h.flatten_from(1)?;
        let dense = |h: &Tensor, (w, b): &(Var, Var)| -> Result<Tensor> {
            Ok(h.matmul(&w.as_tensor().t()?)?
                .broadcast_add(b.as_tensor())?)
        };
        let embedding = dense(&h, &self.weights.layers[2])?.relu()?;
        let logits = dense(&embedding, &self.weights.layers[3])?;
        Ok((embedding, logits))
    }

    fn input_shape(&self, n: usize) -> Vec<usize> {
        vec![n, 1, SIDE, SIDE]
    }

    fn weights(&mut self) -> &mut Weights {
        &mut self.weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::PIXELS;
    use crate::model::{ModelKind, Net};
    use spidercache::Label;

    /// Two classes a convolution tells apart and a pixel mean does not:
    /// vertical or horizontal stripes of equal brightness.
    fn stripes(n: usize) -> (Vec<f32>, Vec<Label>) {
        let mut pixels = Vec::with_capacity(n * PIXELS);
        for i in 0..n {
            for r in 0..SIDE {
                for c in 0..SIDE {
                    let on = if i % 2 == 0 { c % 4 < 2 } else { r % 4 < 2 };
                    pixels.push(if on { 1.0 } else { -1.0 });
                }
            }
        }
        (pixels, (0..n as u32).map(|i| i % 2).collect())
    }

    #[test]
    fn same_seed_same_steps_and_learning_happens() {
        let config = ModelConfig {
            lr: 3e-3,
            weight_decay: 0.0,
            seed: 5,
        };
        let (pixels, labels) = stripes(16);
        let mut a = Net::new(ModelKind::Cnn, &config).unwrap();
        let mut b = Net::new(ModelKind::Cnn, &config).unwrap();
        let first = a.train_step(&pixels, &labels).unwrap();
        assert_eq!(first.losses, b.train_step(&pixels, &labels).unwrap().losses);
        assert_eq!(first.embeddings.len(), 16 * CNN_EMBEDDING_DIM);
        let mut last = first.losses.iter().sum::<f32>();
        for _ in 0..30 {
            last = a.train_step(&pixels, &labels).unwrap().losses.iter().sum();
        }
        assert!(last < first.losses.iter().sum::<f32>() / 4.0, "loss {last}");
        assert_eq!(a.accuracy(&pixels, &labels).unwrap(), 1.0);
    }
}
