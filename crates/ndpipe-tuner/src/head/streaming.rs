//! A head trained batch by batch, as a cache feeds it.

use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer};

use super::Head;
use crate::TunerError;
use crate::schedule::learning_rate;

/// A training run fed batch by batch; see [`Head::streaming`].
pub(crate) struct StreamingRun<'a> {
    pub(super) head: &'a mut Head,
    pub(super) optimizer: AdamW,
    pub(super) run: usize,
    pub(super) runs: usize,
    pub(super) epochs: usize,
    /// The objective summed over this epoch's rows so far, and those rows.
    pub(super) epoch_loss: (f64, usize),
}

impl StreamingRun<'_> {
    /// Sets the learning rate of `epoch` (NDPipe's step schedule, scaled for the run).
    pub(crate) fn begin_epoch(&mut self, epoch: usize) {
        self.epoch_loss = (0.0, 0);
        self.optimizer
            .set_learning_rate(learning_rate(epoch, self.epochs, self.run, self.runs));
    }

    /// One optimizer step on a batch; returns each row's cross-entropy before the step (what
    /// importance-aware caches rank samples by).
    pub(crate) fn step(
        &mut self,
        features: &[f32],
        labels: &[u32],
    ) -> Result<Vec<f32>, TunerError> {
        let rows = self.head.check_labelled(features, labels)?;
        if rows == 0 {
            return Err(TunerError::EmptyData);
        }
        let x = Tensor::from_slice(features, (rows, self.head.config.input_dim), &Device::Cpu)?;
        let y = Tensor::from_slice(labels, rows, &Device::Cpu)?;
        let log_p = candle_nn::ops::log_softmax(&self.head.forward(&x)?, 1)?;
        let per_row = log_p
            .gather(&y.unsqueeze(1)?, 1)?
            .squeeze(1)?
            .neg()?
            .to_vec1::<f32>()?;
        let loss = self.head.objective(&x, &y)?;
        self.optimizer.backward_step(&loss)?;
        self.epoch_loss.0 += f64::from(loss.to_scalar::<f32>()?) * rows as f64;
        self.epoch_loss.1 += rows;
        Ok(per_row)
    }

    /// The mean training objective (cross-entropy plus penalties) of this epoch's steps, each
    /// taken before its update, as [`Head::train_run`] reports it (0 before any step).
    pub(crate) fn epoch_loss(&self) -> f32 {
        let (total, rows) = self.epoch_loss;
        if rows == 0 {
            0.0
        } else {
            (total / rows as f64) as f32
        }
    }

    /// The head being trained.
    pub(crate) fn head(&self) -> &Head {
        self.head
    }
}
