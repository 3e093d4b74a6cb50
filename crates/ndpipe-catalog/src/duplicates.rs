//! What the catalog keeps for finding duplicate photos: a perceptual hash of each photo (near
//! duplicates: resized, recompressed or slightly cropped copies) and the groups of photos with
//! the same bytes (exact duplicates, by the `photos_sha256` index).

use crate::{CatalogError, PhotoId, PhotoMeta};

/// Perceptual hashes of photos and exact-duplicate sets. In a catalog that nodes share, each
/// node hashes its own photos and every read answers for the whole cluster. Every method is one
/// transaction.
pub trait DuplicateCatalog: Send + Sync {
    /// Looks at this node's next `window` photos after `after`, in id order: the ids of those
    /// that have no hash by `algorithm` (none at all, or one by another algorithm), and the
    /// last id looked at (`None`: no photo after `after`). A scan of every photo goes window by
    /// window, so no one call holds the catalog for long.
    fn photos_without_near_hash(
        &self,
        algorithm: &str,
        after: Option<PhotoId>,
        window: usize,
    ) -> Result<(Vec<PhotoId>, Option<PhotoId>), CatalogError>;

    /// How many photos (every node's in a shared catalog) have no hash by `algorithm`.
    fn count_without_near_hash(&self, algorithm: &str) -> Result<u64, CatalogError>;

    /// Records the 64-bit hashes of `rows` by `algorithm`, replacing a hash by another
    /// algorithm. Each id at most once; photos that no longer exist are skipped; returns how many
    /// were written.
    fn put_near_hashes(
        &self,
        algorithm: &str,
        rows: &[(PhotoId, u64)],
    ) -> Result<usize, CatalogError>;

    /// Every hash by `algorithm` of the photos at least `min_side` pixels wide and high (0:
    /// every photo; every node's photos in a shared catalog), in id order. The near level pairs
    /// only photos of that size, so the smaller ones are left out before pairing.
    fn near_hashes(
        &self,
        algorithm: &str,
        min_side: u32,
    ) -> Result<Vec<(PhotoId, u64)>, CatalogError>;

    /// The photos that share their SHA-256 with another one, one set per SHA-256, each in id
    /// order (every node's photos in a shared catalog).
    fn exact_duplicate_sets(&self) -> Result<Vec<Vec<PhotoId>>, CatalogError>;

    /// The metadata of `ids`, whichever node holds them, in id order; unknown ids are left out.
    /// Without ground truth (`ground_truth` is `None`): duplicate groups read sizes and dates,
    /// and a page of groups may name 10^4 photos.
    fn photo_metas(&self, ids: &[PhotoId]) -> Result<Vec<(PhotoId, PhotoMeta)>, CatalogError>;
}

/// The ids without a hash among a window's `rows` (id, whether it has no hash), in id order,
/// and the window's last id.
pub(crate) fn unhashed_of(rows: &[(PhotoId, bool)]) -> (Vec<PhotoId>, Option<PhotoId>) {
    let unhashed = rows
        .iter()
        .filter(|(_, none)| *none)
        .map(|(id, _)| *id)
        .collect();
    (unhashed, rows.last().map(|(id, _)| *id))
}
