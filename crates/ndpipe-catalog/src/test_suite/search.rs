//! The search part of the shared suite: which labels a query finds, in which order and pages,
//! and that the index follows every write of a photo's labels.

use super::photo;
use crate::{Catalog, PhotoCatalog, Prediction};

fn p(label: &str, score: f32) -> Prediction {
    Prediction {
        label: label.into(),
        score,
    }
}

/// Runs every search check; each uses photo ids and model versions of its own.
pub(super) fn run(c: &dyn Catalog) {
    search_matches_class_names(c);
    search_treats_wildcards_literally(c);
    search_matches_whole_words_only(c);
    search_pages_in_score_order(c);
    relabelling_moves_a_photo_between_labels(c);
    a_deleted_photo_leaves_search(c);
}

/// Stores each photo with the one prediction `(label, score)` under `version`.
fn store(c: &dyn Catalog, version: &str, photos: &[(u64, &str, f32)]) {
    for &(id, label, score) in photos {
        c.upsert_photo(&photo(id, None)).unwrap();
        c.put_predictions(id, version, &[p(label, score)]).unwrap();
    }
}

fn ids(c: &dyn Catalog, label: &str, version: &str, offset: usize, limit: usize) -> Vec<u64> {
    c.search(label, version, offset, limit)
        .unwrap()
        .iter()
        .map(|h| h.id)
        .collect()
}

fn search_matches_class_names(c: &dyn Catalog) {
    c.upsert_photo(&photo(10, None)).unwrap();
    c.upsert_photo(&photo(11, None)).unwrap();
    c.put_predictions(10, "m", &[p("tabby, tabby cat", 0.4), p("tiger cat", 0.3)])
        .unwrap();
    c.put_predictions(
        11,
        "m",
        &[p("Egyptian cat", 0.5), p("tabby, tabby cat", 0.45)],
    )
    .unwrap();
    c.put_predictions(11, "other", &[p("tabby, tabby cat", 0.99)])
        .unwrap();
    let hits = c.search("tabby", "m", 0, 10).unwrap();
    let ids: Vec<(u64, u32)> = hits.iter().map(|h| (h.id, h.rank)).collect();
    assert_eq!(ids, vec![(11, 1), (10, 0)]);
    assert_eq!(c.search("tabby cat", "m", 0, 10).unwrap().len(), 2);
    assert_eq!(
        c.search("cat", "m", 0, 10).unwrap().len(),
        0,
        "no partial-word matches"
    );
    assert_eq!(c.search("tabby", "m", 1, 10).unwrap().len(), 1);
    assert_eq!(c.search("Egyptian cat", "m", 0, 10).unwrap()[0].id, 11);
}

/// `%`, `_` and `\` in a searched label are characters, not SQL LIKE wildcards.
fn search_treats_wildcards_literally(c: &dyn Catalog) {
    store(
        c,
        "w",
        &[
            (20, "tabby, tabby cat", 0.5),
            (21, "100% wool, a_b, back\\slash", 0.5),
        ],
    );
    for wildcard in ["%", "_", "%%", "t_bby", "tab%", "%cat", "\\"] {
        assert!(
            c.search(wildcard, "w", 0, 10).unwrap().is_empty(),
            "{wildcard:?} must match only itself"
        );
    }
    for literal in ["100% wool", "a_b", "back\\slash"] {
        let hits = c.search(literal, "w", 0, 10).unwrap();
        assert_eq!(
            hits.iter().map(|h| h.id).collect::<Vec<_>>(),
            vec![21],
            "{literal:?}"
        );
    }
}

/// A query finds a class name or the whole label, never a part of a word or of a name.
fn search_matches_whole_words_only(c: &dyn Catalog) {
    store(
        c,
        "words",
        &[
            (600, "sweatshirt", 0.9),
            (601, "jersey, T-shirt, tee shirt", 0.8),
        ],
    );
    for miss in ["shirt", "sweat", "tee", "T", "jersey, T", "sweatshirt "] {
        assert!(ids(c, miss, "words", 0, 10).is_empty(), "{miss:?}");
    }
    assert_eq!(ids(c, "sweatshirt", "words", 0, 10), [600]);
    assert!(
        ids(c, "Sweatshirt", "words", 0, 10).is_empty(),
        "a single-name label matches exactly"
    );
    for hit in [
        "t-shirt",
        "TEE SHIRT",
        "jersey",
        "jersey, T-shirt, tee shirt",
    ] {
        assert_eq!(ids(c, hit, "words", 0, 10), [601], "{hit:?}");
    }
}

