//! The generated set of `ndpipe-bench duplicates`: families of an original and its copies
//! (a byte-identical re-upload, JPEG quality 50, resized to 50%, cropped by 5% at a corner),
//! and unrelated photos, all real images.
//!
//! Originals: the wallpapers and sample photos whole, tiles of the wallpapers (640x480, cut on
//! a grid, so no two overlap) and Fashion-MNIST test images upscaled to 224x224. A seed picks
//! which tiles and Fashion-MNIST images are originals and which are unrelated, and the corner
//! each crop is cut at.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use image::codecs::jpeg::JpegEncoder;
use image::imageops::{self, FilterType};
use image::{DynamicImage, ImageEncoder, ImageFormat, RgbImage};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;

use ndpipe::fashion_mnist;

/// Side of a wallpaper tile.
const TILE: (u32, u32) = (640, 480);

/// How a photo of the set was made from its family's original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Edit {
    /// The original.
    Original,
    /// The same bytes again.
    Reupload,
    /// Decoded and encoded as JPEG at quality 50.
    JpegQ50,
    /// Resized to half its width and height (JPEG at quality 90).
    Resize50,
    /// 5% of its width and height cut at one corner (JPEG at quality 90).
    Crop5,
}

impl Edit {
    /// The copies made of every original.
    pub(crate) const COPIES: [Edit; 4] =
        [Edit::Reupload, Edit::JpegQ50, Edit::Resize50, Edit::Crop5];

    /// Its name in tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Edit::Original => "original",
            Edit::Reupload => "re-upload",
            Edit::JpegQ50 => "jpeg q50",
            Edit::Resize50 => "resize 50%",
            Edit::Crop5 => "crop 5%",
        }
    }
}

/// One photo of the set.
pub(crate) struct Photo {
    /// The uploaded bytes.
    pub(crate) bytes: Vec<u8>,
    /// Its family (`None`: an unrelated photo).
    pub(crate) family: Option<usize>,
    /// How it was made.
    pub(crate) edit: Edit,
}

/// Where the real images come from.
pub(crate) struct Inputs {
    /// The wallpaper JPEGs.
    pub(crate) wallpapers: PathBuf,
    /// The sample photos.
    pub(crate) samples: PathBuf,
    /// The Fashion-MNIST folder.
    pub(crate) fashion: PathBuf,
}

/// How many of each kind the set has.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// Wallpaper tiles that are originals (as many more are unrelated photos).
    pub(crate) tiles: usize,
    /// Fashion-MNIST images that are originals.
    pub(crate) fashion: usize,
    /// Fashion-MNIST images that are unrelated photos.
    pub(crate) fashion_unrelated: usize,
}

/// The decoded real images the sets are made from.
pub(crate) struct Sources {
    /// Whole photos (wallpapers and samples) as their files' bytes.
    whole: Vec<Vec<u8>>,
    /// Every wallpaper tile, as PNG.
    tiles: Vec<Vec<u8>>,
    /// Fashion-MNIST test images upscaled to 224x224, as PNG.
    fashion: Vec<Vec<u8>>,
}

impl Sources {
    /// Reads and cuts the real images (`fashion_count` Fashion-MNIST images at most).
    pub(crate) fn load(inputs: &Inputs, fashion_count: usize) -> Result<Self> {
        let mut whole = Vec::new();
        let mut tiles = Vec::new();
        for path in images_in(&inputs.wallpapers)? {
            let bytes = std::fs::read(&path)?;
            let image = image::load_from_memory(&bytes)
                .with_context(|| format!("decoding {}", path.display()))?
                .into_rgb8();
            tiles.extend(tiles_of(&image)?);
            whole.push(bytes);
        }
        for path in images_in(&inputs.samples)? {
            whole.push(std::fs::read(&path)?);
        }
        let split = fashion_mnist::load(&inputs.fashion, "test")?;
        let mut fashion = Vec::new();
        for i in 0..fashion_count.min(split.len()) {
            let small = image::load_from_memory(&fashion_mnist::png(split.image(i))?)?;
            let big = small.resize_exact(224, 224, FilterType::CatmullRom);
            fashion.push(png_of(&big.into_rgb8())?);
        }
        ensure!(
            !whole.is_empty() && !tiles.is_empty(),
            "no real photos found"
        );
        Ok(Sources {
            whole,
            tiles,
            fashion,
        })
    }

