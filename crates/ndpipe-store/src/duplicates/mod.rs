//! Duplicate photos at three levels, each given as the reason in answers: `exact` (the same
//! bytes), `near` (perceptual hashes within a Hamming distance: resized, recompressed, slightly
//! cropped copies) and `semantic` (features whose cosine similarity reaches a threshold; the
//! pairs come from the caller, e.g. a feature index).
//!
//! - [`exact`]: the SHA-256 lookup at upload and what an upload of known bytes does
//!   ([`ExactDuplicates`]);
//! - [`phash`]: the perceptual hash of a stored tensor ([`NearHash`]);
//! - [`hasher`]: the worker that hashes every photo off the upload's path, and [`idle_cpu`]
//!   its thread under the idle scheduling policy;
//! - [`near`]: pairs of hashes within the threshold by multi-index hashing ([`near_pairs`]),
//!   and [`near_index`] the same pairs kept between requests, updated with the hashes that
//!   changed;
//! - [`semantic`]: the seam of the semantic level, a source of pairs by feature similarity
//!   ([`semantic::SemanticPairs`]; the feature index);
//! - [`groups`]: pairs into groups with reasons and a keeper (union-find);
//! - [`find`]: the groups of the catalog's photos at the levels asked for, and [`component`]
//!   one photo's group without finding the others.

pub(crate) mod component;
pub(crate) mod exact;
pub(crate) mod find;
pub(crate) mod groups;
pub(crate) mod hasher;
pub(crate) mod idle_cpu;
pub(crate) mod near;
pub(crate) mod near_index;
pub(crate) mod phash;
pub(crate) mod semantic;

pub use exact::ExactDuplicates;
pub use near::{NearPair, near_pairs};
pub use phash::{NearHash, PerceptualHasher};

/// Bits of a perceptual hash.
pub const HASH_BITS: u32 = 64;

/// The default Hamming threshold of near duplicates, from `ndpipe-bench duplicates`.
pub const DEFAULT_NEAR_HAMMING: u32 = 12;

/// The default smallest side, in pixels, of a photo the near level pairs: a perceptual hash of
/// a smaller image (a 28x28 thumbnail, upscaled to the stored 224x224 tensor) has too little
/// detail, and most such images of one kind pair with each other (`make demo`'s Fashion-MNIST:
/// one group of 293 distinct photos at 12 bits).
pub const DEFAULT_NEAR_MIN_SIDE: u32 = 64;

/// The default cosine threshold of semantic duplicates, from `ndpipe-bench duplicates`.
pub const DEFAULT_SEMANTIC_MIN_COSINE: f64 = 0.9;

/// The settings of duplicate finding, as a node's or a gateway's configuration gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DuplicateSettings {
    /// What an upload of bytes the catalog has already does.
    pub(crate) exact: ExactDuplicates,
    /// The perceptual hash.
    pub(crate) near_hash: NearHash,
    /// Largest Hamming distance of near duplicates' hashes.
    pub(crate) near_hamming: u32,
    /// Smallest width and height, in pixels, of a photo the near level pairs.
    pub(crate) near_min_side: u32,
    /// Smallest cosine similarity of semantic duplicates' features.
    pub(crate) semantic_min_cosine: f64,
}

impl Default for DuplicateSettings {
    fn default() -> Self {
        DuplicateSettings {
            exact: ExactDuplicates::default(),
            near_hash: NearHash::default(),
            near_hamming: DEFAULT_NEAR_HAMMING,
            near_min_side: DEFAULT_NEAR_MIN_SIDE,
            semantic_min_cosine: DEFAULT_SEMANTIC_MIN_COSINE,
        }
    }
}

impl DuplicateSettings {
    /// Refuses a threshold outside its range: `(setting, reason)`.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.near_hamming > HASH_BITS / 2 {
            return Err((
                "near_hamming",
                format!(
                    "{} bits of {HASH_BITS} would pair unrelated photos: give 0..={}",
                    self.near_hamming,
                    HASH_BITS / 2
                ),
            ));
        }
        if !(-1.0..=1.0).contains(&self.semantic_min_cosine) {
            return Err((
                "semantic_min_cosine",
                format!("{} is not a cosine: give -1..=1", self.semantic_min_cosine),
            ));
        }
        Ok(())
    }
}
