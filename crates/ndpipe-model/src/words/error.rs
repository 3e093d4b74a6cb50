//! Why the words model cannot load or answer.

use std::path::PathBuf;

/// Why the words model cannot load, or a query cannot be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WordsError {
    /// The model folder has no model: the setup has not run, or `words_model_dir` points
    /// elsewhere. A store runs on without it; only searches in words need it.
    #[error(
        "no words model in {} (tools/setup.sh puts it there; or set words_model_dir)",
        dir.display()
    )]
    NoModel {
        /// The folder looked in.
        dir: PathBuf,
    },
    /// A file of the model could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file of cached class-name embeddings is damaged or belongs to another model; delete
    /// it and it is written anew.
    #[error("the cached embeddings {}: {reason}", path.display())]
    Cache {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A JSON file of the model does not parse.
    #[error("{} is not valid", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The model folder holds something this encoder does not run as sentence-transformers
    /// would (another pooling, no normalisation, another width).
    #[error("{}: {reason}", path.display())]
    Unsupported {
        /// The file that says so.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The tokenizer file does not load.
    #[error("the tokenizer {}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizer's error.
        #[source]
        source: tokenizers::Error,
    },
    /// The weights do not load into the model (missing or mis-shaped tensors).
    #[error("the weights {}", path.display())]
    Weights {
        /// The file.
        path: PathBuf,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// Tokenizing a text failed.
    #[error("tokenizing the text")]
    Tokenize(#[source] tokenizers::Error),
    /// Running the model failed.
    #[error("running the words model")]
    Model(#[from] candle_core::Error),
    /// The query is empty (or only spaces).
    #[error("the query is empty")]
    EmptyQuery,
    /// The query is longer than a search in words takes.
    #[error("the query has {len} characters, more than {max}")]
    QueryTooLong {
        /// Its length, in characters.
        len: usize,
        /// The most taken.
        max: usize,
    },
    /// A setting is out of range.
    #[error("invalid words settings: {0}")]
    Options(String),
}
