//! Real-photo inputs for int8 calibration and agreement: seeded random crops, scales and flips of
//! the sample photos and the wallpaper JPEGs, each preprocessed exactly as an upload would be.
//!
//! A crop is encoded as PNG (lossless) and handed to the store's [`Preprocessor`], so its tensor
//! is the one the store would compute had the crop been uploaded as a photo.

use std::collections::HashSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use image::imageops::{self, FilterType};
use image::{ImageFormat, RgbImage};
use ndpipe_model::{ImageTensor, PreprocessConfig, Preprocessor};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// Decoded source photos that crops are cut from.
pub(crate) struct Sources {
    images: Vec<RgbImage>,
}

impl Sources {
    /// Decodes every PNG and JPEG in `folders` (sorted by path, so runs are reproducible).
    pub(crate) fn load(folders: &[&Path]) -> Result<Self> {
        let pre = Preprocessor::new(PreprocessConfig::default());
        let mut paths: Vec<PathBuf> = Vec::new();
        for folder in folders {
            let entries = std::fs::read_dir(folder)
                .with_context(|| format!("listing {} (run make setup)", folder.display()))?;
            paths.extend(
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        matches!(
                            p.extension().and_then(|e| e.to_str()),
                            Some("png" | "jpg" | "jpeg")
                        )
                    }),
            );
        }
        paths.sort();
        let images = paths
            .par_iter()
            .map(|p| {
                let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
                let (_, image) = pre
                    .decode(&bytes)
                    .with_context(|| format!("decoding {}", p.display()))?;
                Ok(image.into_rgb8())
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(!images.is_empty(), "no real photos in {folders:?}");
        Ok(Sources { images })
    }

    /// Number of source photos.
    pub(crate) fn len(&self) -> usize {
        self.images.len()
    }

    /// `n` crops drawn with `seed`: a random source, a square-ish region of 30-100% of its shorter
    /// side anywhere in it, rescaled to a shorter side of 224-448 pixels, mirrored half the time.
    pub(crate) fn crops(&self, n: usize, seed: u64) -> Result<Vec<ImageTensor>> {
        let pre = Preprocessor::new(PreprocessConfig::default());
        self.crop_pngs(n, seed)?
            .par_iter()
            .map(|png| Ok(pre.run(png).context("preprocessing a crop")?.tensor))
            .collect()
    }

    /// The crops of [`Sources::crops`] as PNG files, as a user would upload them.
    pub(crate) fn crop_pngs(&self, n: usize, seed: u64) -> Result<Vec<Vec<u8>>> {
        (0..n)
            .into_par_iter()
            .map(|i| {
                let mut rng = Pcg64Mcg::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
                let src = &self.images[rng.random_range(0..self.images.len())];
                let crop = random_crop(src, &mut rng);
                let mut png = Vec::new();
                crop.write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
                    .context("encoding a crop as PNG")?;
                Ok(png)
            })
            .collect()
    }
}

fn random_crop(src: &RgbImage, rng: &mut Pcg64Mcg) -> RgbImage {
    let (w, h) = src.dimensions();
    let shorter = w.min(h) as f64;
    let side = shorter * rng.random_range(0.3..=1.0);
    let aspect: f64 = rng.random_range(0.75..=1.333);
    let cw = ((side * aspect.sqrt()).round() as u32).clamp(1, w);
    let ch = ((side / aspect.sqrt()).round() as u32).clamp(1, h);
    let x = rng.random_range(0..=w - cw);
    let y = rng.random_range(0..=h - ch);
    let region = imageops::crop_imm(src, x, y, cw, ch).to_image();
    let target = rng.random_range(224..=448u32) as f64 / cw.min(ch) as f64;
    let (tw, th) = (
        ((cw as f64 * target).round() as u32).max(1),
        ((ch as f64 * target).round() as u32).max(1),
    );
    let scaled = imageops::resize(&region, tw, th, FilterType::Triangle);
    if rng.random_bool(0.5) {
        imageops::flip_horizontal(&scaled)
    } else {
        scaled
    }
}

/// Removes from `set` every tensor whose pixels also occur in `other`, and says how many went.
pub(crate) fn drop_shared(set: &mut Vec<ImageTensor>, other: &[&[ImageTensor]]) -> usize {
    let digest = |t: &ImageTensor| -> [u8; 32] { Sha256::digest(t.data()).into() };
    let seen: HashSet<[u8; 32]> = other.iter().flat_map(|s| s.iter().map(digest)).collect();
    let before = set.len();
    set.retain(|t| !seen.contains(&digest(t)));
    before - set.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 600x400 gradient: every crop of it is different pixels.
    fn sources() -> Sources {
        let image = RgbImage::from_fn(600, 400, |x, y| {
            image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
        });
        Sources {
            images: vec![image],
        }
    }

    #[test]
    fn crops_are_reproducible_per_seed_and_differ_between_seeds() {
        let s = sources();
        let a = s.crops(12, 1).unwrap();
        assert_eq!(a, s.crops(12, 1).unwrap());
        assert!(
            a.iter()
                .all(|t| (t.height(), t.width(), t.channels()) == (224, 224, 3))
        );
        let mut b = s.crops(12, 2).unwrap();
        assert_eq!(drop_shared(&mut b, &[&a]), 0);
        assert_eq!(b.len(), 12);
    }

    #[test]
    fn a_crop_is_the_store_tensor_of_its_png() {
        let s = sources();
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let _ = rng.random_range(0..1usize);
        let crop = random_crop(&s.images[0], &mut rng);
        let mut png = Vec::new();
        crop.write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
            .unwrap();
        let pre = Preprocessor::new(PreprocessConfig::default());
        assert_eq!(s.crops(1, 7).unwrap()[0], pre.run(&png).unwrap().tensor);
    }

    #[test]
    fn shared_tensors_are_dropped() {
        let s = sources();
        let a = s.crops(6, 3).unwrap();
        let mut mixed = s.crops(4, 4).unwrap();
        mixed.extend(a[..2].iter().cloned());
        assert_eq!(drop_shared(&mut mixed, &[&a]), 2);
        assert_eq!(mixed.len(), 4);
    }
}
