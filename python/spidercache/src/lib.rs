//! `spidercache._native`: the PyO3 layer of the `spidercache` Python package.
//!
//! It exposes one class, [`Policy`](policy::Policy), over a boxed
//! [`spidercache::CachePolicy`] built by name ([`config`]), whose background
//! reads go through the user's Python loader ([`source`]). Arrays cross the
//! boundary as little-endian bytes ([`arrays`]); the Python half of the package
//! (`python/spidercache/`) turns numpy arrays and torch tensors into them and
//! adds the sampler and the dataset wrapper. Every call into a policy releases
//! the GIL, so that a policy's own threads can call the loader meanwhile.

use pyo3::prelude::*;

mod arrays;
mod config;
mod errors;
mod policy;
mod source;
mod stats;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<policy::Policy>()?;
    m.add("CacheError", m.py().get_type::<errors::CacheError>())?;
    m.add_function(wrap_pyfunction!(config::policy_names, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
