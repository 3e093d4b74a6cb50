//! Model-side data handling for ndpipe.
//!
//! This crate turns an uploaded photo into the fixed-size tensor that every model in the system
//! consumes, and defines how that tensor is kept on disk. Photos are decoded and resized exactly
//! once, at ingest (NDPipe's "store preprocessed, compressed binaries"), so offline inference and
//! feature extraction never decode a JPEG again.
//!
//! - [`preprocess`]: decode (JPEG/PNG/WebP), apply EXIF orientation, convert to RGB, resize the
//!   shorter side to 256 and centre-crop 224, with limits against hostile input.
//! - [`tensor`]: the versioned, compressed [`tensor::TensorBlob`] format (u8 RGB, HWC).
//! - [`manifest`]: `model.json`, which says how to feed a model and what its outputs are called.
//! - [`backend`]: the sync [`InferenceBackend`] trait (features + logits for a batch of tensors),
//!   normalisation, [`top_k`], and with feature `testing` a deterministic `FakeBackend`;
//!   [`extract_features`] runs it over many tensors.
//! - [`head`]: fine-tuned classifier heads over the features: [`HeadWeights`] (what PipeStores
//!   run to label photos) and [`HeadFile`], the one on-disk head format; [`Acceptance`], a
//!   head's rules for keeping labels (a floor, and a [`Novelty`] check that sends photos
//!   unlike the training photos to [`OTHER`]).
//! - [`RateCapped`]: a model capped at a throughput, to emulate a slower accelerator.
//! - `session` (feature `ort`, on by default): [`OrtBackend`], the model run by ONNX Runtime loaded
//!   from a shared library at run time, checked against its manifest at load.
//! - `words` (feature `words`): search in words, a text-embedding model (all-MiniLM-L6-v2 on
//!   candle) that maps free text onto class names (`words::ClassMatcher`).
//!
//! Sibling crates: `ndpipe-store` keeps the original photo and this tensor in volumes,
//! `ndpipe-catalog` records labels, and the `ndpipe` binary wires them into servers.
//!
//! ```
//! use ndpipe_model::preprocess::{Preprocessor, PreprocessConfig};
//! use ndpipe_model::tensor::{Codec, TensorBlob};
//!
//! let mut png = Vec::new();
//! let img = image::RgbImage::from_pixel(40, 30, image::Rgb([200, 10, 10]));
//! img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
//!
//! let pre = Preprocessor::new(PreprocessConfig::default());
//! let out = pre.run(&png).unwrap();
//! assert_eq!((out.original_width, out.original_height), (40, 30));
//! let blob = TensorBlob::encode(&out.tensor, Codec::Zstd { level: 3 }).unwrap();
//! assert_eq!(TensorBlob::decode(&blob).unwrap(), out.tensor);
//! ```
#![deny(missing_docs)]

mod accept;
pub mod backend;
mod extract;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod head;
mod jpeg_scan;
pub mod manifest;
pub mod preprocess;
mod rate_cap;
#[cfg(feature = "ort")]
pub mod session;
pub mod tensor;
#[cfg(feature = "words")]
pub mod words;

pub use accept::{Acceptance, Novelty, OTHER};
#[cfg(feature = "testing")]
pub use backend::FakeBackend;
pub use backend::{InferenceBackend, ModelError, ModelInfo, Normalizer, Outputs, top_k};
pub use extract::extract_features;
pub use head::{HeadError, HeadFile, HeadVersion, HeadWeights};
pub use manifest::{Layout, ModelManifest, OutputNames};
pub use rate_cap::RateCapped;
#[cfg(feature = "ort")]
pub use session::{ExecutionProvider, OrtBackend, RuntimeConfig};

pub use preprocess::{PhotoFormat, PreprocessConfig, PreprocessError, Preprocessed, Preprocessor};
pub use tensor::{Codec, CodecKind, ImageTensor, TensorBlob, TensorError};