/// Pages of a search follow one another in score order (ties by id), none lost or repeated.
fn search_pages_in_score_order(c: &dyn Catalog) {
    let all: Vec<u64> = (610..635).collect();
    for &id in &all {
        c.upsert_photo(&photo(id, None)).unwrap();
    }
    let rows: Vec<_> = all
        .iter()
        .map(|&id| (id, vec![p("sandal", ((id % 5) as f32) / 10.0)]))
        .collect();
    assert_eq!(c.put_predictions_many("pages", &rows).unwrap(), all.len());
    let mut expected = all.clone();
    expected.sort_by_key(|id| (std::cmp::Reverse(id % 5), *id));
    let mut paged = Vec::new();
    for page in 0..4 {
        let got = ids(c, "sandal", "pages", page * 7, 7);
        assert!(got.len() <= 7);
        paged.extend(got);
    }
    assert_eq!(paged, expected);
    assert!(ids(c, "sandal", "pages", 25, 7).is_empty());
    assert_eq!(
        c.search("sandal", "pages", 0, 100).unwrap()[0].label,
        "sandal"
    );
}

/// New predictions of a version replace the old ones in search, one at a time and in bulk.
fn relabelling_moves_a_photo_between_labels(c: &dyn Catalog) {
    store(
        c,
        "move",
        &[
            (640, "pullover, sweater", 0.7),
            (641, "pullover, sweater", 0.6),
        ],
    );
    assert_eq!(ids(c, "sweater", "move", 0, 10), [640, 641]);
    c.put_predictions(640, "move", &[p("coat, overcoat", 0.9)])
        .unwrap();
    assert_eq!(ids(c, "sweater", "move", 0, 10), [641]);
    assert_eq!(ids(c, "coat", "move", 0, 10), [640]);
    let relabel = [(641, vec![p("coat, overcoat", 0.5), p("bag", 0.1)])];
    assert_eq!(c.put_predictions_many("move", &relabel).unwrap(), 1);
    assert!(ids(c, "pullover", "move", 0, 10).is_empty());
    assert_eq!(ids(c, "overcoat", "move", 0, 10), [640, 641]);
    assert_eq!(ids(c, "bag", "move", 0, 10), [641]);
    assert!(
        ids(c, "coat", "other-version", 0, 10).is_empty(),
        "search answers one version"
    );
}

/// A deleted photo is found by no label, under no version.
fn a_deleted_photo_leaves_search(c: &dyn Catalog) {
    for version in ["del-a", "del-b"] {
        store(
            c,
            version,
            &[
                (650, "ankle boot, boot", 0.9),
                (651, "ankle boot, boot", 0.8),
            ],
        );
    }
    assert!(c.delete_photo(650).unwrap());
    for version in ["del-a", "del-b"] {
        assert_eq!(ids(c, "boot", version, 0, 10), [651]);
        assert_eq!(ids(c, "ankle boot, boot", version, 0, 10), [651]);
    }
    c.upsert_photo(&photo(650, None)).unwrap();
    assert_eq!(
        ids(c, "boot", "del-a", 0, 10),
        [651],
        "a photo stored again under the same id has no old labels"
    );
}

/// Labels with every edge of class-name splitting, for the tests that a backend's migration
/// indexes stored predictions as its writes do: photo `i + 1` has "other" then `LABELS[i]`.
pub const INDEX_LABELS: [&str; 8] = [
    "tabby, tabby cat",
    "German shepherd, German shepherd dog, Alsatian",
    "Egyptian cat",
    "Éclair, éclair au chocolat",
    "comma,without space",
    "trailing, ",
    "a, A, a",
    ",leading",
];

/// Stores [`INDEX_LABELS`] under version "v".
pub fn store_index_labels(c: &dyn PhotoCatalog) {
    for (i, label) in INDEX_LABELS.iter().enumerate() {
        let id = i as u64 + 1;
        c.upsert_photo(&photo(id, None)).unwrap();
        c.put_predictions(id, "v", &[p("other", 0.9), p(label, 0.5)])
            .unwrap();
    }
}

/// What searches over [`INDEX_LABELS`] answer: `(id, rank)` of every hit of each query.
pub fn index_label_answers(c: &dyn PhotoCatalog) -> Vec<Vec<(u64, u32)>> {
    let queries = [
        "tabby",
        "TABBY CAT",
        "cat",
        "alsatian",
        "Egyptian cat",
        "egyptian cat",
        "Éclair",
        "éclair",
        "comma",
        "without space",
        "",
        "trailing",
        "a",
        "leading",
        ",leading",
    ];
    let answers: Vec<Vec<(u64, u32)>> = queries
        .iter()
        .map(|q| {
            let hits = c.search(q, "v", 0, 100).unwrap();
            hits.iter().map(|h| (h.id, h.rank)).collect()
        })
        .collect();
    assert!(answers.iter().any(|hits| hits.len() > 1));
    answers
}
