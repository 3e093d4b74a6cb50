//! Feature vectors as little-endian IEEE half floats: half the bytes of f32, about three
//! significant digits, which is what a classifier head needs.

use half::f16;

/// Appends `values` to `out` as little-endian f16.
pub fn encode_into(values: &[f32], out: &mut Vec<u8>) {
    out.reserve(values.len() * 2);
    for v in values {
        out.extend_from_slice(&f16::from_f32(*v).to_le_bytes());
    }
}

/// `values` as little-endian f16.
pub fn encode(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 2);
    encode_into(values, &mut out);
    out
}

/// Decodes little-endian f16 values; a trailing odd byte is ignored (callers check lengths).
pub fn decode(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// Rounds `v` through f16, as a value that went over the wire would be.
pub fn round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_three_digits() {
        let v: Vec<f32> = (0..1280).map(|i| (i as f32).sqrt() * 0.37 - 3.0).collect();
        let back = decode(&encode(&v));
        assert_eq!(back.len(), v.len());
        for (a, b) in v.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-3, "{a} vs {b}");
        }
        assert_eq!(encode(&[1.0]), vec![0x00, 0x3c]);
    }
}
