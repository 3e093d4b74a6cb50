//! The text encoder: all-MiniLM-L6-v2 run with candle as sentence-transformers runs it
//! (WordPiece tokens, BERT, mean of the token vectors over the attention mask, L2 norm).

use std::path::{Path, PathBuf};

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::WordsError;

/// Texts run through the model at once; longer lists go in batches of this many, grouped by
/// length so that little of a batch is padding.
const BATCH: usize = 64;

/// sentence-transformers' pipeline modules of a model folder (`modules.json`).
#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

/// `1_Pooling/config.json`: how token vectors become one sentence vector.
#[derive(Deserialize)]
struct Pooling {
    word_embedding_dimension: usize,
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

/// `sentence_bert_config.json`: the longest input, in tokens.
#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: usize,
}

/// A sentence-embedding model: text in, a unit-length vector out, so that the dot product of
/// two embeddings is their cosine similarity.
pub struct TextEncoder {
    model: BertModel,
    tokenizer: Tokenizer,
    dim: usize,
    fingerprint: String,
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEncoder")
            .field("dim", &self.dim)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl TextEncoder {
    /// Loads the model folder `tools/model/setup_words.sh` writes: `config.json`,
    /// `tokenizer.json`, `model.safetensors`, and sentence-transformers' `modules.json`,
    /// `1_Pooling/config.json` and `sentence_bert_config.json`, which must say mean pooling
    /// and L2 normalisation. [`WordsError::NoModel`] when the folder has no weights.
    pub fn load(dir: &Path) -> Result<Self, WordsError> {
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(WordsError::NoModel {
                dir: dir.to_path_buf(),
            });
        }
        let config_path = dir.join("config.json");
        let config_bytes = read(&config_path)?;
        let config: BertConfig = parse_json(&config_path, &config_bytes)?;
        check_pipeline(dir, config.hidden_size)?;
        let sentence: SentenceConfig = read_json(&dir.join("sentence_bert_config.json"))?;
        let max_tokens = sentence.max_seq_length.min(config.max_position_embeddings);
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_bytes = read(&tokenizer_path)?;
        let tokenizer = load_tokenizer(&tokenizer_path, &tokenizer_bytes, max_tokens)?;
        let bytes = read(&weights)?;
        let mut hash = Sha256::new();
        for part in [&config_bytes, &tokenizer_bytes, &bytes] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        let weights_error = |source| WordsError::Weights {
            path: weights.clone(),
            source,
        };
        let vb = VarBuilder::from_slice_safetensors(&bytes, DType::F32, &Device::Cpu)
            .map_err(weights_error)?;
        let model = BertModel::load(vb, &config).map_err(weights_error)?;
        Ok(TextEncoder {
            model,
            tokenizer,
            dim: config.hidden_size,
            fingerprint: hex::encode(hash.finalize()),
        })
    }

    /// The sha256 of the model's configuration, tokenizer and weights (hex): embeddings made
    /// by models of different fingerprints do not mix.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The length of an embedding.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The embeddings of `texts`, in their order, each of length [`Self::dim`] and unit L2 norm
    /// (a text with no tokens but the special ones still gets one).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, WordsError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, row) in chunk.iter().zip(self.embed_batch(&batch)?) {
                out[i] = row;
            }
        }
        Ok(out)
    }

    /// One batch through the tokenizer, the model, mean pooling and normalisation.
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, WordsError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(WordsError::Tokenize)?;
        let (n, len) = (encodings.len(), encodings.first().map_or(0, |e| e.len()));
        let column = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Result<Tensor, WordsError> {
            let flat: Vec<u32> = encodings.iter().flat_map(|e| f(e).to_vec()).collect();
            Ok(Tensor::from_vec(flat, (n, len), &Device::Cpu)?)
        };
        let ids = column(tokenizers::Encoding::get_ids)?;
        let types = column(tokenizers::Encoding::get_type_ids)?;
        let mask = column(tokenizers::Encoding::get_attention_mask)?;
        let tokens = self.model.forward(&ids, &types, Some(&mask))?;
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = tokens.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norms = mean
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12f32, f32::MAX)?;
        Ok(mean.broadcast_div(&norms)?.to_vec2::<f32>()?)
    }
}

/// The tokenizer of `path`, padding each batch to its longest text (the file's own padding is
/// to a fixed 128) and cutting texts at `max_tokens`, as sentence-transformers calls it.
fn load_tokenizer(path: &Path, bytes: &[u8], max_tokens: usize) -> Result<Tokenizer, WordsError> {
    let error = |source| WordsError::Tokenizer {
        path: path.to_path_buf(),
        source,
    };
    let mut tokenizer = Tokenizer::from_bytes(bytes).map_err(error)?;
    let padding = PaddingParams {
        strategy: PaddingStrategy::BatchLongest,
        ..tokenizer.get_padding().cloned().unwrap_or_default()
    };
    tokenizer.with_padding(Some(padding));
    let truncation = TruncationParams {
        max_length: max_tokens,
        ..tokenizer.get_truncation().cloned().unwrap_or_default()
    };
    tokenizer.with_truncation(Some(truncation)).map_err(error)?;
    Ok(tokenizer)
}

/// Checks that the folder's sentence-transformers pipeline is the one [`TextEncoder`] runs:
/// the transformer, mean pooling over `dim`-wide tokens, then L2 normalisation.
fn check_pipeline(dir: &Path, dim: usize) -> Result<(), WordsError> {
    let modules_path = dir.join("modules.json");
    let modules: Vec<Module> = read_json(&modules_path)?;
    let kinds: Vec<&str> = modules
        .iter()
        .map(|m| m.kind.rsplit('.').next().unwrap_or(&m.kind))
        .collect();
    if kinds != ["Transformer", "Pooling", "Normalize"] {
        return Err(unsupported(
            modules_path,
            format!("modules {kinds:?}, expected Transformer, Pooling, Normalize"),
        ));
    }
    let pooling_path = dir.join("1_Pooling").join("config.json");
    let p: Pooling = read_json(&pooling_path)?;
    let mean_only = p.pooling_mode_mean_tokens
        && !(p.pooling_mode_cls_token
            || p.pooling_mode_max_tokens
            || p.pooling_mode_mean_sqrt_len_tokens);
    if !mean_only || p.word_embedding_dimension != dim {
        return Err(unsupported(
            pooling_path,
            format!("expected mean pooling of {dim}-wide tokens only"),
        ));
    }
    Ok(())
}

fn unsupported(path: PathBuf, reason: String) -> WordsError {
    WordsError::Unsupported { path, reason }
}

fn read(path: &Path) -> Result<Vec<u8>, WordsError> {
    std::fs::read(path).map_err(|source| WordsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, WordsError> {
    parse_json(path, &read(path)?)
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, WordsError> {
    serde_json::from_slice(bytes).map_err(|source| WordsError::Json {
        path: path.to_path_buf(),
        source,
    })
}
