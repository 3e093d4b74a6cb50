//! Decode an uploaded photo and turn it into the model's input tensor.
//!
//! The pipeline matches the usual ImageNet evaluation transform: decode, apply EXIF orientation,
//! convert to RGB (grey and alpha inputs included), resize the shorter side to
//! [`PreprocessConfig::resize_shorter`] and take a centre crop of [`PreprocessConfig::crop`].
//! The resize and the crop are done in one resampling pass over the matching source region.

use std::io::Cursor;

use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::jpeg_scan::{self, ScanDefect};
use crate::tensor::ImageTensor;

/// Photo container formats accepted at ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhotoFormat {
    /// JPEG (baseline or progressive).
    Jpeg,
    /// PNG, any bit depth.
    Png,
    /// WebP, lossy or lossless.
    WebP,
}

impl PhotoFormat {
    /// The MIME type served back to clients.
    pub fn content_type(self) -> &'static str {
        match self {
            PhotoFormat::Jpeg => "image/jpeg",
            PhotoFormat::Png => "image/png",
            PhotoFormat::WebP => "image/webp",
        }
    }

    /// Parses a MIME type as written by [`PhotoFormat::content_type`].
    pub fn from_content_type(s: &str) -> Option<Self> {
        match s {
            "image/jpeg" => Some(PhotoFormat::Jpeg),
            "image/png" => Some(PhotoFormat::Png),
            "image/webp" => Some(PhotoFormat::WebP),
            _ => None,
        }
    }

    /// Recognises the format from the file's leading bytes.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        match image::guess_format(bytes).ok()? {
            ImageFormat::Jpeg => Some(PhotoFormat::Jpeg),
            ImageFormat::Png => Some(PhotoFormat::Png),
            ImageFormat::WebP => Some(PhotoFormat::WebP),
            _ => None,
        }
    }

    fn image_format(self) -> ImageFormat {
        match self {
            PhotoFormat::Jpeg => ImageFormat::Jpeg,
            PhotoFormat::Png => ImageFormat::Png,
            PhotoFormat::WebP => ImageFormat::WebP,
        }
    }
}

/// Why a photo could not be preprocessed. Every variant is the uploader's problem (HTTP 4xx).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreprocessError {
    /// Zero bytes were uploaded.
    #[error("the upload is empty")]
    Empty,
    /// The bytes are not a JPEG, PNG or WebP file.
    #[error("not a supported image: expected JPEG, PNG or WebP{}", .detected.map(|d| format!(" (looks like {d})")).unwrap_or_default())]
    UnsupportedFormat {
        /// The format recognised from the magic bytes, when it is one we do not accept.
        detected: Option<&'static str>,
    },
    /// The image declares more pixels than allowed (a decompression bomb or simply too large).
    #[error("image is {width}x{height} = {pixels} pixels, over the limit of {limit}")]
    TooManyPixels {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
        /// width * height.
        pixels: u64,
        /// The configured limit.
        limit: u64,
    },
    /// The file ends before the image data does.
    #[error("{format:?} data is truncated")]
    Truncated {
        /// The container format.
        format: PhotoFormat,
    },
    /// The decoder rejected the bytes.
    #[error("cannot decode {format:?}: {message}")]
    Decode {
        /// The container format.
        format: PhotoFormat,
        /// The decoder's message.
        message: String,
    },
    /// The image has a zero dimension.
    #[error("image has a zero dimension ({width}x{height})")]
    ZeroSized {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
    },
}

/// Settings of the ingest transform.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    /// The shorter side is resized to this many pixels before cropping.
    pub resize_shorter: u32,
    /// Side of the square centre crop: the model's input size.
    pub crop: u32,
    /// Largest accepted width * height, checked before any pixel is decoded.
    pub max_pixels: u64,
}

impl Default for PreprocessConfig {
    fn default() -> Self {
        PreprocessConfig {
            resize_shorter: 256,
            crop: 224,
            max_pixels: 64 * 1024 * 1024,
        }
    }
}

/// The result of preprocessing one photo.
#[derive(Debug, Clone)]
pub struct Preprocessed {
    /// The container format of the upload.
    pub format: PhotoFormat,
    /// Width after EXIF orientation.
    pub original_width: u32,
    /// Height after EXIF orientation.
    pub original_height: u32,
    /// The model input, `crop` x `crop` RGB.
    pub tensor: ImageTensor,
}

/// Runs the ingest transform. Cheap to clone; one per worker thread is fine.
#[derive(Debug, Clone)]
pub struct Preprocessor {
    config: PreprocessConfig,
}

