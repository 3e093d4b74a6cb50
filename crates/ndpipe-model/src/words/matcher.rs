//! [`ClassMatcher`]: a query in words to the classes it means, over every task's class names.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::names::{ClassName, folded};
use super::{Embedded, TextEncoder, WordsError, cache};

/// Longest query taken, in characters: a search names a thing, not a paragraph (and the model's
/// cost grows with the length).
pub const MAX_QUERY_CHARS: usize = 200;

/// How a class came to match a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatchKind {
    /// The query is the class name (case and spacing aside).
    Exact,
    /// The query is one of the class name's comma-separated synonyms.
    Synonym,
    /// The query's embedding is close to that of one of the class name's synonyms or of a
    /// synonym's plural.
    Embedding,
}

/// One class a query maps to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Match {
    /// The task the class belongs to.
    pub task: String,
    /// The class name as labels carry it.
    pub class: String,
    /// Cosine similarity of the query and the class's closest synonym (or a synonym's plural);
    /// 1 for exact and synonym matches.
    pub score: f32,
    /// How it matched.
    pub how: MatchKind,
}

/// What a query maps to: the cut-off and the most classes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatchOptions {
    /// Least cosine similarity of an embedding match (-1..=1). The default, 0.6, is the 95th
    /// percentile of the best class score of random strings of letters over ImageNet's and
    /// Fashion-MNIST's classes (0.59, `ndpipe-bench words`), rounded up: about one such string
    /// in 20 still maps to a class.
    pub min_score: f32,
    /// Most classes of one task a query maps to (at least 1): a task of 1,000 classes does not
    /// crowd out the best class of a task of 10.
    pub max_classes: usize,
}

impl Default for MatchOptions {
    fn default() -> Self {
        MatchOptions {
            min_score: 0.6,
            max_classes: 3,
        }
    }
}

impl MatchOptions {
    /// Fails when a setting is out of range.
    pub fn check(&self) -> Result<(), WordsError> {
        if !(-1.0..=1.0).contains(&self.min_score) {
            return Err(WordsError::Options(format!(
                "min_score {} is not in -1..=1",
                self.min_score
            )));
        }
        if self.max_classes == 0 {
            return Err(WordsError::Options("max_classes must be at least 1".into()));
        }
        Ok(())
    }
}

/// Maps queries in words onto the classes of every task. Immutable: a new class list makes a
/// new matcher ([`ClassMatcher::with_classes`]), which shares the encoder and re-embeds only
/// names it has not seen.
#[derive(Debug)]
pub struct ClassMatcher {
    encoder: Arc<TextEncoder>,
    options: MatchOptions,
    classes: Vec<ClassName>,
    /// How many tasks `classes` name.
    task_count: usize,
    /// Folded class name or synonym -> the classes it names exactly, and how.
    names: HashMap<String, Vec<(usize, MatchKind)>>,
    /// Each embedded text's class and embedding (a synonym, or its plural).
    rows: Vec<(usize, Arc<[f32]>)>,
    /// Embedded text -> its embedding, for the next class list.
    embedded: Embedded,
    /// The file the embeddings are kept in across restarts, if any.
    cache: Option<PathBuf>,
}

impl ClassMatcher {
    /// A matcher over `classes` (duplicates count once), embedding every synonym and its plural.
    pub fn build(
        encoder: Arc<TextEncoder>,
        options: MatchOptions,
        classes: Vec<ClassName>,
    ) -> Result<Self, WordsError> {
        Self::build_with(encoder, options, classes, &HashMap::new(), None)
    }

    /// [`ClassMatcher::build`] with the embeddings kept in a file in `cache_dir` (one per model,
    /// about 8 MB for ImageNet's and Fashion-MNIST's classes): names found there are not run
    /// through the model, and the file is rewritten when names were embedded. A damaged file is
    /// an error ([`WordsError::Cache`]), not ignored.
    pub fn build_cached(
        encoder: Arc<TextEncoder>,
        options: MatchOptions,
        classes: Vec<ClassName>,
        cache_dir: &Path,
    ) -> Result<Self, WordsError> {
        let path = cache::file_in(cache_dir, encoder.fingerprint());
        let known = cache::read(&path, encoder.fingerprint(), encoder.dim())?;
        Self::build_with(encoder, options, classes, &known, Some(path))
    }

    /// The matcher of a new class list (a task gained classes, or a task was added), with the
    /// same encoder, options and cache file; only names this matcher has not embedded are run
    /// through the model.
    pub fn with_classes(&self, classes: Vec<ClassName>) -> Result<Self, WordsError> {
        Self::build_with(
            self.encoder.clone(),
            self.options,
            classes,
            &self.embedded,
            self.cache.clone(),
        )
    }

    /// The matcher with other options and the same classes (nothing is embedded again).
    pub fn with_options(&self, options: MatchOptions) -> Result<Self, WordsError> {
        options.check()?;
        Ok(ClassMatcher {
            encoder: self.encoder.clone(),
            options,
            classes: self.classes.clone(),
            task_count: self.task_count,
            names: self.names.clone(),
            rows: self.rows.clone(),
            embedded: self.embedded.clone(),
            cache: self.cache.clone(),
        })
    }

