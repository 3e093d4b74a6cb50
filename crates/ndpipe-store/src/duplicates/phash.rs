//! Perceptual hashes of photos, 64 bits each, from the preprocessed tensor the store keeps
//! (224x224 RGB: the photo resized to 256 on its short side and centre-cropped), with the
//! `image_hasher` crate.

use image::RgbImage;
use image_hasher::{HashAlg, Hasher, HasherConfig};
use ndpipe_model::ImageTensor;
use serde::{Deserialize, Serialize};

/// The perceptual hash of near-duplicate finding (`near_hash`), each 8x8 = 64 bits.
///
/// The default, `phash`, was chosen on `ndpipe-bench duplicates` (`docs/benchmarks.md`): on
/// real photos, wallpaper tiles and Fashion-MNIST images with their JPEG q50, 50% and 5%-crop
/// copies it is the only one of the four whose pairs stay mostly right at a threshold that
/// finds most copies (precision 0.91 and recall 0.78 at 12 bits, where `gradient`, `mean` and
/// `blockhash` are below 0.31 precision): their bits follow the low-detail layout that unrelated
/// smooth or centred images share, the DCT's low frequencies less so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NearHash {
    /// Each pixel of an 8x8 grey thumbnail against the mean (aHash).
    Mean,
    /// Each pixel of a 9x8 grey thumbnail against its right neighbour (dHash).
    Gradient,
    /// The 8x8 lowest frequencies of the DCT of a 16x16 grey thumbnail against their median
    /// (pHash).
    #[default]
    Phash,
    /// The blockhash.io algorithm over 8x8 blocks.
    Blockhash,
}

impl NearHash {
    /// Every algorithm, for the benchmark's sweep.
    pub const ALL: [NearHash; 4] = [
        NearHash::Mean,
        NearHash::Gradient,
        NearHash::Phash,
        NearHash::Blockhash,
    ];

    /// The name of the algorithm in settings and in the catalog.
    pub fn name(self) -> &'static str {
        match self {
            NearHash::Mean => "mean",
            NearHash::Gradient => "gradient",
            NearHash::Phash => "phash",
            NearHash::Blockhash => "blockhash",
        }
    }

    /// A hasher of this algorithm (cheap; one per batch of photos).
    pub fn hasher(self) -> PerceptualHasher {
        let config = HasherConfig::with_bytes_type::<[u8; 8]>().hash_size(8, 8);
        let config = match self {
            NearHash::Mean => config.hash_alg(HashAlg::Mean),
            NearHash::Gradient => config.hash_alg(HashAlg::Gradient),
            NearHash::Phash => config.hash_alg(HashAlg::Median).preproc_dct(),
            NearHash::Blockhash => config.hash_alg(HashAlg::Blockhash),
        };
        PerceptualHasher(config.to_hasher())
    }
}

impl std::str::FromStr for NearHash {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NearHash::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("expected mean, gradient, phash or blockhash, not {s:?}"))
    }
}

/// Hashes images with one [`NearHash`] algorithm.
pub struct PerceptualHasher(Hasher<[u8; 8]>);

impl PerceptualHasher {
    /// The 64-bit hash of an RGB image.
    pub fn hash_rgb(&self, image: &RgbImage) -> u64 {
        u64::from_be_bytes(self.0.hash_image(image).into_inner())
    }

    /// The 64-bit hash of a preprocessed tensor; `None` when it is not a 3-channel image.
    pub fn hash_tensor(&self, tensor: &ImageTensor) -> Option<u64> {
        if tensor.channels() != 3 {
            return None;
        }
        let image = RgbImage::from_raw(tensor.width(), tensor.height(), tensor.data().to_vec())?;
        Some(self.hash_rgb(&image))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A smooth gradient with a bright square at (`x`, `y`).
    fn picture(x: u32, y: u32) -> RgbImage {
        RgbImage::from_fn(224, 224, |i, j| {
            let inside = (x..x + 60).contains(&i) && (y..y + 60).contains(&j);
            let v = if inside { 250 } else { ((i + j) / 3) as u8 };
            image::Rgb([v, v / 2, 255 - v])
        })
    }

    #[test]
    fn a_resized_copy_hashes_close_and_another_picture_far() {
        for alg in NearHash::ALL {
            let h = alg.hasher();
            let original = picture(30, 40);
            let small = image::imageops::resize(&original, 112, 112, image::imageops::Triangle);
            let back = image::imageops::resize(&small, 224, 224, image::imageops::Triangle);
            let (a, b) = (h.hash_rgb(&original), h.hash_rgb(&back));
            let other = h.hash_rgb(&picture(150, 140));
            assert!((a ^ b).count_ones() <= 4, "{alg:?}: {a:016x} {b:016x}");
            assert!(
                (a ^ other).count_ones() > 8,
                "{alg:?}: {a:016x} {other:016x}"
            );
        }
    }

    #[test]
    fn a_tensor_hashes_as_its_image_and_names_round_trip() {
        let image = picture(10, 10);
        let tensor = ImageTensor::new(224, 224, 3, image.as_raw().clone()).unwrap();
        let h = NearHash::Gradient.hasher();
        assert_eq!(h.hash_tensor(&tensor), Some(h.hash_rgb(&image)));
        let grey = ImageTensor::new(2, 2, 1, vec![0; 4]).unwrap();
        assert_eq!(h.hash_tensor(&grey), None);
        for alg in NearHash::ALL {
            assert_eq!(alg.name().parse(), Ok(alg));
        }
        assert!("dct".parse::<NearHash>().is_err());
    }
}
