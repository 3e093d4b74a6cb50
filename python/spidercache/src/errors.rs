//! How the crate's errors reach Python.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyValueError};

create_exception!(
    spidercache,
    CacheError,
    PyException,
    "A cache policy failed: its sample source, its index or its scoring worker."
);

/// Bad input becomes `ValueError` or `IndexError`; a failure inside the
/// policy becomes [`CacheError`].
pub(crate) fn to_py(e: spidercache::CacheError) -> PyErr {
    use spidercache::CacheError as E;
    match e {
        E::UnknownSample { .. } => PyIndexError::new_err(e.to_string()),
        E::InvalidConfig(_) | E::MalformedBatch(_) => PyValueError::new_err(e.to_string()),
        other => CacheError::new_err(other.to_string()),
    }
}
