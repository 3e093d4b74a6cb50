//! The stored tensor format: a preprocessed photo, compressed, with a small versioned header.
//!
//! Layout of a [`TensorBlob`] (little-endian, 16-byte header, then the codec's payload):
//!
//! ```text
//! 0   magic     4 bytes  "NDTS"
//! 4   version   u8       1
//! 5   dtype     u8       1 = u8
//! 6   layout    u8       1 = HWC (row-major, channels interleaved)
//! 7   codec     u8       0 = none, 1 = zstd, 2 = deflate
//! 8   height    u16
//! 10  width     u16
//! 12  channels  u16
//! 14  reserved  u16      0
//! 16  payload   codec-compressed height*width*channels bytes
//! ```
//!
//! Integrity is the storage layer's job (volume records carry a CRC); this format only has to be
//! self-describing so that any later model code can read it without decoding the photo again.

use std::io::{Read, Write};

const MAGIC: &[u8; 4] = b"NDTS";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 16;
const DTYPE_U8: u8 = 1;
const LAYOUT_HWC: u8 = 1;
/// The largest tensor a blob may declare (a 4096x4096 RGB crop is 48 MiB): a corrupt header
/// cannot make a decode allocate more.
pub const MAX_TENSOR_BYTES: u64 = 64 << 20;

/// Errors from encoding or decoding a tensor blob.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// The blob is shorter than its header, or has the wrong magic bytes.
    #[error("not a tensor blob ({0})")]
    NotATensor(&'static str),
    /// A header field has a value this version does not know.
    #[error("unsupported tensor blob: {field} = {value}")]
    Unsupported {
        /// The header field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// The payload does not decompress to the declared shape.
    #[error("tensor payload is corrupt: {0}")]
    Corrupt(String),
    /// A codec name or level that does not exist.
    #[error("invalid tensor codec: {0}")]
    Codec(String),
    /// The shape does not match the data length.
    #[error("tensor shape {height}x{width}x{channels} does not match {len} bytes")]
    Shape {
        /// Height.
        height: u32,
        /// Width.
        width: u32,
        /// Channels.
        channels: u32,
        /// Bytes of data given.
        len: usize,
    },
}

/// A u8 image tensor in HWC layout. The data length always equals height*width*channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageTensor {
    height: u32,
    width: u32,
    channels: u32,
    data: Vec<u8>,
}

impl ImageTensor {
    /// Wraps `data`, checking that it has exactly height*width*channels bytes.
    pub fn new(height: u32, width: u32, channels: u32, data: Vec<u8>) -> Result<Self, TensorError> {
        let expected = u64::from(height) * u64::from(width) * u64::from(channels);
        if expected != data.len() as u64 {
            return Err(TensorError::Shape {
                height,
                width,
                channels,
                len: data.len(),
            });
        }
        Ok(ImageTensor {
            height,
            width,
            channels,
            data,
        })
    }

    /// Rows.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Columns.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Channels per pixel (3 for RGB).
    pub fn channels(&self) -> u32 {
        self.channels
    }

    /// The pixels, HWC.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Takes the pixel buffer.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }
}

/// How the payload of a blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Stored as is.
    None,
    /// Zstandard at the given level (1..=22).
    Zstd {
        /// Compression level.
        level: i32,
    },
    /// DEFLATE (zlib stream) at the given level (0..=9).
    Deflate {
        /// Compression level.
        level: u32,
    },
}

/// A codec by name, as settings name it (`zstd`, `deflate`, `none`); [`CodecKind::at`] adds the
/// level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecKind {
    /// [`Codec::None`].
    None,
    /// [`Codec::Zstd`].
    Zstd,
    /// [`Codec::Deflate`].
    Deflate,
}

impl std::str::FromStr for CodecKind {
    type Err = TensorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "zstd" => Ok(CodecKind::Zstd),
            "deflate" => Ok(CodecKind::Deflate),
            "none" => Ok(CodecKind::None),
            other => Err(TensorError::Codec(format!(
                "unknown tensor codec {other:?}: use zstd, deflate or none"
            ))),
        }
    }
}

impl CodecKind {
    /// The codec at `level` (zstd 1..=22, deflate 0..=9; ignored for `none`).
    pub fn at(self, level: i32) -> Result<Codec, TensorError> {
        match self {
            CodecKind::Zstd if (1..=22).contains(&level) => Ok(Codec::Zstd { level }),
            CodecKind::Deflate if (0..=9).contains(&level) => Ok(Codec::Deflate {
                level: level.unsigned_abs(),
            }),
            CodecKind::None => Ok(Codec::None),
            CodecKind::Zstd => Err(TensorError::Codec(format!(
                "zstd level must be 1..=22, not {level}"
            ))),
            CodecKind::Deflate => Err(TensorError::Codec(format!(
                "deflate level must be 0..=9, not {level}"
            ))),
        }
    }
}

impl Codec {
    fn id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zstd { .. } => 1,
            Codec::Deflate { .. } => 2,
        }
    }
}

/// Encoder and decoder of the on-disk tensor format.
pub struct TensorBlob;

