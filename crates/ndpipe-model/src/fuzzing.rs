//! The harnesses of the fuzz targets over this crate's decoders of untrusted bytes (`fuzz/`:
//! `tensor_blob`, `head_file`, `preprocess`), compiled with feature `fuzzing` and in every test
//! build. The unit tests below replay each target's committed seeds and kept crashes through
//! the same harness, so a regression fails `cargo test` without a fuzzer. Not product API.

use crate::head::HeadFile;
use crate::preprocess::{PreprocessConfig, PreprocessError, Preprocessor};
use crate::tensor::{Codec, TensorBlob};

/// The `tensor_blob` target: a stored tensor blob (`TensorBlob::decode`); one that decodes
/// must encode again, uncompressed, to a blob that decodes to the same tensor.
pub fn tensor_blob(data: &[u8]) {
    if let Ok(tensor) = TensorBlob::decode(data) {
        let again = TensorBlob::encode(&tensor, Codec::None).expect("a decoded tensor encodes");
        let back = TensorBlob::decode(&again).expect("an encoded tensor decodes");
        assert_eq!(back, tensor);
    }
}

/// The `head_file` target: a head file's bytes (`HeadFile::from_bytes`, then `to_linear`); a
/// file that parses must write and parse again to the same head.
pub fn head_file(data: &[u8]) {
    let Ok(file) = HeadFile::from_bytes(data) else {
        return;
    };
    let _ = file.to_linear();
    if let Ok(bytes) = file.to_bytes() {
        let again = HeadFile::from_bytes(&bytes).expect("a written head file parses");
        assert_eq!(again.tensors.len(), file.tensors.len());
        assert_eq!(again.config, file.config);
    }
}

/// The pixel limit of the `preprocess` target: small, so every input decodes fast.
pub const PREPROCESS_MAX_PIXELS: u64 = 1 << 20;

/// The `preprocess` target: an upload through ingest's transform with its limits
/// (`Preprocessor::decode_cost`, then `Preprocessor::run`). An image over the pixel limit must
/// be refused by both; one that preprocesses must give the crop-sized tensor, and its cost must
/// have been known from the header.
pub fn preprocess(data: &[u8]) {
    let pre = Preprocessor::new(PreprocessConfig {
        resize_shorter: 32,
        crop: 28,
        max_pixels: PREPROCESS_MAX_PIXELS,
    });
    let cost = pre.decode_cost(data);
    if let Ok(cost) = &cost {
        assert!(
            *cost <= PREPROCESS_MAX_PIXELS * 11,
            "cost {cost} over the limit's"
        );
    }
    match pre.run(data) {
        Ok(out) => {
            assert!(cost.is_ok(), "preprocessed an image whose cost was refused");
            assert_eq!((out.tensor.height(), out.tensor.width()), (28, 28));
            assert!(
                u64::from(out.original_width) * u64::from(out.original_height)
                    <= PREPROCESS_MAX_PIXELS
            );
        }
        Err(PreprocessError::TooManyPixels { pixels, .. }) => {
            assert!(pixels > PREPROCESS_MAX_PIXELS);
        }
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use image::{DynamicImage, ImageFormat, RgbImage};
    use ndpipe_util::fuzzing::{replay, write_seed};

    use super::*;
    use crate::head::{HeadVersion, HeadWeights};
    use crate::tensor::ImageTensor;

    const M: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn tensor_blob_corpus_replays() {
        replay(M, "tensor_blob", tensor_blob);
    }

    #[test]
    fn head_file_corpus_replays() {
        replay(M, "head_file", head_file);
    }

    #[test]
    fn preprocess_corpus_replays() {
        replay(M, "preprocess", preprocess);
    }

    /// A small photo: a real sample (`NDPIPE_SAMPLES_DIR`) scaled down when there is one, else
    /// a gradient.
    fn small_photo() -> DynamicImage {
        let sample = std::env::var_os("NDPIPE_SAMPLES_DIR")
            .map(|d| std::path::PathBuf::from(d).join("chelsea.png"))
            .and_then(|p| image::open(p).ok());
        match sample {
            Some(img) => img.thumbnail(24, 16),
            None => DynamicImage::ImageRgb8(RgbImage::from_fn(24, 16, |x, y| {
                image::Rgb([(x * 10) as u8, (y * 15) as u8, 128])
            })),
        }
    }

    fn encode(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut out), format)
            .expect("encode a seed image");
        out
    }

    /// Writes the seeds of this crate's targets: `cargo test -p ndpipe-model -- --ignored
    /// write_seeds` (with `NDPIPE_SAMPLES_DIR` set, the photos come from a real sample).
    #[test]
    #[ignore = "writes the committed seed corpus"]
    fn write_seeds() {
        let photo = small_photo();
        write_seed(
            M,
            "preprocess",
            "photo.png",
            &encode(&photo, ImageFormat::Png),
        );
        write_seed(
            M,
            "preprocess",
            "photo.jpg",
            &encode(&DynamicImage::ImageRgb8(photo.to_rgb8()), ImageFormat::Jpeg),
        );
        write_seed(
            M,
            "preprocess",
            "photo.webp",
            &encode(&photo, ImageFormat::WebP),
        );
        write_seed(
            M,
            "preprocess",
            "grey16.png",
            &encode(
                &DynamicImage::ImageLuma16(photo.to_luma16()),
                ImageFormat::Png,
            ),
        );

        let rgb = photo.thumbnail_exact(8, 6).to_rgb8();
        let tensor = ImageTensor::new(6, 8, 3, rgb.into_raw()).unwrap();
        for (name, codec) in [
            ("raw", Codec::None),
            ("zstd", Codec::Zstd { level: 3 }),
            ("deflate", Codec::Deflate { level: 6 }),
        ] {
            write_seed(
                M,
                "tensor_blob",
                name,
                &TensorBlob::encode(&tensor, codec).unwrap(),
            );
        }

        let classes = vec!["cat".to_string(), "dog".to_string()];
        let head = HeadWeights::new(
            classes,
            3,
            vec![0.5, -1.0, 2.0, 0.0, 1.5, -0.25],
            vec![0.1, -0.1],
        )
        .unwrap();
        let version = HeadVersion {
            task: "default".into(),
            id: "v1".into(),
            backbone: "ab".repeat(4),
            parent: None,
            metrics: serde_json::json!({"accuracy": 0.5}),
        };
        let file = HeadFile::from_linear(&head, Some(version));
        write_seed(M, "head_file", "linear", &file.to_bytes().unwrap());
    }
}