impl Preprocessor {
    /// A preprocessor with the given settings.
    pub fn new(config: PreprocessConfig) -> Self {
        Preprocessor { config }
    }

    /// The settings in use.
    pub fn config(&self) -> &PreprocessConfig {
        &self.config
    }

    /// Decodes `bytes` and produces the model tensor.
    pub fn run(&self, bytes: &[u8]) -> Result<Preprocessed, PreprocessError> {
        let (format, image) = self.decode(bytes)?;
        let rgb = image.into_rgb8();
        let (width, height) = rgb.dimensions();
        let tensor = self.resize_and_crop(rgb.into_raw(), width, height)?;
        Ok(Preprocessed {
            format,
            original_width: width,
            original_height: height,
            tensor,
        })
    }

    /// Bytes of memory decoding `bytes` will take at most (the decoded pixels at their own
    /// depth, and one conversion copy), read from the header alone; an error for bytes that
    /// [`Preprocessor::decode`] would refuse before decoding.
    pub fn decode_cost(&self, bytes: &[u8]) -> Result<u64, PreprocessError> {
        let format = checked_format(bytes)?;
        let mut reader = ImageReader::with_format(Cursor::new(bytes), format.image_format());
        reader.limits(self.limits());
        let decoder = reader.into_decoder().map_err(|e| classify(format, e))?;
        let (width, height) = decoder.dimensions();
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.config.max_pixels {
            return Err(PreprocessError::TooManyPixels {
                width,
                height,
                pixels,
                limit: self.config.max_pixels,
            });
        }
        let depth = u64::from(decoder.color_type().bytes_per_pixel());
        // The decoded image at its depth, then 8-bit RGB for resizing.
        Ok(pixels * (depth + 3))
    }

    /// Decodes `bytes` into an oriented image, enforcing the pixel limit before decoding.
    pub fn decode(&self, bytes: &[u8]) -> Result<(PhotoFormat, DynamicImage), PreprocessError> {
        let format = checked_format(bytes)?;
        let mut reader = ImageReader::with_format(Cursor::new(bytes), format.image_format());
        reader.limits(self.limits());
        let decode_err = |e: image::ImageError| classify(format, e);
        let mut decoder = reader.into_decoder().map_err(decode_err)?;
        let (width, height) = decoder.dimensions();
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.config.max_pixels {
            return Err(PreprocessError::TooManyPixels {
                width,
                height,
                pixels,
                limit: self.config.max_pixels,
            });
        }
        if pixels == 0 {
            return Err(PreprocessError::ZeroSized { width, height });
        }
        if format == PhotoFormat::Jpeg {
            check_jpeg_scans(bytes)?;
        }
        let orientation = decoder.orientation().map_err(decode_err)?;
        let mut image = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
        image.apply_orientation(orientation);
        Ok((format, image))
    }

    fn limits(&self) -> Limits {
        let side = u32::try_from(self.config.max_pixels).unwrap_or(u32::MAX);
        let mut limits = Limits::default();
        limits.max_image_width = Some(side);
        limits.max_image_height = Some(side);
        // 16-bit RGBA is the widest decoded pixel: 8 bytes, plus room for one conversion copy.
        limits.max_alloc = Some(self.config.max_pixels.saturating_mul(16));
        limits
    }

    /// Resizes the shorter side to `resize_shorter` and crops the centre `crop` square, in one pass.
    fn resize_and_crop(
        &self,
        rgb: Vec<u8>,
        width: u32,
        height: u32,
    ) -> Result<ImageTensor, PreprocessError> {
        let crop = self.config.crop;
        let src = Image::from_vec_u8(width, height, rgb, PixelType::U8x3).map_err(|e| {
            PreprocessError::Decode {
                format: PhotoFormat::Png,
                message: e.to_string(),
            }
        })?;
        let (left, top, crop_width, crop_height) =
            centre_crop_region(width, height, self.config.resize_shorter, crop);
        let mut dst = Image::new(crop, crop, PixelType::U8x3);
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(left, top, crop_width, crop_height);
        Resizer::new()
            .resize(&src, &mut dst, &options)
            .map_err(|e| PreprocessError::Decode {
                format: PhotoFormat::Png,
                message: format!("resize failed: {e}"),
            })?;
        Ok(ImageTensor::new(crop, crop, 3, dst.into_vec())
            .expect("resizer output has crop*crop*3 bytes; this is a bug"))
    }
}

