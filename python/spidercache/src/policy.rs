//! `Policy`: one of the crate's cache policies, driven from Python.

use std::sync::{Arc, RwLock};

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use spidercache::{
    Answer, BatchReport, CachePolicy, Capacity, Label, LabelSource, Sample, SampleId, TrainingSpec,
    build_policy,
};

use crate::arrays;
use crate::config::policy_kind;
use crate::errors::to_py;
use crate::source::PythonSource;
use crate::stats::epoch_dict;

/// What `Policy.lookup` answers: `(kind, data, served, label, label_source)`.
type Lookup<'py> = (
    &'static str,
    Option<Bound<'py, PyBytes>>,
    SampleId,
    Label,
    &'static str,
);

/// A cache policy and the label table of its dataset.
///
/// `Policy(name, labels, batch_size, capacity_items, capacity_bytes, loader,
/// seed=0, settings=None)`: `labels` is the `<u4` bytes of every sample's
/// label (the dataset has `len(labels) / 4` samples, ids from 0), `loader(id)
/// -> bytes` reads one sample from storage for the policy's own reads, and
/// `settings` overrides the named policy's defaults.
#[pyclass(module = "spidercache._native", frozen)]
pub(crate) struct Policy {
    inner: RwLock<Option<Arc<dyn CachePolicy>>>,
    labels: Arc<Vec<Label>>,
}

impl Policy {
    fn policy(&self) -> PyResult<Arc<dyn CachePolicy>> {
        self.inner
            .read()
            .expect("the policy lock is never poisoned: nothing panics under it")
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the cache is closed"))
    }

