//! Search in words with the real model (`NDPIPE_MODEL_DIR/words`, made by `tools/setup.sh`):
//! the encoder against sentence-transformers' own embeddings, and the matcher over ImageNet's
//! 1,000 classes and Fashion-MNIST's 10 as two tasks.
#![cfg(feature = "words")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ndpipe_model::words::{
    ClassMatcher, ClassName, MatchKind, MatchOptions, TextEncoder, WORDS_SUBDIR, WordsError,
};
use serde::Deserialize;

/// Fashion-MNIST's classes, in label order.
const FASHION: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Largest difference of one embedding component from the Python reference's (fp32 on a
/// different matmul order; the observed difference is about 1e-6).
const TOLERANCE: f32 = 1e-4;

/// The model folder, or `None` after printing why the test is skipped (no `NDPIPE_MODEL_DIR`,
/// or no words model in it).
fn words_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("NDPIPE_MODEL_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(WORDS_SUBDIR));
    match dir {
        Some(dir) if dir.join("model.safetensors").is_file() => Some(dir),
        _ => {
            let msg = format!(
                "SKIPPED {test}: no words model in $NDPIPE_MODEL_DIR/words (run tools/setup.sh)\n"
            );
            let shown = std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/stderr")
                .and_then(|mut tty| tty.write_all(msg.as_bytes()));
            if shown.is_err() {
                eprint!("{msg}");
            }
            None
        }
    }
}

/// One encoder per test binary.
fn encoder(dir: &Path) -> Arc<TextEncoder> {
    static ENCODER: OnceLock<Arc<TextEncoder>> = OnceLock::new();
    ENCODER
        .get_or_init(|| Arc::new(TextEncoder::load(dir).unwrap_or_else(|e| panic!("{e}"))))
        .clone()
}

