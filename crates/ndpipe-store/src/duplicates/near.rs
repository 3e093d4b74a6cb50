//! Pairs of 64-bit hashes within a Hamming distance, by multi-index hashing (Norouzi, Punjani
//! and Fleet, "Fast Search in Hamming Space with Multi-Index Hashing", CVPR 2012), or by
//! comparing every pair where that is cheaper.
//!
//! The 64 bits are cut into `m` chunks. Two hashes within distance `t` differ in at most
//! `t / m` bits in at least one chunk (pigeonhole), so each hash looks up, in each chunk's
//! table, only the chunk values within that radius of its own, and checks the whole distance
//! of those candidates alone. A pair is reported from the first chunk that finds it, so once.
//! More chunks mean fewer probes (a smaller radius) but fuller buckets; [`Layout::choose`]
//! weighs both for the number of hashes and the threshold, against a full scan. No crate does
//! this for plain `u64`s: BK-tree crates visit most of the tree at the radii near duplicates
//! need.

use ndpipe_catalog::PhotoId;

/// Fewest chunks: at most 16 bits each, so a table has at most 65 536 buckets.
const MIN_CHUNKS: u32 = 4;
/// Most chunks: at least 4 bits each.
const MAX_CHUNKS: u32 = 16;
/// Relative cost of one probe of a bucket (cache misses on the bucket bounds), of checking one
/// candidate found in a bucket (read in order), and of comparing one pair in a full scan.
const PROBE_COST: f64 = 3.0;
/// See [`PROBE_COST`].
const CANDIDATE_COST: f64 = 1.0;
/// See [`PROBE_COST`].
const SCAN_COST: f64 = 0.5;

/// Two photos whose hashes are `distance` bits apart (`a < b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NearPair {
    /// The photo with the lower id.
    pub a: PhotoId,
    /// The other photo.
    pub b: PhotoId,
    /// Bits in which their hashes differ.
    pub distance: u32,
}

/// How the 64 bits are cut into chunks, and the radius searched in each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    /// Each chunk's (shift, width); the widths differ by one at most.
    chunks: Vec<(u32, u32)>,
    /// Bits a chunk of a pair within the threshold may differ in, in at least one chunk.
    radius: u32,
}

impl Layout {
    /// `m` chunks for threshold `t`.
    fn new(m: u32, t: u32) -> Self {
        let (base, wider) = (64 / m, 64 % m);
        let mut shift = 0;
        let chunks = (0..m)
            .map(|c| {
                let width = base + u32::from(c < wider);
                let chunk = (shift, width);
                shift += width;
                chunk
            })
            .collect();
        Layout {
            chunks,
            radius: t / m,
        }
    }

    /// The layout of least estimated cost for `n` hashes and threshold `t`, or `None` when
    /// comparing every pair is estimated cheaper.
    fn choose(n: usize, t: u32) -> Option<Self> {
        let (cost, layout) = Self::cheapest(n, t);
        (cost < n as f64 / 2.0 * SCAN_COST).then_some(layout)
    }

