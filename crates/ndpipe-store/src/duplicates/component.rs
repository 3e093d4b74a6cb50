//! One photo's duplicate group without finding every group: the connected component of the
//! photo over the same links as [`super::find::find`] (exact: the same SHA-256, by the indexed
//! lookup; near: hashes within the Hamming threshold, both photos at least `near_min_side`;
//! semantic: the given pairs at the threshold), walked outwards from the photo, then grouped by
//! the same [`group`], so the answer is the group `find` reports for that photo.
//!
//! Each member costs one SHA-256 lookup; the near level reads the hashes once (only when a
//! member is large enough to have near links) and compares each member's hash with them.

use std::collections::{BTreeSet, HashMap, HashSet};

use ndpipe_catalog::{Catalog, CatalogError, PhotoId, PhotoMeta};

use super::DuplicateSettings;
use super::find::{exact_pairs, near_pair, semantic_pairs};
use super::groups::{Group, Level, Pair, group};
use super::near::NearPair;
use super::semantic::SemanticPair;

/// The group of photo `id` at `levels` in `catalog`, as [`super::find::find`] would report it
/// with the same arguments; `None` when the photo is in no group. An unknown photo is
/// [`CatalogError::NotFound`].
pub(crate) fn group_of(
    catalog: &dyn Catalog,
    settings: &DuplicateSettings,
    levels: &BTreeSet<Level>,
    semantic: &[SemanticPair],
    id: PhotoId,
) -> Result<Option<Group>, CatalogError> {
    let mut walk = Walk::new(catalog, settings, levels, semantic);
    walk.meta.extend(catalog.photo_metas(&[id])?);
    if !walk.meta.contains_key(&id) {
        return Err(CatalogError::NotFound {
            what: format!("photo {id}"),
        });
    }
    let mut reached = HashSet::from([id]);
    let mut frontier = vec![id];
    while !frontier.is_empty() {
        walk.read_meta(&frontier)?;
        let mut next = Vec::new();
        for x in frontier {
            for y in walk.links(x)? {
                if reached.insert(y) {
                    next.push(y);
                }
            }
        }
        frontier = next;
    }
    let groups = group(&walk.pairs(), &walk.meta);
    Ok(groups
        .into_iter()
        .find(|g| g.members.iter().any(|m| m.id == id)))
}

/// Every hash of a large enough photo, in id order, and the same by id.
type Hashes = (Vec<(PhotoId, u64)>, HashMap<PhotoId, u64>);

/// The walk over the links of a component: the pairs found so far, in the order `find` gives
/// them per member, and the metadata of the photos reached.
struct Walk<'a> {
    catalog: &'a dyn Catalog,
    settings: &'a DuplicateSettings,
    levels: &'a BTreeSet<Level>,
    meta: HashMap<PhotoId, PhotoMeta>,
    /// SHA-256s looked up.
    shas: HashSet<String>,
    exact: Vec<Pair>,
    /// Every hash of a large enough photo and its index by id, read at the first need.
    hashes: Option<Hashes>,
    near: BTreeSet<NearPair>,
    /// The semantic pairs at the threshold by their index in the source's list, and each
    /// photo's indexes.
    semantic: Vec<(usize, Pair)>,
    semantic_of: HashMap<PhotoId, Vec<usize>>,
    semantic_found: BTreeSet<usize>,
}

impl<'a> Walk<'a> {
    fn new(
        catalog: &'a dyn Catalog,
        settings: &'a DuplicateSettings,
        levels: &'a BTreeSet<Level>,
        semantic: &[SemanticPair],
    ) -> Self {
        let semantic: Vec<(usize, Pair)> = if levels.contains(&Level::Semantic) {
            semantic_pairs(semantic, settings).collect()
        } else {
            Vec::new()
        };
        let mut semantic_of: HashMap<PhotoId, Vec<usize>> = HashMap::new();
        for (at, (_, p)) in semantic.iter().enumerate() {
            semantic_of.entry(p.a).or_default().push(at);
            semantic_of.entry(p.b).or_default().push(at);
        }
        Walk {
            catalog,
            settings,
            levels,
            meta: HashMap::new(),
            shas: HashSet::new(),
            exact: Vec::new(),
            hashes: None,
            near: BTreeSet::new(),
            semantic,
            semantic_of,
            semantic_found: BTreeSet::new(),
        }
    }

