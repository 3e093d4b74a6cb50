//! Duplicate groups from the catalog: exact pairs from the photos sharing a SHA-256, near pairs
//! from the perceptual hashes, semantic pairs from the caller, all grouped together.

use std::collections::{BTreeSet, HashMap};

use ndpipe_catalog::{Catalog, CatalogError, PhotoId};

use super::groups::{Group, Level, Pair, group};
use super::near::{NearPair, near_pairs};
use super::near_index::NearIndex;
use super::semantic::SemanticPair;
use super::{DuplicateSettings, HASH_BITS};

/// What a search for duplicates found.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The groups, in id order.
    pub(crate) groups: Vec<Group>,
    /// Photos without a perceptual hash yet (the near level cannot see them until the hashing
    /// worker reaches them); `None` when the near level was not asked for.
    pub(crate) unhashed: Option<u64>,
}

/// The duplicate groups at `levels` in `catalog` (every node's photos on a shared catalog).
/// `semantic` gives the semantic pairs (from a [`super::semantic::SemanticPairs`] source; those
/// under the settings' cosine threshold are left out); it is read only when `levels` has
/// [`Level::Semantic`]. The near pairs come from `kept` when given (updated with the hashes
/// that changed since its last use), else from pairing every hash.
pub(crate) fn find(
    catalog: &dyn Catalog,
    settings: &DuplicateSettings,
    levels: &BTreeSet<Level>,
    semantic: &[SemanticPair],
    kept: Option<&NearIndex>,
) -> Result<Found, CatalogError> {
    let mut pairs = Vec::new();
    if levels.contains(&Level::Exact) {
        for set in catalog.exact_duplicate_sets()? {
            pairs.extend(exact_pairs(&set));
        }
    }
    let mut unhashed = None;
    if levels.contains(&Level::Near) {
        let algorithm = settings.near_hash.name();
        let hashes = catalog.near_hashes(algorithm, settings.near_min_side)?;
        let near = match kept {
            Some(index) => index.pairs(&hashes, settings.near_hamming),
            None => near_pairs(&hashes, settings.near_hamming),
        };
        pairs.extend(near.into_iter().map(near_pair));
        unhashed = Some(catalog.count_without_near_hash(algorithm)?);
    }
    if levels.contains(&Level::Semantic) {
        pairs.extend(semantic_pairs(semantic, settings).map(|(_, p)| p));
    }
    let ids: BTreeSet<_> = pairs.iter().flat_map(|p| [p.a, p.b]).collect();
    let ids: Vec<_> = ids.into_iter().collect();
    let meta: HashMap<_, _> = catalog.photo_metas(&ids)?.into_iter().collect();
    Ok(Found {
        groups: group(&pairs, &meta),
        unhashed,
    })
}

/// The exact pairs of `set` (photos with the same SHA-256, in id order): each with the first.
pub(crate) fn exact_pairs(set: &[PhotoId]) -> impl Iterator<Item = Pair> + '_ {
    set.iter().skip(1).map(|&b| Pair {
        a: set[0],
        b,
        level: Level::Exact,
        score: 1.0,
    })
}

/// A near pair, scored `1 - distance / 64`.
pub(crate) fn near_pair(p: NearPair) -> Pair {
    Pair {
        a: p.a,
        b: p.b,
        level: Level::Near,
        score: 1.0 - f64::from(p.distance) / f64::from(HASH_BITS),
    }
}

/// The semantic pairs at or above the settings' cosine threshold, each with its index in
/// `semantic`, in order.
pub(crate) fn semantic_pairs<'a>(
    semantic: &'a [SemanticPair],
    settings: &DuplicateSettings,
) -> impl Iterator<Item = (usize, Pair)> + 'a {
    let min_cosine = settings.semantic_min_cosine;
    semantic
        .iter()
        .enumerate()
        .filter(move |(_, p)| p.cosine >= min_cosine)
        .map(|(i, p)| {
            (
                i,
                Pair {
                    a: p.a,
                    b: p.b,
                    level: Level::Semantic,
                    score: p.cosine,
                },
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndpipe_catalog::test_suite::photo;
    use ndpipe_catalog::{DuplicateCatalog, PhotoCatalog, SqliteCatalog};

    #[test]
    fn each_level_adds_its_pairs_and_semantic_ones_below_the_threshold_are_left_out() {
        let c = SqliteCatalog::in_memory().unwrap();
        for id in 1..=6 {
            let mut p = photo(id, None);
            if id <= 2 {
                p.meta.sha256 = "a".repeat(64);
            }
            c.upsert_photo(&p).unwrap();
        }
        let settings = DuplicateSettings::default();
        let alg = settings.near_hash.name();
        c.put_near_hashes(alg, &[(1, 0), (2, 0), (3, 0b111), (4, u64::MAX)])
            .unwrap();
        let semantic = [
            SemanticPair {
                a: 4,
                b: 5,
                cosine: 0.99,
            },
            SemanticPair {
                a: 5,
                b: 6,
                cosine: 0.1,
            },
        ];
        let at = |levels: &[Level]| {
            let levels = levels.iter().copied().collect();
            let found = find(&c, &settings, &levels, &semantic, None).unwrap();
            let groups: Vec<Vec<(u64, Level)>> = found
                .groups
                .iter()
                .map(|g| g.members.iter().map(|m| (m.id, m.reason)).collect())
                .collect();
            (groups, found.unhashed)
        };
        assert_eq!(
            at(&[Level::Exact]),
            (vec![vec![(1, Level::Exact), (2, Level::Exact)]], None)
        );
        assert_eq!(
            at(&[Level::Exact, Level::Near]),
            (
                vec![vec![(1, Level::Exact), (2, Level::Exact), (3, Level::Near)]],
                Some(2)
            ),
            "3 is 3 bits from 1 and 2; 5 and 6 have no hash"
        );
        let (all, _) = at(&Level::ALL);
        assert_eq!(all[1], [(4, Level::Semantic), (5, Level::Semantic)]);
        assert_eq!(all.len(), 2, "5 and 6 are under the cosine threshold");
    }

    #[test]
    fn photos_under_the_smallest_side_are_never_near_duplicates() {
        let c = SqliteCatalog::in_memory().unwrap();
        for (id, side) in [(1, 28), (2, 28), (3, 640), (4, 320)] {
            let mut p = photo(id, None);
            (p.meta.width, p.meta.height) = (side, side);
            c.upsert_photo(&p).unwrap();
        }
        let settings = DuplicateSettings::default();
        c.put_near_hashes(settings.near_hash.name(), &[(1, 0), (2, 0), (3, 1), (4, 1)])
            .unwrap();
        let levels = [Level::Near].into_iter().collect();
        let found = find(&c, &settings, &levels, &[], None).unwrap();
        let groups: Vec<Vec<u64>> = found
            .groups
            .iter()
            .map(|g| g.members.iter().map(|m| m.id).collect())
            .collect();
        assert_eq!(
            groups,
            [vec![3, 4]],
            "28 px is under {}",
            settings.near_min_side
        );
    }
}