    /// The layout of least estimated cost per hash looked up among `n` hashes for threshold
    /// `t`, with that cost.
    pub(super) fn cheapest(n: usize, t: u32) -> (f64, Self) {
        let n = n as f64;
        (MIN_CHUNKS..=MAX_CHUNKS)
            .map(|m| {
                let layout = Layout::new(m, t);
                let cost: f64 = layout
                    .chunks
                    .iter()
                    .map(|&(_, width)| {
                        let probes = probes(width, layout.radius) as f64;
                        probes * (PROBE_COST + n / f64::from(1u32 << width) * CANDIDATE_COST)
                    })
                    .sum();
                (cost, layout)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("MIN_CHUNKS..=MAX_CHUNKS is not empty")
    }

    /// Chunks of the layout.
    pub(super) fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Bits a chunk of each chunk's table is searched within.
    pub(super) fn radius(&self) -> u32 {
        self.radius
    }

    /// Width in bits of chunk `c`.
    pub(super) fn width(&self, c: usize) -> u32 {
        self.chunks[c].1
    }

    /// Whether `x` and `y` are within the radius in a chunk before `c`: the pair was found
    /// from an earlier chunk.
    pub(super) fn found_before(&self, x: u64, y: u64, c: usize) -> bool {
        (0..c).any(|earlier| {
            (self.chunk(x, earlier) ^ self.chunk(y, earlier)).count_ones() <= self.radius
        })
    }

    /// Chunk `c` of `hash`.
    pub(super) fn chunk(&self, hash: u64, c: usize) -> u32 {
        let (shift, width) = self.chunks[c];
        ((hash >> shift) & ((1 << width) - 1)) as u32
    }
}

/// Chunk values within `radius` bits of 0 in a chunk of `width` bits.
fn probes(width: u32, radius: u32) -> usize {
    (0..=radius.min(width)).map(|k| binomial(width, k)).sum()
}

/// `n` choose `k`.
fn binomial(n: u32, k: u32) -> usize {
    (0..k).fold(1, |acc, i| acc * (n - i) as usize / (i + 1) as usize)
}

/// Every mask of `width` bits with at most `radius` bits set.
pub(super) fn masks(width: u32, radius: u32) -> Vec<u32> {
    (0..1u32 << width)
        .filter(|m| m.count_ones() <= radius)
        .collect()
}

/// The hashes by the value of one chunk: those whose chunk is `v` are
/// `entries[starts[v]..starts[v + 1]]` (index, hash), in ascending index order (a counting
/// sort: two array reads a lookup, and a bucket's hashes read in order).
struct ChunkTable {
    starts: Vec<u32>,
    entries: Vec<(u32, u64)>,
}

impl ChunkTable {
    /// The table of chunk `c` of `hashes`.
    fn new(hashes: &[(PhotoId, u64)], layout: &Layout, c: usize) -> Self {
        let mut starts = vec![0u32; (1 << layout.chunks[c].1) + 1];
        for (_, hash) in hashes {
            starts[layout.chunk(*hash, c) as usize + 1] += 1;
        }
        for v in 1..starts.len() {
            starts[v] += starts[v - 1];
        }
        let mut next = starts.clone();
        let mut entries = vec![(0u32, 0u64); hashes.len()];
        for (i, (_, hash)) in hashes.iter().enumerate() {
            let slot = &mut next[layout.chunk(*hash, c) as usize];
            entries[*slot as usize] = (i as u32, *hash);
            *slot += 1;
        }
        ChunkTable { starts, entries }
    }

    /// The entries whose chunk is `v`.
    fn bucket(&self, v: u32) -> &[(u32, u64)] {
        let v = v as usize;
        &self.entries[self.starts[v] as usize..self.starts[v + 1] as usize]
    }
}

/// Every pair of `hashes` (id, hash) whose hashes differ in at most `max_distance` bits, each
/// once, in (a, b) order. Equal ids are not paired with each other; at most 2^32 hashes.
pub fn near_pairs(hashes: &[(PhotoId, u64)], max_distance: u32) -> Vec<NearPair> {
    let mut pairs = match Layout::choose(hashes.len(), max_distance) {
        Some(layout) => multi_index(hashes, max_distance, &layout),
        None => scan(hashes, max_distance),
    };
    pairs.sort_unstable();
    pairs
}

/// The pairs within `max_distance` by multi-index hashing over `layout`, unordered.
fn multi_index(hashes: &[(PhotoId, u64)], max_distance: u32, layout: &Layout) -> Vec<NearPair> {
    let radius = layout.radius;
    let chunks = layout.chunks.len();
    let tables: Vec<ChunkTable> = (0..chunks)
        .map(|c| ChunkTable::new(hashes, layout, c))
        .collect();
    let probes: Vec<Vec<u32>> = layout
        .chunks
        .iter()
        .map(|&(_, w)| masks(w, radius))
        .collect();
    let mut pairs = Vec::new();
    for (i, &(id, hash)) in hashes.iter().enumerate() {
        for (c, table) in tables.iter().enumerate() {
            let own = layout.chunk(hash, c);
            for mask in &probes[c] {
                for &(j, other_hash) in table.bucket(own ^ mask) {
                    let j = j as usize;
                    if j <= i {
                        continue;
                    }
                    let distance = (hash ^ other_hash).count_ones();
                    let other = hashes[j].0;
                    if distance <= max_distance
                        && other != id
                        && !layout.found_before(hash, other_hash, c)
                    {
                        pairs.push(NearPair {
                            a: id.min(other),
                            b: id.max(other),
                            distance,
                        });
                    }
                }
            }
        }
    }
    pairs
}

/// The pairs within `max_distance` by comparing every pair, unordered.
fn scan(hashes: &[(PhotoId, u64)], max_distance: u32) -> Vec<NearPair> {
    let mut pairs = Vec::new();
    for (i, &(a, x)) in hashes.iter().enumerate() {
        for &(b, y) in &hashes[i + 1..] {
            let distance = (x ^ y).count_ones();
            if distance <= max_distance && a != b {
                pairs.push(NearPair {
                    a: a.min(b),
                    b: a.max(b),
                    distance,
                });
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// 400 random hashes and 200 copies a few bits away from some, at every distance up to 20.
    fn hashes() -> Vec<(PhotoId, u64)> {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
        let mut hashes: Vec<(PhotoId, u64)> = (0..400).map(|id| (id, rng.random())).collect();
        for id in 0..200u64 {
            let mut flipped = hashes[id as usize].1;
            for _ in 0..(id % 21) {
                flipped ^= 1 << rng.random_range(0..64);
            }
            hashes.push((1000 + id, flipped));
        }
        hashes
    }

    /// `pairs` sorted, as [`near_pairs`] gives them.
    fn sorted(mut pairs: Vec<NearPair>) -> Vec<NearPair> {
        pairs.sort_unstable();
        pairs
    }

    #[test]
    fn every_layout_finds_exactly_the_pairs_a_full_scan_finds() {
        let hashes = hashes();
        for t in [0, 3, 4, 7, 10, 12, 20] {
            let expected = sorted(scan(&hashes, t));
            assert!(!expected.is_empty(), "threshold {t}");
            for m in MIN_CHUNKS..=MAX_CHUNKS {
                let found = sorted(multi_index(&hashes, t, &Layout::new(m, t)));
                assert_eq!(found, expected, "threshold {t}, {m} chunks");
            }
            assert_eq!(near_pairs(&hashes, t), expected, "threshold {t}");
        }
    }

    #[test]
    fn layouts_cover_the_64_bits_and_the_choice_follows_the_count() {
        for m in MIN_CHUNKS..=MAX_CHUNKS {
            let layout = Layout::new(m, 12);
            let widths: Vec<u32> = layout.chunks.iter().map(|c| c.1).collect();
            assert_eq!(widths.iter().sum::<u32>(), 64, "{m} chunks");
            assert!(widths.iter().max().unwrap() - widths.iter().min().unwrap() <= 1);
            assert_eq!(layout.chunks.last().map(|(s, w)| s + w), Some(64));
        }
        assert_eq!(Layout::choose(100, 12), None, "a few hashes: a full scan");
        let big = Layout::choose(1_000_000, 12).expect("10^6 hashes: multi-index hashing");
        assert!(
            big.chunks.len() as u32 * (big.radius + 1) > 12,
            "the pigeonhole holds"
        );
        assert_eq!((binomial(16, 3), probes(16, 3)), (560, 697));
    }

    #[test]
    fn identical_hashes_pair_once() {
        let hashes = [(1, 5), (2, 5), (3, 5)];
        let pairs = near_pairs(&hashes, 0);
        let ids: Vec<(u64, u64)> = pairs.iter().map(|p| (p.a, p.b)).collect();
        assert_eq!(ids, [(1, 2), (1, 3), (2, 3)]);
        assert!(near_pairs(&[], 4).is_empty());
        let layout = Layout::new(MIN_CHUNKS, 0);
        assert_eq!(sorted(multi_index(&hashes, 0, &layout)), pairs);
    }
}