impl TensorBlob {
    /// Serialises `tensor` with `codec`; a tensor over [`MAX_TENSOR_BYTES`] is refused, as
    /// [`TensorBlob::decode`] would refuse its blob.
    pub fn encode(tensor: &ImageTensor, codec: Codec) -> Result<Vec<u8>, TensorError> {
        let dim = |field: &'static str, v: u32| {
            u16::try_from(v).map_err(|_| TensorError::Unsupported { field, value: v })
        };
        if tensor.data.len() as u64 > MAX_TENSOR_BYTES {
            return Err(TensorError::Unsupported {
                field: "size in MiB",
                value: u32::try_from(tensor.data.len() >> 20).unwrap_or(u32::MAX),
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + tensor.data.len() / 2);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, DTYPE_U8, LAYOUT_HWC, codec.id()]);
        out.extend_from_slice(&dim("height", tensor.height)?.to_le_bytes());
        out.extend_from_slice(&dim("width", tensor.width)?.to_le_bytes());
        out.extend_from_slice(&dim("channels", tensor.channels)?.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        let io = |e: std::io::Error| TensorError::Corrupt(e.to_string());
        match codec {
            Codec::None => out.extend_from_slice(&tensor.data),
            Codec::Zstd { level } => {
                let payload = zstd::bulk::compress(&tensor.data, level).map_err(io)?;
                out.extend_from_slice(&payload);
            }
            Codec::Deflate { level } => {
                let mut enc = flate2::write::ZlibEncoder::new(out, flate2::Compression::new(level));
                enc.write_all(&tensor.data).map_err(io)?;
                out = enc.finish().map_err(io)?;
            }
        }
        Ok(out)
    }

    /// Parses and decompresses a blob written by [`TensorBlob::encode`].
    pub fn decode(blob: &[u8]) -> Result<ImageTensor, TensorError> {
        if blob.len() < HEADER_LEN {
            return Err(TensorError::NotATensor("shorter than the header"));
        }
        if &blob[..4] != MAGIC {
            return Err(TensorError::NotATensor("bad magic"));
        }
        let check = |field: &'static str, value: u8, want: u8| {
            if value == want {
                Ok(())
            } else {
                Err(TensorError::Unsupported {
                    field,
                    value: value.into(),
                })
            }
        };
        check("version", blob[4], VERSION)?;
        check("dtype", blob[5], DTYPE_U8)?;
        check("layout", blob[6], LAYOUT_HWC)?;
        let u16_at = |i: usize| u32::from(u16::from_le_bytes([blob[i], blob[i + 1]]));
        let (height, width, channels) = (u16_at(8), u16_at(10), u16_at(12));
        // Three u16 sides multiply past u32 (fuzz regression `shape-product-overflows-u32`),
        // and the decompressors allocate the declared length up front.
        let declared = u64::from(height) * u64::from(width) * u64::from(channels);
        if declared > MAX_TENSOR_BYTES {
            return Err(TensorError::Corrupt(format!(
                "header declares {height}x{width}x{channels} = {declared} bytes, over {MAX_TENSOR_BYTES}"
            )));
        }
        let len = declared as usize;
        let payload = &blob[HEADER_LEN..];
        let data = match blob[7] {
            0 => payload.to_vec(),
            1 => zstd::bulk::decompress(payload, len)
                .map_err(|e| TensorError::Corrupt(e.to_string()))?,
            2 => {
                let mut data = Vec::with_capacity(len);
                flate2::read::ZlibDecoder::new(payload)
                    .take(len as u64 + 1)
                    .read_to_end(&mut data)
                    .map_err(|e| TensorError::Corrupt(e.to_string()))?;
                data
            }
            other => {
                return Err(TensorError::Unsupported {
                    field: "codec",
                    value: other.into(),
                });
            }
        };
        if data.len() != len {
            return Err(TensorError::Corrupt(format!(
                "payload decompressed to {} bytes, header says {len}",
                data.len()
            )));
        }
        ImageTensor::new(height, width, channels, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ImageTensor {
        let data = (0..224u32 * 224 * 3).map(|i| (i % 251) as u8).collect();
        ImageTensor::new(224, 224, 3, data).unwrap()
    }

    #[test]
    fn every_codec_round_trips() {
        for codec in [
            Codec::None,
            Codec::Zstd { level: 3 },
            Codec::Deflate { level: 6 },
        ] {
            let blob = TensorBlob::encode(&sample(), codec).unwrap();
            assert_eq!(TensorBlob::decode(&blob).unwrap(), sample(), "{codec:?}");
        }
    }

    #[test]
    fn damaged_blobs_are_errors() {
        let blob = TensorBlob::encode(&sample(), Codec::Zstd { level: 3 }).unwrap();
        assert!(TensorBlob::decode(&blob[..10]).is_err());
        assert!(TensorBlob::decode(&blob[..blob.len() - 5]).is_err());
        let mut wrong_version = blob.clone();
        wrong_version[4] = 9;
        assert!(matches!(
            TensorBlob::decode(&wrong_version),
            Err(TensorError::Unsupported {
                field: "version",
                value: 9
            })
        ));
        let mut bigger = blob.clone();
        bigger[8] = 225;
        assert!(TensorBlob::decode(&bigger).is_err());
    }

    #[test]
    fn shape_must_match_data() {
        assert!(ImageTensor::new(2, 2, 3, vec![0; 11]).is_err());
    }
}