    fn label(&self, id: SampleId) -> PyResult<Label> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.labels.get(i).copied())
            .ok_or_else(|| {
                to_py(spidercache::CacheError::UnknownSample {
                    id,
                    num_samples: self.labels.len(),
                })
            })
    }
}

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (name, labels, batch_size, capacity_items, capacity_bytes, loader, seed=0, settings=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        labels: &[u8],
        batch_size: usize,
        capacity_items: usize,
        capacity_bytes: u64,
        loader: Py<PyAny>,
        seed: u64,
        settings: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        if !loader.bind(py).is_callable() {
            return Err(PyValueError::new_err(
                "loader must be callable: loader(id) -> bytes",
            ));
        }
        let labels = Arc::new(arrays::u32s("labels", labels)?);
        let kind = policy_kind(name, settings)?;
        let spec = TrainingSpec {
            num_samples: labels.len(),
            batch_size,
            seed,
        };
        let capacity = Capacity::new(capacity_items, capacity_bytes);
        let source = Arc::new(PythonSource::new(loader, labels.clone()));
        let policy = py
            .detach(|| build_policy(kind, spec, capacity, source))
            .map_err(to_py)?;
        Ok(Self {
            inner: RwLock::new(Some(Arc::from(policy))),
            labels,
        })
    }

    /// The policy's short name, as the crate's tables print it.
    #[getter]
    fn name(&self) -> PyResult<&'static str> {
        Ok(self.policy()?.name())
    }

    /// Samples in the dataset (ids are `0..num_samples`).
    #[getter]
    fn num_samples(&self) -> usize {
        self.labels.len()
    }

    /// Samples per minibatch the policy orders.
    #[getter]
    fn batch_size(&self) -> PyResult<usize> {
        Ok(self.policy()?.spec().batch_size)
    }

    /// The budget, `(items, bytes)`.
    fn capacity(&self) -> PyResult<(usize, u64)> {
        let c = self.policy()?.capacity();
        Ok((c.items, c.bytes))
    }

    /// What the policy holds now, `(items, bytes)`; never above `capacity()`.
    fn usage(&self) -> PyResult<(usize, u64)> {
        let c = self.policy()?.usage();
        Ok((c.items, c.bytes))
    }

    /// Draws epoch `epoch`'s order (epochs count from 0).
    fn begin_epoch(&self, py: Python<'_>, epoch: u32) -> PyResult<()> {
        let p = self.policy()?;
        py.detach(|| p.begin_epoch(epoch)).map_err(to_py)
    }

    /// The ids of the next minibatch, or `None` at the end of the epoch.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Vec<SampleId>>> {
        let p = self.policy()?;
        Ok(py.detach(|| p.next_batch()))
    }

    /// Answers a request for `id`: `("hit", bytes, id, label, "own")`,
    /// `("substitute", bytes, served_id, label, "requested" | "served")`, or
    /// `("miss", None, id, label, "own")`, after which the caller reads the
    /// sample and offers it with `admit`.
    fn lookup<'py>(&self, py: Python<'py>, id: SampleId) -> PyResult<Lookup<'py>> {
        let own = self.label(id)?;
        let p = self.policy()?;
        let answer = py.detach(|| p.lookup(id, own)).map_err(to_py)?;
        Ok(match answer {
            Answer::Hit(data) => ("hit", Some(PyBytes::new(py, &data)), id, own, "own"),
            Answer::Substitute {
                served,
                label,
                label_source,
                data,
            } => {
                let source = match label_source {
                    LabelSource::Requested => "requested",
                    LabelSource::Served => "served",
                };
                (
                    "substitute",
                    Some(PyBytes::new(py, &data)),
                    served,
                    label,
                    source,
                )
            }
            Answer::Miss => ("miss", None, id, own, "own"),
        })
    }

    /// Offers sample `id`'s bytes, read after a miss; returns whether it was cached.
    fn admit(&self, py: Python<'_>, id: SampleId, data: &[u8]) -> PyResult<bool> {
        let sample = Sample {
            label: self.label(id)?,
            data: Bytes::copy_from_slice(data),
        };
        let p = self.policy()?;
        py.detach(|| p.admit(id, sample)).map_err(to_py)
    }

    /// Reports one optimizer step: the requested ids (`<u8`), the labels
    /// trained (`<u4`), a row-major `n x dim` embedding matrix (`<f4`, empty
    /// with `dim == 0` for policies that do not use it) and the per-sample
    /// losses (`<f4`).
    fn report(
        &self,
        py: Python<'_>,
        ids: &[u8],
        labels: &[u8],
        embeddings: &[u8],
        dim: usize,
        losses: &[u8],
    ) -> PyResult<()> {
        let ids = arrays::u64s("ids", ids)?;
        let labels = arrays::u32s("labels", labels)?;
        let embeddings = arrays::f32s("embeddings", embeddings)?;
        let losses = arrays::f32s("losses", losses)?;
        let p = self.policy()?;
        py.detach(|| {
            p.report_batch(&BatchReport {
                ids: &ids,
                labels: &labels,
                embeddings: &embeddings,
                dim,
                losses: &losses,
            })
        })
        .map_err(to_py)
    }

    /// Closes the epoch; `val_accuracy` (0..=1) drives the accuracy-gated
    /// samplers. Returns the epoch's counters as a dict.
    #[pyo3(signature = (val_accuracy=None))]
    fn end_epoch<'py>(
        &self,
        py: Python<'py>,
        val_accuracy: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self.policy()?;
        let stats = py.detach(|| p.end_epoch(val_accuracy)).map_err(to_py)?;
        epoch_dict(py, &stats)
    }

    /// Stops the policy's threads and frees its cache; later calls fail.
    fn close(&self, py: Python<'_>) {
        let taken = self
            .inner
            .write()
            .expect("the policy lock is never poisoned: nothing panics under it")
            .take();
        // A scoring worker may be waiting for the GIL inside the loader: let it finish.
        py.detach(move || drop(taken));
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        let taken = self.inner.get_mut().ok().and_then(Option::take);
        if taken.is_some() {
            Python::attach(|py| py.detach(move || drop(taken)));
        }
    }
}
