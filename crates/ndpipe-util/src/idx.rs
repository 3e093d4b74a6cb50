//! The IDX container of unsigned bytes (the MNIST and Fashion-MNIST files): a 4-byte magic
//! (`0 0 0x08 DIMS`), `DIMS` big-endian u32 sizes, then the bytes in row-major order.
//!
//! [`parse`] takes untrusted bytes (already decompressed) and never panics: sizes whose product
//! overflows or disagrees with the data length are an [`IdxError`].

/// Bytes that are not an IDX file of the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdxError {
    /// Fewer bytes than the magic and the sizes take.
    #[error("too short for an IDX header of {dims} dimensions ({len} bytes)")]
    TooShort {
        /// Dimensions expected.
        dims: usize,
        /// Bytes given.
        len: usize,
    },
    /// Not the magic of unsigned bytes in `dims` dimensions.
    #[error("not an IDX file of {dims}-d unsigned bytes")]
    BadMagic {
        /// Dimensions expected.
        dims: usize,
    },
    /// The sizes multiply past the address space.
    #[error("IDX sizes {shape:?} overflow")]
    Overflow {
        /// The sizes read.
        shape: Vec<usize>,
    },
    /// The sizes and the data length disagree.
    #[error("IDX header says {expected} bytes of data, found {found}")]
    Length {
        /// Bytes the sizes call for.
        expected: usize,
        /// Bytes present.
        found: usize,
    },
}

/// An IDX file parsed: its sizes and a view of its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx<'a> {
    /// The size of each dimension, outermost first.
    pub shape: Vec<usize>,
    /// The data, `shape.iter().product()` bytes.
    pub data: &'a [u8],
}

/// Parses an IDX file of unsigned bytes with `dims` dimensions.
pub fn parse(raw: &[u8], dims: usize) -> Result<Idx<'_>, IdxError> {
    let header_len =
        dims.checked_mul(4)
            .and_then(|n| n.checked_add(4))
            .ok_or(IdxError::TooShort {
                dims,
                len: raw.len(),
            })?;
    if raw.len() < header_len {
        return Err(IdxError::TooShort {
            dims,
            len: raw.len(),
        });
    }
    if raw[0..2] != [0, 0] || raw[2] != 0x08 || usize::from(raw[3]) != dims {
        return Err(IdxError::BadMagic { dims });
    }
    let shape: Vec<usize> = raw[4..header_len]
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    let expected = shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| IdxError::Overflow {
            shape: shape.clone(),
        })?;
    let data = &raw[header_len..];
    if data.len() != expected {
        return Err(IdxError::Length {
            expected,
            found: data.len(),
        });
    }
    Ok(Idx { shape, data })
}

/// Encodes `data` with `shape` as an IDX file of unsigned bytes (for tests and seeds).
pub fn encode(shape: &[u32], data: &[u8]) -> Vec<u8> {
    let dims = u8::try_from(shape.len()).expect("at most 255 dimensions");
    let mut out = vec![0, 0, 0x08, dims];
    for n in shape {
        out.extend_from_slice(&n.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_does_not_hold_together() {
        let file = encode(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let idx = parse(&file, 2).unwrap();
        assert_eq!(idx.shape, vec![2, 3]);
        assert_eq!(idx.data, &[1, 2, 3, 4, 5, 6]);
        assert!(matches!(parse(&file, 1), Err(IdxError::BadMagic { .. })));
        assert!(matches!(
            parse(&file[..7], 2),
            Err(IdxError::TooShort { .. })
        ));
        assert!(matches!(
            parse(&file[..15], 2),
            Err(IdxError::Length { .. })
        ));
        let huge = encode(&[u32::MAX, u32::MAX, u32::MAX], &[]);
        assert!(matches!(parse(&huge, 3), Err(IdxError::Overflow { .. })));
    }
}