/// ImageNet's classes as task `general` and Fashion-MNIST's as task `fashion`.
fn classes(dir: &Path) -> Vec<ClassName> {
    let path = dir.parent().unwrap().join("imagenet_classes.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let general = text.lines().map(|c| ClassName::new("general", c));
    let fashion = FASHION.iter().map(|c| ClassName::new("fashion", *c));
    general.chain(fashion).collect()
}

/// One matcher per test binary, with the default options.
fn matcher(dir: &Path) -> &'static ClassMatcher {
    static MATCHER: OnceLock<ClassMatcher> = OnceLock::new();
    MATCHER.get_or_init(|| {
        ClassMatcher::build(encoder(dir), MatchOptions::default(), classes(dir))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

#[derive(Deserialize)]
struct Reference {
    dim: usize,
    texts: Vec<KnownAnswer>,
}

#[derive(Deserialize)]
struct KnownAnswer {
    text: String,
    embedding: Vec<f32>,
}

#[test]
fn embeddings_match_sentence_transformers() {
    let Some(dir) = words_dir("embeddings_match_sentence_transformers") else {
        return;
    };
    let reference: Reference =
        serde_json::from_str(include_str!("data/words_known_answers.json")).unwrap();
    let encoder = encoder(&dir);
    assert_eq!(encoder.dim(), reference.dim);
    let texts: Vec<&str> = reference.texts.iter().map(|t| t.text.as_str()).collect();
    let batch = encoder.embed(&texts).unwrap();
    for (known, got) in reference.texts.iter().zip(&batch) {
        let worst = known
            .embedding
            .iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < TOLERANCE,
            "{:?}: differs from the reference by {worst}",
            known.text
        );
        let alone = encoder.embed(&[known.text.as_str()]).unwrap().remove(0);
        let drift = alone
            .iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            drift < TOLERANCE,
            "{:?}: alone vs in a batch {drift}",
            known.text
        );
    }
}

/// The classes `query` maps to, as (task, class, how).
fn answer(dir: &Path, query: &str) -> Vec<(String, String, MatchKind)> {
    matcher(dir)
        .match_query(query)
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .into_iter()
        .map(|m| (m.task, m.class, m.how))
        .collect()
}

#[test]
fn kitty_maps_to_a_cat() {
    let Some(dir) = words_dir("kitty_maps_to_a_cat") else {
        return;
    };
    let got = answer(&dir, "kitty");
    let cats = [
        "tabby, tabby cat",
        "tiger cat",
        "Persian cat",
        "Egyptian cat",
        "Siamese cat, Siamese",
    ];
    assert!(
        got.iter().any(|(task, class, how)| task == "general"
            && cats.contains(&class.as_str())
            && *how == MatchKind::Embedding),
        "kitty -> {got:?}"
    );
}

#[test]
fn coffee_cup_maps_to_coffee() {
    let Some(dir) = words_dir("coffee_cup_maps_to_coffee") else {
        return;
    };
    let got = answer(&dir, "coffee cup");
    let coffee = ["espresso", "coffee mug", "cup"];
    assert!(
        got.first()
            .is_some_and(|(_, class, _)| coffee.contains(&class.as_str())),
        "coffee cup -> {got:?}"
    );
}

#[test]
fn jeans_map_to_the_fashion_tasks_trouser() {
    let Some(dir) = words_dir("jeans_map_to_the_fashion_tasks_trouser") else {
        return;
    };
    let got = answer(&dir, "jeans");
    assert!(
        got.iter().any(|(task, class, how)| task == "fashion"
            && class == "Trouser"
            && *how == MatchKind::Embedding),
        "jeans -> {got:?}"
    );
}

#[test]
fn exact_names_and_synonyms_rank_first() {
    let Some(dir) = words_dir("exact_names_and_synonyms_rank_first") else {
        return;
    };
    let got = answer(&dir, "ankle BOOT");
    assert_eq!(
        got[0],
        ("fashion".into(), "Ankle boot".into(), MatchKind::Exact),
        "{got:?}"
    );
    let got = answer(&dir, "Tabby Cat");
    assert_eq!(
        got[0],
        (
            "general".into(),
            "tabby, tabby cat".into(),
            MatchKind::Synonym
        ),
        "{got:?}"
    );
    let got = answer(&dir, "tiger cat");
    assert_eq!(
        got[0],
        ("general".into(), "tiger cat".into(), MatchKind::Exact)
    );
}

#[test]
fn nonsense_maps_to_nothing() {
    let Some(dir) = words_dir("nonsense_maps_to_nothing") else {
        return;
    };
    assert_eq!(answer(&dir, "qwxz zzkj"), vec![]);
}

#[test]
fn bad_queries_are_errors() {
    let Some(dir) = words_dir("bad_queries_are_errors") else {
        return;
    };
    let m = matcher(&dir);
    assert!(matches!(m.match_query("  \t"), Err(WordsError::EmptyQuery)));
    let long = "cat ".repeat(100);
    assert!(matches!(
        m.match_query(&long),
        Err(WordsError::QueryTooLong { .. })
    ));
}

#[test]
fn new_classes_are_found_and_the_cap_holds() {
    let Some(dir) = words_dir("new_classes_are_found_and_the_cap_holds") else {
        return;
    };
    let before = matcher(&dir);
    assert!(
        !answer(&dir, "hot air balloon")
            .iter()
            .any(|(task, ..)| task == "sky"),
        "no task sky yet"
    );
    let mut classes = before.classes().to_vec();
    classes.push(ClassName::new("sky", "Hot-air balloon"));
    classes.push(ClassName::new("sky", "Kite"));
    let after = before.with_classes(classes).unwrap();
    assert_eq!(after.classes().len(), before.classes().len() + 2);
    let got = after.match_query("hot air balloon").unwrap();
    assert!(
        got.iter()
            .any(|m| m.task == "sky" && m.class == "Hot-air balloon"),
        "{got:?}"
    );
    let one = after
        .with_options(MatchOptions {
            min_score: -1.0,
            max_classes: 1,
        })
        .unwrap();
    let tasks: Vec<String> = one
        .match_query("hot air balloon")
        .unwrap()
        .into_iter()
        .map(|m| m.task)
        .collect();
    assert_eq!(tasks.len(), 3, "one class of each task: {tasks:?}");
    assert!(
        ["general", "fashion", "sky"]
            .iter()
            .all(|t| tasks.iter().any(|g| g == t))
    );
}

#[test]
fn a_folder_without_the_model_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let err = TextEncoder::load(empty.path()).unwrap_err();
    assert!(matches!(err, WordsError::NoModel { .. }), "{err}");
    assert!(err.to_string().contains("tools/setup.sh"), "{err}");
}

#[test]
fn cached_embeddings_are_reused_and_damage_is_an_error() {
    let Some(dir) = words_dir("cached_embeddings_are_reused_and_damage_is_an_error") else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let fashion: Vec<ClassName> = FASHION
        .iter()
        .map(|c| ClassName::new("fashion", *c))
        .collect();
    let options = MatchOptions::default();
    let first =
        ClassMatcher::build_cached(encoder(&dir), options, fashion.clone(), cache.path()).unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();

    let again =
        ClassMatcher::build_cached(encoder(&dir), options, fashion.clone(), cache.path()).unwrap();
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        written,
        "nothing new was embedded, so the file is not rewritten"
    );
    assert_eq!(
        again.match_query("jeans").unwrap(),
        first.match_query("jeans").unwrap()
    );

    let mut more = fashion.clone();
    more.push(ClassName::new("sky", "Kite"));
    again.with_classes(more).unwrap();
    assert_ne!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        written,
        "a new name is embedded and kept"
    );

    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    let err =
        ClassMatcher::build_cached(encoder(&dir), options, fashion, cache.path()).unwrap_err();
    assert!(matches!(err, WordsError::Cache { .. }), "{err}");
}

/// A store shares one matcher between its request handlers.
#[test]
fn the_matcher_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<ClassMatcher>();
    shared::<TextEncoder>();
}
