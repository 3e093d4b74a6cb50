//! Arrays as they cross the boundary: contiguous little-endian bytes, which
//! the Python side makes with `numpy.ascontiguousarray(x, "<f4").tobytes()`.

use pyo3::PyResult;
use pyo3::exceptions::PyValueError;

/// Decodes `bytes` as consecutive little-endian `N`-byte values.
fn decode<const N: usize, T>(
    what: &str,
    bytes: &[u8],
    from: impl Fn([u8; N]) -> T,
) -> PyResult<Vec<T>> {
    if !bytes.len().is_multiple_of(N) {
        return Err(PyValueError::new_err(format!(
            "{what}: {} bytes is not a whole number of {N}-byte values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("chunks_exact yields N bytes")))
        .collect())
}

/// `<u8` values (sample ids).
pub(crate) fn u64s(what: &str, bytes: &[u8]) -> PyResult<Vec<u64>> {
    decode(what, bytes, u64::from_le_bytes)
}

/// `<u4` values (labels).
pub(crate) fn u32s(what: &str, bytes: &[u8]) -> PyResult<Vec<u32>> {
    decode(what, bytes, u32::from_le_bytes)
}

/// `<f4` values (embeddings, losses).
pub(crate) fn f32s(what: &str, bytes: &[u8]) -> PyResult<Vec<f32>> {
    decode(what, bytes, f32::from_le_bytes)
}
