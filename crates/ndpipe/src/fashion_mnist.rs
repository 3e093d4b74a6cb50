//! Reader of the Fashion-MNIST IDX files shipped by Debian's `dataset-fashion-mnist`.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

/// Where the Debian package installs the files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Class names, in label order.
pub const CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// One split of the data set: 28x28 grey images and their labels.
pub struct Split {
    /// "train" or "test".
    pub name: &'static str,
    /// Pixel rows, 784 bytes per image.
    pub images: Vec<u8>,
    /// One label (0..10) per image.
    pub labels: Vec<u8>,
}

impl Split {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split holds no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The pixels of image `i`.
    pub fn image(&self, i: usize) -> &[u8] {
        &self.images[i * 784..(i + 1) * 784]
    }
}

/// Loads the official train (60k) or test (10k) split from `dir`.
pub fn load(dir: &Path, name: &'static str) -> Result<Split> {
    let prefix = if name == "train" { "train" } else { "t10k" };
    let images = read_idx(&dir.join(format!("{prefix}-images-idx3-ubyte.gz")), 3)?;
    let labels = read_idx(&dir.join(format!("{prefix}-labels-idx1-ubyte.gz")), 1)?;
    ensure!(images.0[1..] == [28, 28], "{name} images are not 28x28");
    ensure!(
        images.0[0] == labels.0[0],
        "{name}: {} images but {} labels",
        images.0[0],
        labels.0[0]
    );
    ensure!(
        labels.1.iter().all(|&l| l < 10),
        "{name}: a label is out of range"
    );
    Ok(Split {
        name,
        images: images.1,
        labels: labels.1,
    })
}

/// Reads a gzip-compressed IDX file of unsigned bytes: (dimensions, data). The bytes are
/// parsed by `ndpipe_util::idx`, the decoder the `idx` fuzz target runs.
fn read_idx(path: &Path, dims: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "opening {} (install the Debian package dataset-fashion-mnist, or pass --fashion-mnist-dir)",
            path.display()
        )
    })?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut raw)
        .with_context(|| format!("decompressing {}", path.display()))?;
    let idx = ndpipe_util::idx::parse(&raw, dims).with_context(|| path.display().to_string())?;
    let shape = idx.shape;
    let header_len = raw.len() - idx.data.len();
    raw.drain(..header_len);
    Ok((shape, raw))
}

/// Encodes one 28x28 grey image as PNG.
pub fn png(pixels: &[u8]) -> Result<Vec<u8>> {
    let img = image::GrayImage::from_raw(28, 28, pixels.to_vec()).context("image is not 28x28")?;
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .context("encoding PNG")?;
    Ok(out)
}

/// The directory to read from: the flag, or the Debian default.
pub fn dir(flag: Option<&PathBuf>) -> PathBuf {
    flag.cloned().unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}
