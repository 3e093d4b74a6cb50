//! The photos of `ndpipe-bench memory`: valid JPEG, PNG and WebP images of varied sizes, and
//! mutations of them as a fuzzer or an attacker makes them (flipped bytes, cuts, forged
//! dimensions, splices, repeated runs), all from one seed.

use anyhow::{Context, Result};
use image::{ImageFormat, RgbImage};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// `n` valid images, formats in turn, sides of 48 to 400 pixels, each of its own content.
pub(crate) fn valid(n: usize, seed: u64) -> Result<Vec<Vec<u8>>> {
    let mut rng = Pcg64::seed_from_u64(seed);
    let formats = [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::WebP];
    (0..n)
        .map(|i| {
            let (w, h) = (rng.random_range(48..=400), rng.random_range(48..=400));
            let (a, b) = (rng.random::<u8>(), rng.random::<u8>());
            let img = RgbImage::from_fn(w, h, |x, y| {
                let noise = (x.wrapping_mul(31) ^ y.wrapping_mul(17)) as u8;
                image::Rgb([a.wrapping_add(x as u8), b.wrapping_add(y as u8), noise])
            });
            let mut out = Vec::new();
            img.write_to(
                &mut std::io::Cursor::new(&mut out),
                formats[i % formats.len()],
            )
            .with_context(|| format!("encoding image {i}"))?;
            Ok(out)
        })
        .collect()
}

/// A mutation of `pool[i % len]`, the same for the same `i` and `seed`.
pub(crate) fn mutated(pool: &[Vec<u8>], i: usize, seed: u64) -> Vec<u8> {
    let mut rng = Pcg64::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut bytes = pool[i % pool.len()].clone();
    match rng.random_range(0..5) {
        0 => flip(&mut bytes, &mut rng),
        1 => bytes.truncate(rng.random_range(bytes.len() / 8..bytes.len())),
        2 => forge_dimensions(&mut bytes, &mut rng),
        3 => splice(&mut bytes, &pool[rng.random_range(0..pool.len())], &mut rng),
        _ => repeat_run(&mut bytes, &mut rng),
    }
    bytes
}

/// Xors 1 to 32 bytes past the first 8 (the signature) with random values.
fn flip(bytes: &mut [u8], rng: &mut Pcg64) {
    for _ in 0..rng.random_range(1..=32) {
        let at = rng.random_range(8.min(bytes.len() - 1)..bytes.len());
        bytes[at] ^= rng.random_range(1..=255u8);
    }
}

/// Writes random dimensions (each up to 8192, so that many pass the pixel cap) into a PNG's
/// IHDR or a JPEG's first SOF; other formats get flipped bytes instead.
fn forge_dimensions(bytes: &mut [u8], rng: &mut Pcg64) {
    let (w, h) = (rng.random_range(1..=8192u32), rng.random_range(1..=8192u32));
    if bytes.starts_with(b"\x89PNG") && bytes.len() > 24 {
        bytes[16..20].copy_from_slice(&w.to_be_bytes());
        bytes[20..24].copy_from_slice(&h.to_be_bytes());
    } else if let Some(sof) = bytes
        .windows(2)
        .position(|m| m[0] == 0xFF && matches!(m[1], 0xC0..=0xC2))
        && bytes.len() > sof + 9
    {
        bytes[sof + 5..sof + 7].copy_from_slice(&(h as u16).to_be_bytes());
        bytes[sof + 7..sof + 9].copy_from_slice(&(w as u16).to_be_bytes());
    } else {
        flip(bytes, rng);
    }
}

/// Overwrites a random run of `bytes` with a random run of `other`.
fn splice(bytes: &mut [u8], other: &[u8], rng: &mut Pcg64) {
    let len = rng.random_range(1..=other.len().min(bytes.len()).min(4096));
    let from = rng.random_range(0..=other.len() - len);
    let to = rng.random_range(0..=bytes.len() - len);
    bytes[to..to + len].copy_from_slice(&other[from..from + len]);
}

/// Repeats a random run of `bytes` in place, 2 to 64 times.
fn repeat_run(bytes: &mut Vec<u8>, rng: &mut Pcg64) {
    let start = rng.random_range(0..bytes.len());
    let len = rng.random_range(1..=(bytes.len() - start).min(1024));
    let run = bytes[start..start + len].to_vec();
    let copies = rng.random_range(2..=64);
    let tail = bytes.split_off(start + len);
    for _ in 1..copies {
        bytes.extend_from_slice(&run);
    }
    bytes.extend_from_slice(&tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_images_decode_and_mutations_are_repeatable_and_differ() {
        let pool = valid(6, 1).unwrap();
        for bytes in &pool {
            image::load_from_memory(bytes).unwrap();
        }
        for i in 0..50 {
            let m = mutated(&pool, i, 7);
            assert_eq!(m, mutated(&pool, i, 7));
            assert_ne!(m, pool[i % pool.len()], "mutation {i} changed nothing");
        }
    }
}
