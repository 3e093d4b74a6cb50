//! The near level's pairs kept between requests: a multi-index of the catalog's hashes (the
//! [`Layout`] of [`super::near`], with tables that take inserts and removals) and each photo's
//! neighbours within the threshold.
//!
//! Each request still reads the catalog's hashes (so every node's hashes on a shared catalog,
//! deletes and re-hashes are seen, whoever wrote them), compares them with the hashes indexed
//! at the last request (one merge walk over two id-ordered lists), and looks up neighbours for
//! the new or changed hashes alone: pairing 10^5 hashes on every request cost seconds, while a
//! few new hashes cost microseconds each. The pairs are those [`near_pairs`] gives for the same
//! hashes (a randomized test holds the two equal).

use std::collections::HashMap;
use std::sync::Mutex;

use ndpipe_catalog::PhotoId;
use ndpipe_util::sync::lock;

use super::near::{Layout, NearPair, masks, near_pairs};

/// The fewest hashes a layout is chosen for, so that a store's first photos do not fix a
/// layout fit for a handful.
const MIN_SIZED_FOR: usize = 1 << 12;

/// The near pairs of the hashes seen at the last request, kept up to date by each request
/// (one per front door; requests take turns).
#[derive(Default)]
pub(crate) struct NearIndex {
    index: Mutex<Option<Index>>,
}

impl NearIndex {
    /// The pairs of `hashes` (id, hash; id order, as the catalog gives them) within
    /// `threshold`, as [`near_pairs`] gives them, after bringing the index to `hashes`.
    pub(crate) fn pairs(&self, hashes: &[(PhotoId, u64)], threshold: u32) -> Vec<NearPair> {
        let mut sorted;
        let hashes = if hashes.is_sorted() {
            hashes
        } else {
            sorted = hashes.to_vec();
            sorted.sort_unstable();
            &sorted
        };
        let mut index = lock(&self.index);
        match &mut *index {
            Some(kept) if kept.threshold == threshold && hashes.len() <= 2 * kept.sized_for => {
                kept.update(hashes);
            }
            _ => *index = Some(Index::build(hashes, threshold)),
        }
        index.as_ref().map_or_else(Vec::new, Index::pairs)
    }
}

/// The index of one set of hashes at one threshold.
struct Index {
    threshold: u32,
    /// The hash count the layout was chosen for; past twice that the index is built anew.
    sized_for: usize,
    layout: Layout,
    /// Each chunk's probe masks.
    masks: Vec<Vec<u32>>,
    /// Each chunk's table: per chunk value, the (id, hash) whose chunk it is.
    tables: Vec<Vec<Vec<(PhotoId, u64)>>>,
    /// The hashes indexed, in id order.
    hashes: Vec<(PhotoId, u64)>,
    /// Each photo's neighbours within the threshold, with their distance (photos that have
    /// some).
    neighbours: HashMap<PhotoId, Vec<(PhotoId, u32)>>,
}

impl Index {
    /// The index of `hashes` (id order, ids distinct), paired in one batch.
    fn build(hashes: &[(PhotoId, u64)], threshold: u32) -> Self {
        let sized_for = hashes.len().max(MIN_SIZED_FOR);
        let (_, layout) = Layout::cheapest(sized_for, threshold);
        let masks = (0..layout.len())
            .map(|c| masks(layout.width(c), layout.radius()))
            .collect();
        let tables = (0..layout.len())
            .map(|c| vec![Vec::new(); 1 << layout.width(c)])
            .collect();
        let mut index = Index {
            threshold,
            sized_for,
            layout,
            masks,
            tables,
            hashes: hashes.to_vec(),
            neighbours: HashMap::new(),
        };
        for &(id, hash) in hashes {
            index.add_to_tables(id, hash);
        }
        for p in near_pairs(hashes, threshold) {
            index.link(p.a, p.b, p.distance);
        }
        index
    }

    /// Brings the index to `hashes` (id order, ids distinct): removes the photos gone or
    /// re-hashed, then adds the new hashes with their neighbours.
    fn update(&mut self, hashes: &[(PhotoId, u64)]) {
        let (mut gone, mut new) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        while i < self.hashes.len() || j < hashes.len() {
            match (self.hashes.get(i), hashes.get(j)) {
                (Some(&old), Some(&now)) if old.0 == now.0 => {
                    if old.1 != now.1 {
                        gone.push(old);
                        new.push(now);
                    }
                    i += 1;
                    j += 1;
                }
                (Some(&old), Some(&now)) if old.0 < now.0 => {
                    gone.push(old);
                    i += 1;
                }
                (Some(&old), None) => {
                    gone.push(old);
                    i += 1;
                }
                (_, Some(&now)) => {
                    new.push(now);
                    j += 1;
                }
                (None, None) => unreachable!("the loop runs while either list has more"),
            }
        }
        if gone.is_empty() && new.is_empty() {
            return;
        }
        for (id, hash) in gone {
            self.remove(id, hash);
        }
        for (id, hash) in new {
            self.insert(id, hash);
        }
        self.hashes = hashes.to_vec();
    }