    /// Reads the metadata of those of `ids` not read yet (photos that are gone get none).
    fn read_meta(&mut self, ids: &[PhotoId]) -> Result<(), CatalogError> {
        let missing: Vec<PhotoId> = ids
            .iter()
            .filter(|id| !self.meta.contains_key(id))
            .copied()
            .collect();
        self.meta.extend(self.catalog.photo_metas(&missing)?);
        Ok(())
    }

    /// The photos linked to `x` at the levels asked for, recording the links; none when `x`
    /// is gone (a gone photo links nothing, as in [`group`]).
    fn links(&mut self, x: PhotoId) -> Result<Vec<PhotoId>, CatalogError> {
        let Some(meta) = self.meta.get(&x).cloned() else {
            return Ok(Vec::new());
        };
        let mut linked = Vec::new();
        if self.levels.contains(&Level::Exact) {
            linked.extend(self.exact_links(&meta.sha256)?);
        }
        if self.levels.contains(&Level::Near)
            && meta.width.min(meta.height) >= self.settings.near_min_side
        {
            linked.extend(self.near_links(x)?);
        }
        for &at in self.semantic_of.get(&x).into_iter().flatten() {
            self.semantic_found.insert(at);
            let p = self.semantic[at].1;
            linked.push(if p.a == x { p.b } else { p.a });
        }
        Ok(linked)
    }

    /// The photos with SHA-256 `sha256`, when it is not looked up yet.
    fn exact_links(&mut self, sha256: &str) -> Result<Vec<PhotoId>, CatalogError> {
        if !self.shas.insert(sha256.to_string()) {
            return Ok(Vec::new());
        }
        let mut set: Vec<PhotoId> = Vec::new();
        for p in self.catalog.photos_with_sha256(sha256)? {
            set.push(p.id);
            self.meta.entry(p.id).or_insert(p.meta);
        }
        set.sort_unstable();
        if set.len() > 1 {
            self.exact.extend(exact_pairs(&set));
        }
        Ok(set)
    }

    /// The photos whose hashes are within the threshold of `x`'s.
    fn near_links(&mut self, x: PhotoId) -> Result<Vec<PhotoId>, CatalogError> {
        if self.hashes.is_none() {
            let algorithm = self.settings.near_hash.name();
            let all = self
                .catalog
                .near_hashes(algorithm, self.settings.near_min_side)?;
            let by_id = all.iter().copied().collect();
            self.hashes = Some((all, by_id));
        }
        let Some((all, by_id)) = &self.hashes else {
            return Ok(Vec::new());
        };
        let Some(&own) = by_id.get(&x) else {
            return Ok(Vec::new());
        };
        let mut linked = Vec::new();
        for &(y, hash) in all {
            let distance = (own ^ hash).count_ones();
            if y != x && distance <= self.settings.near_hamming {
                self.near.insert(NearPair {
                    a: x.min(y),
                    b: x.max(y),
                    distance,
                });
                linked.push(y);
            }
        }
        Ok(linked)
    }