/// The source region (left, top, width, height) that becomes the centre crop, computed as the
/// reference transform does it (torchvision / PIL): resize to whole pixels, the shorter side to
/// `shorter` and the longer side rounded, then crop `crop` pixels at the integer offset
/// `(resized - crop) / 2`. Each axis maps back with its own scale.
fn centre_crop_region(width: u32, height: u32, shorter: u32, crop: u32) -> (f64, f64, f64, f64) {
    let scale = f64::from(shorter) / f64::from(width.min(height));
    let resized = |side: u32| ((f64::from(side) * scale).round() as u32).max(shorter);
    let (rw, rh) = (resized(width), resized(height));
    let (sx, sy) = (
        f64::from(rw) / f64::from(width),
        f64::from(rh) / f64::from(height),
    );
    let offset = |resized: u32| f64::from(resized.saturating_sub(crop) / 2);
    let side = f64::from(crop);
    (
        offset(rw) / sx,
        offset(rh) / sy,
        (side / sx).min(f64::from(width)),
        (side / sy).min(f64::from(height)),
    )
}

/// The format of `bytes`, refusing what no decode should start on: nothing, a format not
/// accepted, or a JPEG cut short (no end marker).
fn checked_format(bytes: &[u8]) -> Result<PhotoFormat, PreprocessError> {
    if bytes.is_empty() {
        return Err(PreprocessError::Empty);
    }
    let format = PhotoFormat::sniff(bytes).ok_or_else(|| PreprocessError::UnsupportedFormat {
        detected: image::guess_format(bytes).ok().map(format_name),
    })?;
    if format == PhotoFormat::Jpeg && !jpeg_has_end_marker(bytes) {
        return Err(PreprocessError::Truncated { format });
    }
    Ok(format)
}