    fn build_with(
        encoder: Arc<TextEncoder>,
        options: MatchOptions,
        classes: Vec<ClassName>,
        known: &Embedded,
        cache: Option<PathBuf>,
    ) -> Result<Self, WordsError> {
        options.check()?;
        let mut seen = HashSet::new();
        let classes: Vec<ClassName> = classes
            .into_iter()
            .filter(|c| seen.insert(c.clone()))
            .collect();
        let mut names: HashMap<String, Vec<(usize, MatchKind)>> = HashMap::new();
        let mut texts = Vec::new();
        for (i, class) in classes.iter().enumerate() {
            names
                .entry(folded(&class.class))
                .or_default()
                .push((i, MatchKind::Exact));
            for synonym in class.synonyms() {
                names
                    .entry(folded(synonym))
                    .or_default()
                    .push((i, MatchKind::Synonym));
            }
            texts.extend(class.embedded_texts().map(|text| (i, text)));
        }
        let (embedded, fresh) = embed_new(&encoder, known, texts.iter().map(|(_, s)| s.as_str()))?;
        if let Some(path) = cache.as_deref().filter(|_| fresh > 0) {
            cache::write(path, encoder.fingerprint(), &embedded)?;
        }
        let rows = texts
            .iter()
            .map(|(i, s)| (*i, embedded[s].clone()))
            .collect();
        let task_count = classes
            .iter()
            .map(|c| &c.task)
            .collect::<HashSet<_>>()
            .len();
        Ok(ClassMatcher {
            encoder,
            options,
            classes,
            task_count,
            names,
            rows,
            embedded,
            cache,
        })
    }

    /// The classes a query means, best first, at most `max_classes` of each task: classes named
    /// exactly by the query, then those it names by a synonym (both case-insensitive, score 1),
    /// then those whose closest synonym (or plural) has a cosine similarity of at least
    /// `min_score` with the query's, by score. Empty when nothing is close enough; an error for
    /// an empty or overlong query.
    pub fn match_query(&self, query: &str) -> Result<Vec<Match>, WordsError> {
        let query = folded(query);
        if query.is_empty() {
            return Err(WordsError::EmptyQuery);
        }
        let len = query.chars().count();
        if len > MAX_QUERY_CHARS {
            return Err(WordsError::QueryTooLong {
                len,
                max: MAX_QUERY_CHARS,
            });
        }
        let mut named = self.names.get(&query).cloned().unwrap_or_default();
        named.sort_by_key(|&(i, how)| (how, i));
        let mut picked = Picked::new(self.options.max_classes);
        for (i, how) in named {
            picked.offer(&self.classes, i, 1.0, how);
        }
        if !picked.full(self.task_count) {
            for (i, score) in self.closest(&query)? {
                if score < self.options.min_score || picked.full(self.task_count) {
                    break;
                }
                picked.offer(&self.classes, i, score, MatchKind::Embedding);
            }
        }
        Ok(picked
            .hits
            .into_iter()
            .map(|(i, score, how)| self.hit(i, score, how))
            .collect())
    }

    /// Every class with the cosine similarity of its closest embedded text to `query`, best
    /// first.
    fn closest(&self, query: &str) -> Result<Vec<(usize, f32)>, WordsError> {
        let q = self.encoder.embed(&[query])?.remove(0);
        let mut best = vec![f32::NEG_INFINITY; self.classes.len()];
        for (class, row) in &self.rows {
            let score: f32 = row.iter().zip(&q).map(|(a, b)| a * b).sum();
            best[*class] = best[*class].max(score);
        }
        let mut ranked: Vec<(usize, f32)> = best.into_iter().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(ranked)
    }

    fn hit(&self, class: usize, score: f32, how: MatchKind) -> Match {
        let c = &self.classes[class];
        Match {
            task: c.task.clone(),
            class: c.class.clone(),
            score,
            how,
        }
    }

    /// The classes, duplicates left out, in the order given.
    pub fn classes(&self) -> &[ClassName] {
        &self.classes
    }

    /// The cut-off and the most classes per query.
    pub fn options(&self) -> MatchOptions {
        self.options
    }

    /// The encoder, shared by the matchers made from this one.
    pub fn encoder(&self) -> &Arc<TextEncoder> {
        &self.encoder
    }
}

/// The embeddings of `texts`, taken from `known` where there, the rest run through the model;
/// and how many were run.
fn embed_new<'a>(
    encoder: &TextEncoder,
    known: &Embedded,
    texts: impl Iterator<Item = &'a str>,
) -> Result<(Embedded, usize), WordsError> {
    let mut out: Embedded = HashMap::new();
    let mut pending = HashSet::new();
    let mut missing = Vec::new();
    for text in texts {
        match known.get(text) {
            Some(v) => {
                out.insert(text.to_string(), v.clone());
            }
            None if pending.insert(text) => missing.push(text),
            None => {}
        }
    }
    for (text, v) in missing.iter().zip(encoder.embed(&missing)?) {
        out.insert(text.to_string(), v.into());
    }
    Ok((out, missing.len()))
}

/// The classes a query has picked so far: each once, at most `cap` of each task.
struct Picked<'a> {
    cap: usize,
    per_task: HashMap<&'a str, usize>,
    taken: HashSet<usize>,
    hits: Vec<(usize, f32, MatchKind)>,
}

impl<'a> Picked<'a> {
    fn new(cap: usize) -> Self {
        Picked {
            cap,
            per_task: HashMap::new(),
            taken: HashSet::new(),
            hits: Vec::new(),
        }
    }

    /// Takes class `i` unless it is taken or its task has `cap` classes already.
    fn offer(&mut self, classes: &'a [ClassName], i: usize, score: f32, how: MatchKind) {
        let count = self.per_task.entry(classes[i].task.as_str()).or_default();
        if *count < self.cap && self.taken.insert(i) {
            *count += 1;
            self.hits.push((i, score, how));
        }
    }

    /// Whether each of the `tasks` tasks has `cap` classes.
    fn full(&self, tasks: usize) -> bool {
        self.per_task.len() == tasks && self.per_task.values().all(|&n| n >= self.cap)
    }
}