    /// Adds `id` to each chunk's table.
    fn add_to_tables(&mut self, id: PhotoId, hash: u64) {
        for c in 0..self.layout.len() {
            let v = self.layout.chunk(hash, c) as usize;
            self.tables[c][v].push((id, hash));
        }
    }

    /// Adds photo `id` with `hash`, linked to each indexed hash within the threshold.
    fn insert(&mut self, id: PhotoId, hash: u64) {
        let mut found = Vec::new();
        for (c, table) in self.tables.iter().enumerate() {
            let own = self.layout.chunk(hash, c);
            for mask in &self.masks[c] {
                for &(other, other_hash) in &table[(own ^ mask) as usize] {
                    let distance = (hash ^ other_hash).count_ones();
                    if distance <= self.threshold
                        && other != id
                        && !self.layout.found_before(hash, other_hash, c)
                    {
                        found.push((other, distance));
                    }
                }
            }
        }
        for (other, distance) in found {
            self.link(id, other, distance);
        }
        self.add_to_tables(id, hash);
    }

    /// Removes photo `id`, indexed with `hash`, and its links.
    fn remove(&mut self, id: PhotoId, hash: u64) {
        for c in 0..self.layout.len() {
            let bucket = &mut self.tables[c][self.layout.chunk(hash, c) as usize];
            if let Some(at) = bucket.iter().position(|&(x, _)| x == id) {
                bucket.swap_remove(at);
            }
        }
        for (other, _) in self.neighbours.remove(&id).unwrap_or_default() {
            if let Some(theirs) = self.neighbours.get_mut(&other) {
                theirs.retain(|&(x, _)| x != id);
                if theirs.is_empty() {
                    self.neighbours.remove(&other);
                }
            }
        }
    }

    /// Records that `a` and `b` are `distance` bits apart.
    fn link(&mut self, a: PhotoId, b: PhotoId, distance: u32) {
        self.neighbours.entry(a).or_default().push((b, distance));
        self.neighbours.entry(b).or_default().push((a, distance));
    }

    /// Every pair, each once, in (a, b) order.
    fn pairs(&self) -> Vec<NearPair> {
        let mut pairs: Vec<NearPair> = self
            .neighbours
            .iter()
            .flat_map(|(&a, linked)| {
                linked
                    .iter()
                    .filter(move |&&(b, _)| a < b)
                    .map(move |&(b, distance)| NearPair { a, b, distance })
            })
            .collect();
        pairs.sort_unstable();
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A hash near one of `bases` (a few bits flipped) or a random one.
    fn hash(rng: &mut impl Rng, bases: &[u64]) -> u64 {
        if rng.random_bool(0.2) {
            return rng.random();
        }
        let mut h = bases[rng.random_range(0..bases.len())];
        for _ in 0..rng.random_range(0..16) {
            h ^= 1 << rng.random_range(0..64);
        }
        h
    }

    #[test]
    fn the_kept_pairs_are_those_of_a_fresh_pairing_through_adds_deletes_and_rehashes() {
        for seed in 0..6 {
            let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
            let bases: Vec<u64> = (0..8).map(|_| rng.random()).collect();
            let index = NearIndex::default();
            let mut hashes: Vec<(PhotoId, u64)> = Vec::new();
            let mut next_id = 1;
            let mut linked = 0;
            for round in 0..40 {
                let threshold = if round < 30 { 12 } else { 8 };
                for _ in 0..rng.random_range(0..60) {
                    hashes.push((next_id, hash(&mut rng, &bases)));
                    next_id += rng.random_range(1..3);
                }
                for _ in 0..rng.random_range(0..8) {
                    if !hashes.is_empty() {
                        let at = rng.random_range(0..hashes.len());
                        if rng.random_bool(0.5) {
                            hashes.remove(at);
                        } else {
                            hashes[at].1 = hash(&mut rng, &bases);
                        }
                    }
                }
                let expected = near_pairs(&hashes, threshold);
                linked += expected.len();
                assert_eq!(
                    index.pairs(&hashes, threshold),
                    expected,
                    "seed {seed}, round {round}"
                );
            }
            assert!(linked > 1000, "seed {seed}: {linked} pairs checked");
        }
    }

    #[test]
    fn unordered_hashes_and_growth_past_the_layout_give_the_same_pairs() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
        let bases: Vec<u64> = (0..2000).map(|_| rng.random()).collect();
        let index = NearIndex::default();
        let mut hashes: Vec<(PhotoId, u64)> = Vec::new();
        for step in 0..3 {
            let from = hashes.len() as u64;
            hashes.extend((from..from + 5000).map(|id| (id, hash(&mut rng, &bases))));
            let mut shuffled = hashes.clone();
            shuffled.reverse();
            let expected = near_pairs(&hashes, 10);
            assert!(
                expected.len() > 100,
                "step {step}: {} pairs",
                expected.len()
            );
            assert_eq!(index.pairs(&shuffled, 10), expected, "step {step}");
        }
        assert!(index.pairs(&[], 10).is_empty());
    }
}