/// A complete JPEG ends with the EOI marker (FF D9); some writers append a few padding bytes.
fn jpeg_has_end_marker(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(64)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

/// Refuses a JPEG whose scans end before their last block (half a JPEG with an end marker
/// appended), which the decoder would fill with grey.
fn check_jpeg_scans(bytes: &[u8]) -> Result<(), PreprocessError> {
    let format = PhotoFormat::Jpeg;
    jpeg_scan::check(bytes).map_err(|defect| match defect {
        ScanDefect::EndsEarly => PreprocessError::Truncated { format },
        ScanDefect::Invalid(what) => PreprocessError::Decode {
            format,
            message: format!("invalid {what}"),
        },
    })
}

fn classify(format: PhotoFormat, e: image::ImageError) -> PreprocessError {
    if matches!(&e, image::ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof)
    {
        return PreprocessError::Truncated { format };
    }
    classify_message(format, e.to_string())
}

/// A decoder's message as [`PreprocessError::Truncated`] when it says the data ended early,
/// else as [`PreprocessError::Decode`].
fn classify_message(format: PhotoFormat, message: String) -> PreprocessError {
    let lower = message.to_ascii_lowercase();
    let truncated = lower.contains("eof")
        || lower.contains("truncat")
        || lower.contains("unexpected end")
        || lower.contains("premature end");
    if truncated {
        PreprocessError::Truncated { format }
    } else {
        PreprocessError::Decode { format, message }
    }
}

fn format_name(f: ImageFormat) -> &'static str {
    f.extensions_str().first().copied().unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Vec::new();
        img.write_to(&mut Cursor::new(&mut out), format).unwrap();
        out
    }

    #[test]
    fn the_decode_cost_comes_from_the_header_and_the_pixel_depth() {
        let pre = Preprocessor::new(PreprocessConfig::default());
        let rgb = DynamicImage::ImageRgb8(image::RgbImage::new(64, 48));
        assert_eq!(
            pre.decode_cost(&encode(&rgb, ImageFormat::Png)).unwrap(),
            64 * 48 * 6
        );
        let deep = DynamicImage::ImageRgba16(image::ImageBuffer::new(64, 48));
        assert_eq!(
            pre.decode_cost(&encode(&deep, ImageFormat::Png)).unwrap(),
            64 * 48 * 11
        );
        let small = Preprocessor::new(PreprocessConfig {
            max_pixels: 100,
            ..PreprocessConfig::default()
        });
        assert!(matches!(
            small.decode_cost(&encode(&rgb, ImageFormat::Png)),
            Err(PreprocessError::TooManyPixels { .. })
        ));
        assert!(matches!(pre.decode_cost(b""), Err(PreprocessError::Empty)));
    }

    #[test]
    fn crop_region_is_centred_on_the_shorter_side() {
        let (l, t, w, s) = centre_crop_region(512, 256, 256, 224);
        assert_eq!((w, s), (224.0, 224.0));
        assert_eq!(t, 16.0);
        assert_eq!(l, 144.0);
    }

    #[test]
    fn grey_and_rgba_inputs_become_rgb() {
        let pre = Preprocessor::new(PreprocessConfig::default());
        let grey =
            DynamicImage::ImageLuma8(image::GrayImage::from_pixel(28, 28, image::Luma([77])));
        let out = pre.run(&encode(&grey, ImageFormat::Png)).unwrap();
        assert_eq!(out.tensor.channels(), 3);
        assert!(out.tensor.data().iter().all(|&v| v == 77));
        let rgba = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(
            300,
            200,
            image::Rgba([1, 2, 3, 4]),
        ));
        let out = pre.run(&encode(&rgba, ImageFormat::Png)).unwrap();
        assert_eq!((out.original_width, out.original_height), (300, 200));
        assert_eq!(&out.tensor.data()[..3], &[1, 2, 3]);
    }

    #[test]
    fn centre_crop_keeps_the_centre() {
        // Left half black, right half white, wide image: the crop sees both halves equally.
        let img = image::RgbImage::from_fn(600, 300, |x, _| {
            if x < 300 {
                image::Rgb([0, 0, 0])
            } else {
                image::Rgb([255, 255, 255])
            }
        });
        let pre = Preprocessor::new(PreprocessConfig::default());
        let out = pre
            .run(&encode(&DynamicImage::ImageRgb8(img), ImageFormat::Png))
            .unwrap();
        let row = &out.tensor.data()[..224 * 3];
        assert_eq!(row[0], 0);
        assert_eq!(row[223 * 3], 255);
    }

    #[test]
    fn bad_inputs_are_named() {
        let pre = Preprocessor::new(PreprocessConfig::default());
        assert!(matches!(pre.run(b""), Err(PreprocessError::Empty)));
        assert!(matches!(
            pre.run(b"hello, this is not an image"),
            Err(PreprocessError::UnsupportedFormat { detected: None })
        ));
        let gif = encode(
            &DynamicImage::ImageRgb8(image::RgbImage::new(4, 4)),
            ImageFormat::Png,
        );
        let mut bmp = b"BM".to_vec();
        bmp.extend_from_slice(&gif[2..]);
        assert!(matches!(
            pre.run(&bmp),
            Err(PreprocessError::UnsupportedFormat { .. })
        ));
        let jpeg = encode(
            &DynamicImage::ImageRgb8(image::RgbImage::from_pixel(64, 64, image::Rgb([9, 9, 9]))),
            ImageFormat::Jpeg,
        );
        assert!(matches!(
            pre.run(&jpeg[..jpeg.len() / 2]),
            Err(PreprocessError::Truncated { .. })
        ));
        let png = encode(
            &DynamicImage::ImageRgb8(image::RgbImage::from_pixel(64, 64, image::Rgb([9, 9, 9]))),
            ImageFormat::Png,
        );
        assert!(pre.run(&png[..png.len() / 2]).is_err());
    }

    /// A photo with detail everywhere, so that every part of its scan data matters.
    fn noisy(format: ImageFormat) -> Vec<u8> {
        let img = image::RgbImage::from_fn(256, 192, |x, y| {
            let v = (x * 31 + y * 17 + (x * y) % 97) as u8;
            image::Rgb([v, v.wrapping_mul(3), v ^ 0x5a])
        });
        encode(&DynamicImage::ImageRgb8(img), format)
    }

    /// PNG and WebP check their data to the end; JPEG's scans are walked to their last block
    /// (`image`'s decoder takes an end marker inside the scan data as the end of the image).
    #[test]
    fn half_an_image_is_refused_even_with_an_end_marker() {
        let pre = Preprocessor::new(PreprocessConfig::default());
        for format in [ImageFormat::Png, ImageFormat::WebP, ImageFormat::Jpeg] {
            let whole = noisy(format);
            assert!(pre.run(&whole).is_ok(), "{format:?} whole");
            let mut half = whole[..whole.len() / 2].to_vec();
            assert!(pre.run(&half).is_err(), "{format:?} half");
            half.extend_from_slice(&[0xFF, 0xD9]);
            let refused = pre.run(&half);
            assert!(refused.is_err(), "{format:?} half with FF D9 was accepted");
        }
    }

    #[test]
    fn pixel_limit_is_checked_before_decoding() {
        let pre = Preprocessor::new(PreprocessConfig {
            max_pixels: 100 * 100,
            ..PreprocessConfig::default()
        });
        let big = encode(
            &DynamicImage::ImageLuma8(image::GrayImage::new(101, 100)),
            ImageFormat::Png,
        );
        assert!(matches!(
            pre.run(&big),
            Err(PreprocessError::TooManyPixels { pixels: 10100, .. })
        ));
    }
}
