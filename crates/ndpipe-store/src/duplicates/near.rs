//! Pairs of 64-bit hashes within a Hamming distance, by multi-index hashing (Norouzi, Punjani
//! and Fleet, "Fast Search in Hamming Space with Multi-Index Hashing", CVPR 2012) rather than
//! comparing every pair.
//!
//! The 64 bits are cut into [`CHUNKS`] chunks of 16 bits. Two hashes within distance `t` differ
//! in at most `t / CHUNKS` bits in at least one chunk (pigeonhole), so each hash looks up, in
//! each chunk's table, only the chunk values within that radius of its own, and checks the
//! whole distance of those candidates alone. A pair is reported from the first chunk that
//! finds it, so once. No crate does this for plain `u64`s: BK-tree crates visit most of the
//! tree at the radii near duplicates need.

use ndpipe_catalog::PhotoId;

/// Chunks each hash is cut into; 16 bits each suits 10^4 to 10^6 hashes (about one hash per
/// chunk value at 65 536 values).
const CHUNKS: u32 = 4;
/// Bits of a chunk.
const CHUNK_BITS: u32 = 64 / CHUNKS;

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

/// Chunk `c` of `hash`.
fn chunk(hash: u64, c: u32) -> u16 {
    (hash >> (c * CHUNK_BITS)) as u16
}

/// Every 16-bit mask with at most `radius` bits set.
fn masks(radius: u32) -> Vec<u16> {
    (0..=u16::MAX)
        .filter(|m| m.count_ones() <= radius)
        .collect()
}

/// The hashes' indices by the value of one chunk: the indices whose chunk is `v` are
/// `order[starts[v]..starts[v + 1]]`, in ascending order (a counting sort: two array reads a
/// lookup, where a hash map would hash every probe).
struct ChunkTable {
    starts: Vec<u32>,
    order: Vec<u32>,
}

impl ChunkTable {
    /// The table of chunk `c` of `hashes`.
    fn new(hashes: &[(PhotoId, u64)], c: u32) -> Self {
        let mut starts = vec![0u32; (1 << CHUNK_BITS) + 1];
        for (_, hash) in hashes {
            starts[usize::from(chunk(*hash, c)) + 1] += 1;
        }
        for v in 1..starts.len() {
            starts[v] += starts[v - 1];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; hashes.len()];
        for (i, (_, hash)) in hashes.iter().enumerate() {
            let slot = &mut next[usize::from(chunk(*hash, c))];
            order[*slot as usize] = i as u32;
            *slot += 1;
        }
        ChunkTable { starts, order }
    }

    /// The indices whose chunk is `v`.
    fn bucket(&self, v: u16) -> &[u32] {
        let v = usize::from(v);
        &self.order[self.starts[v] as usize..self.starts[v + 1] as usize]
    }
}

/// Every pair of `hashes` (id, hash) whose hashes differ in at most `max_distance` bits, each
/// once, in (a, b) order. Equal ids are not paired with each other; at most 2^32 hashes.
pub fn near_pairs(hashes: &[(PhotoId, u64)], max_distance: u32) -> Vec<NearPair> {
    let radius = max_distance / CHUNKS;
    let probes = masks(radius);
    let tables: Vec<ChunkTable> = (0..CHUNKS).map(|c| ChunkTable::new(hashes, c)).collect();
    let found_in_earlier_chunk = |x: u64, y: u64, c: u32| {
        (0..c).any(|earlier| (chunk(x, earlier) ^ chunk(y, earlier)).count_ones() <= radius)
    };
    let mut pairs = Vec::new();
    for (i, &(id, hash)) in hashes.iter().enumerate() {
        for (c, table) in (0..CHUNKS).zip(&tables) {
            let own = chunk(hash, c);
            for mask in &probes {
                for &j in table.bucket(own ^ mask) {
                    let j = j as usize;
                    if j <= i {
                        continue;
                    }
                    let (other, other_hash) = hashes[j];
                    let distance = (hash ^ other_hash).count_ones();
                    if distance <= max_distance
                        && other != id
                        && !found_in_earlier_chunk(hash, other_hash, c)
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
    pairs.sort_unstable();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every pair by comparing all of them: the reference.
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
        pairs.sort_unstable();
        pairs
    }

    #[test]
    fn finds_exactly_the_pairs_a_full_scan_finds() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
        let mut hashes: Vec<(PhotoId, u64)> = (0..400).map(|id| (id, rng.random())).collect();
        // Copies a few bits away from some hashes, at every distance up to 20.
        for id in 0..200u64 {
            let base = hashes[id as usize].1;
            let mut flipped = base;
            for _ in 0..(id % 21) {
                flipped ^= 1 << rng.random_range(0..64);
            }
            hashes.push((1000 + id, flipped));
        }
        for t in [0, 3, 4, 7, 10, 12, 20] {
            assert_eq!(near_pairs(&hashes, t), scan(&hashes, t), "threshold {t}");
        }
    }

    #[test]
    fn identical_hashes_pair_once() {
        let hashes = [(1, 5), (2, 5), (3, 5)];
        let pairs = near_pairs(&hashes, 0);
        let ids: Vec<(u64, u64)> = pairs.iter().map(|p| (p.a, p.b)).collect();
        assert_eq!(ids, [(1, 2), (1, 3), (2, 3)]);
        assert!(near_pairs(&[], 4).is_empty());
    }
}