    /// The set of `seed`, `sizes` large.
    pub(crate) fn set(&self, seed: u64, sizes: Sizes) -> Result<Vec<Photo>> {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut tiles: Vec<&Vec<u8>> = self.tiles.iter().collect();
        tiles.shuffle(&mut rng);
        let mut fashion: Vec<&Vec<u8>> = self.fashion.iter().collect();
        fashion.shuffle(&mut rng);
        ensure!(
            tiles.len() >= 2 * sizes.tiles
                && fashion.len() >= sizes.fashion + sizes.fashion_unrelated,
            "not enough tiles or Fashion-MNIST images for {sizes:?}"
        );
        let originals = self
            .whole
            .iter()
            .chain(tiles[..sizes.tiles].iter().copied())
            .chain(fashion[..sizes.fashion].iter().copied());
        let mut photos = Vec::new();
        for (family, original) in originals.enumerate() {
            let corner = (family as u64 ^ seed) % 4;
            photos.extend(family_of(family, original, corner)?);
        }
        let unrelated = tiles[sizes.tiles..2 * sizes.tiles]
            .iter()
            .chain(&fashion[sizes.fashion..sizes.fashion + sizes.fashion_unrelated]);
        photos.extend(unrelated.map(|bytes| Photo {
            bytes: bytes.to_vec(),
            family: None,
            edit: Edit::Original,
        }));
        Ok(photos)
    }
}

/// The PNG and JPEG files of `dir`, sorted.
fn images_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {} (run make setup)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("png" | "jpg")))
        .collect();
    paths.sort();
    Ok(paths)
}

/// The tiles of `image` on a grid of [`TILE`], as PNG.
fn tiles_of(image: &RgbImage) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for y in (0..image.height() / TILE.1).map(|i| i * TILE.1) {
        for x in (0..image.width() / TILE.0).map(|i| i * TILE.0) {
            out.push(png_of(
                &imageops::crop_imm(image, x, y, TILE.0, TILE.1).to_image(),
            )?);
        }
    }
    Ok(out)
}

/// Family `family`: `original` and its copies, the crop at corner `corner` (0..4).
fn family_of(family: usize, original: &[u8], corner: u64) -> Result<Vec<Photo>> {
    let image = image::load_from_memory(original)?;
    let (w, h) = (image.width(), image.height());
    let (cw, ch) = (w - w / 20, h - h / 20);
    let (x, y) = match corner {
        0 => (0, 0),
        1 => (w - cw, 0),
        2 => (0, h - ch),
        _ => (w - cw, h - ch),
    };
    let photo = |edit: Edit, bytes: Vec<u8>| Photo {
        bytes,
        family: Some(family),
        edit,
    };
    Ok(vec![
        photo(Edit::Original, original.to_vec()),
        photo(Edit::Reupload, original.to_vec()),
        photo(Edit::JpegQ50, jpeg_of(&image, 50)?),
        photo(
            Edit::Resize50,
            jpeg_of(&image.resize_exact(w / 2, h / 2, FilterType::Triangle), 90)?,
        ),
        photo(Edit::Crop5, jpeg_of(&image.crop_imm(x, y, cw, ch), 90)?),
    ])
}

/// `image` as a JPEG of `quality`.
fn jpeg_of(image: &DynamicImage, quality: u8) -> Result<Vec<u8>> {
    let rgb = image.to_rgb8();
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, quality).write_image(
        &rgb,
        rgb.width(),
        rgb.height(),
        image::ExtendedColorType::Rgb8,
    )?;
    Ok(out)
}

/// `image` as PNG.
fn png_of(image: &RgbImage) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    image.write_to(&mut Cursor::new(&mut out), ImageFormat::Png)?;
    Ok(out)
}
