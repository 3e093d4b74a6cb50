//! The policy's own reads (homophily representatives, iCache's stream,
//! Quiver's packages) through the user's Python loader.

use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use spidercache::{CacheError, Label, Sample, SampleId, SampleSource};

/// Calls `loader(id) -> bytes` with the GIL held; the label comes from the
/// dataset's label table.
pub(crate) struct PythonSource {
    loader: Py<PyAny>,
    labels: Arc<Vec<Label>>,
}

impl PythonSource {
    /// A source over `loader` for a dataset labelled by `labels`.
    pub(crate) fn new(loader: Py<PyAny>, labels: Arc<Vec<Label>>) -> Self {
        Self { loader, labels }
    }
}

impl SampleSource for PythonSource {
    fn fetch(&self, id: SampleId) -> Result<Sample, CacheError> {
        let label = usize::try_from(id)
            .ok()
            .and_then(|i| self.labels.get(i).copied())
            .ok_or(CacheError::UnknownSample {
                id,
                num_samples: self.labels.len(),
            })?;
        let data = Python::attach(|py| -> PyResult<Bytes> {
            let got = self.loader.call1(py, (id,))?;
            let bytes = got.bind(py).cast::<PyBytes>().map_err(PyErr::from)?;
            Ok(Bytes::copy_from_slice(bytes.as_bytes()))
        })
        .map_err(|e| CacheError::Source {
            id,
            reason: format!("the loader raised {e}"),
        })?;
        Ok(Sample { label, data })
    }
}
