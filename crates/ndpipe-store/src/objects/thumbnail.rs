//! Small JPEGs of photos for the console: from the stored 224x224 tensor where a node has it
//! (no original decoded), else from the original, decoded and resized once by the caller's
//! cache.

use image::{DynamicImage, RgbImage};
use ndpipe_model::tensor::TensorBlob;

/// The longest side of a thumbnail made from an original.
const SIDE: u32 = 224;
/// JPEG quality of thumbnails.
const QUALITY: u8 = 80;

/// Why a thumbnail could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ThumbnailError {
    /// The stored tensor does not decode, or is not an RGB image.
    #[error("stored tensor: {0}")]
    Tensor(String),
    /// The original or the JPEG could not be coded.
    #[error("image: {0}")]
    Image(#[from] image::ImageError),
}

/// A JPEG of a stored tensor blob (`TensorBlob`: height x width x 3 bytes).
pub(crate) fn from_tensor(blob: &[u8]) -> Result<Vec<u8>, ThumbnailError> {
    let tensor = TensorBlob::decode(blob).map_err(|e| ThumbnailError::Tensor(e.to_string()))?;
    if tensor.channels() != 3 {
        let channels = tensor.channels();
        return Err(ThumbnailError::Tensor(format!(
            "{channels} channels, not 3"
        )));
    }
    let (w, h) = (tensor.width(), tensor.height());
    let rgb = RgbImage::from_raw(w, h, tensor.into_data())
        .ok_or_else(|| ThumbnailError::Tensor("size does not match its dimensions".into()))?;
    jpeg(&DynamicImage::ImageRgb8(rgb))
}

/// A JPEG of an original, its longest side at most [`SIDE`].
pub(crate) fn from_original(bytes: &[u8]) -> Result<Vec<u8>, ThumbnailError> {
    let image = image::load_from_memory(bytes)?;
    jpeg(&image.thumbnail(SIDE, SIDE))
}

fn jpeg(image: &DynamicImage) -> Result<Vec<u8>, ThumbnailError> {
    let mut out = Vec::new();
    let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, QUALITY);
    image.to_rgb8().write_with_encoder(encoder)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndpipe_model::tensor::{Codec, ImageTensor};

    #[test]
    fn a_tensor_and_an_original_become_jpegs() {
        let tensor = ImageTensor::new(224, 224, 3, vec![128; 224 * 224 * 3]).unwrap();
        let blob = TensorBlob::encode(&tensor, Codec::None).unwrap();
        let thumb = from_tensor(&blob).unwrap();
        assert_eq!(image::load_from_memory(&thumb).unwrap().width(), 224);
        let mut png = Vec::new();
        DynamicImage::ImageRgb8(RgbImage::new(800, 400))
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let thumb = image::load_from_memory(&from_original(&png).unwrap()).unwrap();
        assert_eq!((thumb.width(), thumb.height()), (224, 112));
        assert!(from_tensor(b"junk").is_err());
    }
}
