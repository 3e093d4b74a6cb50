//! Pairs of duplicate photos into groups (union-find): each member with the strongest reason
//! that links it to another member, and the photo the group suggests keeping.

use std::collections::{BTreeMap, HashMap};

use ndpipe_catalog::{PhotoId, PhotoMeta};
use petgraph::unionfind::UnionFind;
use serde::{Deserialize, Serialize};

/// Why two photos are duplicates, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    /// The same bytes (the same SHA-256).
    Exact,
    /// Perceptual hashes within the Hamming threshold: a resized, recompressed or slightly
    /// cropped copy.
    Near,
    /// Features whose cosine similarity reaches the threshold: the same scene or object.
    Semantic,
}

impl Level {
    /// Every level, strongest first.
    pub(crate) const ALL: [Level; 3] = [Level::Exact, Level::Near, Level::Semantic];

    /// The level's name in the API.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Exact => "exact",
            Level::Near => "near",
            Level::Semantic => "semantic",
        }
    }
}

impl std::str::FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Level::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| format!("a level is exact, near or semantic, not {s:?}"))
    }
}

/// Two photos found to be duplicates at `level`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pair {
    /// One photo.
    pub(crate) a: PhotoId,
    /// The other.
    pub(crate) b: PhotoId,
    /// Why.
    pub(crate) level: Level,
    /// How strongly, higher is closer: 1 for exact, `1 - distance / 64` for near, the cosine
    /// similarity for semantic.
    pub(crate) score: f64,
}

impl Pair {
    /// Whether this pair is a stronger reason than `other`: a stronger level, then a higher
    /// score.
    fn beats(&self, other: &Pair) -> bool {
        (self.level, -self.score) < (other.level, -other.score)
    }
}

/// A member of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Member {
    /// The photo.
    pub(crate) id: PhotoId,
    /// The strongest reason linking it to another member.
    pub(crate) reason: Level,
    /// That reason's score.
    pub(crate) score: f64,
    /// The member it links to by that reason.
    pub(crate) linked_to: PhotoId,
    /// Width x height of the original.
    pub(crate) pixels: u64,
    /// Bytes of the original.
    pub(crate) bytes: u64,
    /// Upload time, ms since the Unix epoch.
    pub(crate) created_ms: i64,
}

/// Photos linked by duplicate pairs, directly or through each other.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Group {
    /// The group's id: its lowest photo id (groups are paged by it).
    pub(crate) id: PhotoId,
    /// The photo to keep: the largest (pixels, then bytes), then the oldest.
    pub(crate) keeper: PhotoId,
    /// Every member, in id order.
    pub(crate) members: Vec<Member>,
}

/// Groups `pairs` (photos without metadata in `meta`, i.e. gone, are left out), in id order.
pub(crate) fn group(pairs: &[Pair], meta: &HashMap<PhotoId, PhotoMeta>) -> Vec<Group> {
    let pairs: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.a != p.b && meta.contains_key(&p.a) && meta.contains_key(&p.b))
        .collect();
    let mut index: BTreeMap<PhotoId, usize> = BTreeMap::new();
    for p in &pairs {
        for id in [p.a, p.b] {
            let next = index.len();
            index.entry(id).or_insert(next);
        }
    }
    let mut sets = UnionFind::<usize>::new(index.len());
    let mut strongest: HashMap<PhotoId, (&Pair, PhotoId)> = HashMap::new();
    for p in &pairs {
        sets.union(index[&p.a], index[&p.b]);
        for (id, other) in [(p.a, p.b), (p.b, p.a)] {
            match strongest.get(&id) {
                Some((best, _)) if !p.beats(best) => {}
                _ => {
                    strongest.insert(id, (p, other));
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<Member>> = BTreeMap::new();
    for (&id, &i) in &index {
        let (pair, linked_to) = strongest[&id];
        let m = &meta[&id];
        groups.entry(sets.find(i)).or_default().push(Member {
            id,
            reason: pair.level,
            score: pair.score,
            linked_to,
            pixels: u64::from(m.width) * u64::from(m.height),
            bytes: m.bytes,
            created_ms: m.created_ms,
        });
    }
    let mut out: Vec<Group> = groups.into_values().map(finish).collect();
    out.sort_by_key(|g| g.id);
    out
}

/// A group of `members` (in id order, as `index` iterates) with its keeper.
fn finish(members: Vec<Member>) -> Group {
    let keeper = members
        .iter()
        .min_by_key(|m| {
            (
                std::cmp::Reverse(m.pixels),
                std::cmp::Reverse(m.bytes),
                m.created_ms,
                m.id,
            )
        })
        .map_or(0, |m| m.id);
    Group {
        id: members.first().map_or(0, |m| m.id),
        keeper,
        members,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(width: u32, bytes: u64, created_ms: i64) -> PhotoMeta {
        PhotoMeta {
            sha256: String::new(),
            bytes,
            width,
            height: 100,
            content_type: "image/jpeg".into(),
            created_ms,
            ground_truth: None,
        }
    }

    fn pair(a: PhotoId, b: PhotoId, level: Level, score: f64) -> Pair {
        Pair { a, b, level, score }
    }

    #[test]
    fn pairs_chain_into_groups_with_the_strongest_reason_of_each_member() {
        let meta = HashMap::from([
            (1, meta(100, 500, 10)),
            (2, meta(100, 500, 5)),
            (3, meta(50, 900, 1)),
            (7, meta(10, 10, 1)),
            (8, meta(10, 10, 1)),
        ]);
        let pairs = [
            pair(3, 2, Level::Near, 0.9),
            pair(1, 2, Level::Exact, 1.0),
            pair(3, 1, Level::Semantic, 0.95),
            pair(3, 2, Level::Near, 0.95),
            pair(7, 8, Level::Semantic, 0.9),
            pair(8, 9, Level::Exact, 1.0),
        ];
        let groups = group(&pairs, &meta);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        let g = &groups[0];
        assert_eq!(g.id, 1);
        let reasons: Vec<(PhotoId, Level, f64, PhotoId)> = g
            .members
            .iter()
            .map(|m| (m.id, m.reason, m.score, m.linked_to))
            .collect();
        assert_eq!(
            reasons,
            [
                (1, Level::Exact, 1.0, 2),
                (2, Level::Exact, 1.0, 1),
                (3, Level::Near, 0.95, 2)
            ]
        );
        assert_eq!(
            g.keeper, 2,
            "largest (1 and 2 tie on pixels and bytes), then oldest"
        );
        assert_eq!(
            groups[1].members.iter().map(|m| m.id).collect::<Vec<_>>(),
            [7, 8],
            "photo 9 has no metadata (it is gone): left out"
        );
        assert_eq!(groups[1].keeper, 7, "a full tie keeps the lower id");
    }

    #[test]
    fn levels_parse_and_order_strongest_first() {
        assert!(Level::Exact < Level::Near && Level::Near < Level::Semantic);
        assert_eq!("near".parse(), Ok(Level::Near));
        assert!("similar".parse::<Level>().is_err());
    }
}