    /// Every pair found, in `find`'s order: exact, near (sorted), semantic (as given).
    fn pairs(&self) -> Vec<Pair> {
        let near = self.near.iter().map(|&p| near_pair(p));
        let semantic = self.semantic_found.iter().map(|&at| self.semantic[at].1);
        self.exact
            .iter()
            .copied()
            .chain(near)
            .chain(semantic)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duplicates::find::find;
    use ndpipe_catalog::test_suite::photo;
    use ndpipe_catalog::{DuplicateCatalog, PhotoCatalog, SqliteCatalog};
    use rand::{Rng, SeedableRng};

    /// Photos in a random catalog.
    const PHOTOS: u64 = 300;

    /// `hash` with `bits` distinct random bits flipped.
    fn flip(rng: &mut impl Rng, hash: u64, bits: u32) -> u64 {
        let mut mask = 0u64;
        while mask.count_ones() < bits {
            mask |= 1 << rng.random_range(0..64);
        }
        hash ^ mask
    }

    /// A catalog of random photos (some small, some sharing bytes, most hashed near one of a
    /// few bases, some deleted) with a chain 1–2–3 whose ends are not near each other, and
    /// random semantic pairs (some of deleted or unknown photos, some under the threshold, many
    /// tied); the deleted ids.
    fn random_catalog(seed: u64) -> (SqliteCatalog, Vec<SemanticPair>, Vec<PhotoId>) {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        let c = SqliteCatalog::in_memory().unwrap();
        let settings = DuplicateSettings::default();
        let bases: Vec<u64> = (0..30).map(|_| rng.random()).collect();
        let mut hashes = Vec::new();
        for id in 1..=PHOTOS {
            let mut p = photo(id, None);
            let small = id > 3 && rng.random_bool(0.2);
            p.meta.width = if small { 28 } else { rng.random_range(64..200) };
            p.meta.height = if small { 28 } else { rng.random_range(64..200) };
            p.meta.bytes = rng.random_range(1..5);
            p.meta.created_ms = rng.random_range(1..5);
            if id > 3 && rng.random_bool(0.15) {
                p.meta.sha256 = format!("{:064x}", rng.random_range(0..20));
            }
            c.upsert_photo(&p).unwrap();
            if id > 3 && rng.random_bool(0.85) {
                let base = bases[rng.random_range(0..bases.len())];
                let bits = rng.random_range(0..10);
                hashes.push((id, flip(&mut rng, base, bits)));
            }
        }
        let one: u64 = rng.random();
        let two = flip(&mut rng, one, 7);
        let mut three = flip(&mut rng, two, 7);
        while (one ^ three).count_ones() <= settings.near_hamming {
            three = flip(&mut rng, two, 7);
        }
        hashes.extend([(1, one), (2, two), (3, three)]);
        c.put_near_hashes(settings.near_hash.name(), &hashes)
            .unwrap();
        let deleted: Vec<PhotoId> = (0..10).map(|_| rng.random_range(4..=PHOTOS)).collect();
        for &id in &deleted {
            c.delete_photo(id).unwrap();
        }
        let semantic = (0..150)
            .map(|_| SemanticPair {
                a: rng.random_range(1..=PHOTOS + 20),
                b: rng.random_range(1..=PHOTOS + 20),
                cosine: [0.5, 0.85, 0.9, 0.95][rng.random_range(0..4)],
            })
            .collect();
        (c, semantic, deleted)
    }

    #[test]
    fn a_photos_group_is_the_group_find_reports_for_it() {
        let settings = DuplicateSettings::default();
        for seed in [1, 2, 3, 4] {
            let (c, semantic, deleted) = random_catalog(seed);
            for levels in [
                vec![Level::Exact],
                vec![Level::Near],
                vec![Level::Exact, Level::Near],
                Level::ALL.to_vec(),
            ] {
                let levels: BTreeSet<Level> = levels.into_iter().collect();
                let all = find(&c, &settings, &levels, &semantic, None)
                    .unwrap()
                    .groups;
                assert!(
                    all.iter().any(|g| g.members.len() >= 3),
                    "seed {seed}, {levels:?}: groups of more than a pair"
                );
                for id in (1..=PHOTOS).filter(|id| !deleted.contains(id)) {
                    let expected = all.iter().find(|g| g.members.iter().any(|m| m.id == id));
                    let found = group_of(&c, &settings, &levels, &semantic, id).unwrap();
                    assert_eq!(
                        found.as_ref(),
                        expected,
                        "seed {seed}, {levels:?}, photo {id}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_chain_links_its_ends_and_an_unknown_photo_is_not_found() {
        let settings = DuplicateSettings::default();
        let (c, semantic, deleted) = random_catalog(9);
        let near = BTreeSet::from([Level::Near]);
        let group = group_of(&c, &settings, &near, &semantic, 3)
            .unwrap()
            .expect("3 is near 2");
        let ids: Vec<PhotoId> = group.members.iter().map(|m| m.id).collect();
        assert_eq!(ids, [1, 2, 3], "1 reaches 3 through 2 alone");
        let three = group.members.iter().find(|m| m.id == 3).unwrap();
        assert_eq!(three.linked_to, 2, "3 is not near 1");
        for id in [deleted[0], PHOTOS + 1] {
            let gone = group_of(&c, &settings, &near, &semantic, id);
            assert!(
                matches!(gone, Err(CatalogError::NotFound { .. })),
                "photo {id}: {gone:?}"
            );
        }
    }
}
