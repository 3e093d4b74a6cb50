//! `ndpipe-bench similar`: the similarity index a PipeStore keeps ([`AnnIndex`], usearch HNSW,
//! cosine) against exact search over the same vectors: recall@k, query latency p50/p99 beside
//! the exact search's (the reference, timed in the same run), build time and index bytes, per
//! scalar kind, over rounds with different insertion orders and queries.
//!
//! The vectors: real EfficientNet-Lite0 features of the sample photos and of Fashion-MNIST test
//! images (run here once, cached under `.cache/`), expanded to `--photos` by perturbation: each
//! added vector is `(1 - l) * a + l * b` for two random real vectors `a`, `b` and `l` uniform in
//! [0, 0.3], every component then scaled by a factor uniform in [0.8, 1.2] (features stay
//! non-negative, as the backbone's are). A query is a stored photo's vector, itself left out, as
//! `GET /v1/photos/{id}/similar` asks.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe::fashion_mnist;
use ndpipe_model::{InferenceBackend, OrtBackend, PreprocessConfig, Preprocessor, RuntimeConfig};
use ndpipe_store::{AnnIndex, AnnOptions, Scalar};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Flags of `ndpipe-bench similar`.
#[derive(Debug, Args)]
pub(crate) struct SimilarBench {
    /// The model folder (EfficientNet-Lite0).
    #[arg(long, default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Real photos run through the model besides Fashion-MNIST.
    #[arg(long, default_value = ".cache/model/samples")]
    samples: PathBuf,
    /// Fashion-MNIST folder (default: the usual places).
    #[arg(long)]
    fashion_mnist_dir: Option<PathBuf>,
    /// Fashion-MNIST test images run through the model for real vectors.
    #[arg(long, default_value_t = 3000)]
    fashion: usize,
    /// Where the real vectors are cached.
    #[arg(long, default_value = ".cache/similar-features.bin")]
    cache: PathBuf,
    /// Vectors in the index (one node's photos).
    #[arg(long, default_value_t = 100_000)]
    photos: usize,
    /// Queries per round.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Rounds (insertion order and queries differ).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// HNSW M, as `similar_connectivity`.
    #[arg(long, default_value_t = 16)]
    connectivity: usize,
    /// HNSW ef_construction, as `similar_expansion_add`.
    #[arg(long, default_value_t = 128)]
    expansion_add: usize,
    /// HNSW ef, as `similar_expansion_search`.
    #[arg(long, default_value_t = 64)]
    expansion_search: usize,
    /// Scalar kinds to measure, comma-separated (f16, f32).
    #[arg(long, value_delimiter = ',', default_values = ["f16", "f32"])]
    scalars: Vec<String>,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One round of one scalar kind.
#[derive(Debug, Clone, Serialize)]
struct Round {
    scalar: &'static str,
    round: u64,
    recall: f64,
    p50_ms: f64,
    p99_ms: f64,
    exact_p50_ms: f64,
    exact_p99_ms: f64,
    build_s: f64,
    index_bytes: usize,
}

/// Runs the benchmark.
pub(crate) async fn run(args: SimilarBench) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&args)).await?
}

fn run_blocking(args: &SimilarBench) -> Result<()> {
    ensure!(
        args.k > 0 && args.queries > 0,
        "k and queries must be at least 1"
    );
    let (real, dim) = real_vectors(args)?;
    let vectors = expand(&real, dim, args.photos);
    let normalised: Vec<f32> = vectors.chunks_exact(dim).flat_map(unit).collect();
    let scalars = args
        .scalars
        .iter()
        .map(|s| match s.as_str() {
            "f16" => Ok(Scalar::F16),
            "f32" => Ok(Scalar::F32),
            other => anyhow::bail!("unknown scalar kind {other}: give f16 or f32"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        for &scalar in &scalars {
            let r = one_round(args, &vectors, &normalised, dim, scalar, round)?;
            eprintln!("{r:?}");
            rounds.push(r);
        }
    }
    print_table(args, real.len() / dim, dim, &rounds);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rounds)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Builds the index in a shuffled order, then times `queries` searches against exact ones.
fn one_round(
    args: &SimilarBench,
    vectors: &[f32],
    normalised: &[f32],
    dim: usize,
    scalar: Scalar,
    round: u64,
) -> Result<Round> {
    let n = vectors.len() / dim;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(round);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let options = AnnOptions {
        connectivity: args.connectivity,
        expansion_add: args.expansion_add,
        expansion_search: args.expansion_search,
        scalar,
    };
    let started = Instant::now();
    let mut ann = AnnIndex::new(dim, options)?;
    for &i in &order {
        ann.upsert(i as u64, &vectors[i * dim..(i + 1) * dim])?;
    }
    let build_s = started.elapsed().as_secs_f64();
    let (mut ann_ms, mut exact_ms, mut found) = (Vec::new(), Vec::new(), 0usize);
    for _ in 0..args.queries {
        let q = rng.random_range(0..n);
        let query = &vectors[q * dim..(q + 1) * dim];
        let t = Instant::now();
        let hits = ann.search(query, args.k + 1)?;
        ann_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let truth = exact(normalised, dim, q, args.k);
        exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
        found += hits
            .iter()
            .filter(|(id, _)| *id as usize != q)
            .take(args.k)
            .filter(|(id, _)| truth.contains(&(*id as usize)))
            .count();
    }
    Ok(Round {
        scalar: scalar_name(scalar),
        round,
        recall: found as f64 / (args.queries * args.k) as f64,
        p50_ms: percentile(&mut ann_ms, 0.50),
        p99_ms: percentile(&mut ann_ms, 0.99),
        exact_p50_ms: percentile(&mut exact_ms, 0.50),
        exact_p99_ms: percentile(&mut exact_ms, 0.99),
        build_s,
        index_bytes: ann.serialized_bytes(),
    })
}

fn scalar_name(s: Scalar) -> &'static str {
    match s {
        Scalar::F16 => "f16",
        Scalar::F32 => "f32",
    }
}

/// The `k` vectors with the highest cosine to vector `q` (itself left out), by brute force
/// over unit vectors.
fn exact(normalised: &[f32], dim: usize, q: usize, k: usize) -> Vec<usize> {
    let query = &normalised[q * dim..(q + 1) * dim];
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (i, v) in normalised.chunks_exact(dim).enumerate() {
        if i == q {
            continue;
        }
        let score: f32 = v.iter().zip(query).map(|(a, b)| a * b).sum();
        if best.len() < k || score > best[best.len() - 1].0 {
            let at = best.partition_point(|(s, _)| *s >= score);
            best.insert(at, (score, i));
            best.truncate(k);
        }
    }
    best.into_iter().map(|(_, i)| i).collect()
}

fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter().map(|x| x / norm).collect()
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[at]
}

/// `real` (row-major, `dim` wide) followed by perturbed mixes of its rows, `photos` rows in all.
fn expand(real: &[f32], dim: usize, photos: usize) -> Vec<f32> {
    let rows = real.len() / dim;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(0x5151);
    let mut out = real.to_vec();
    while out.len() / dim < photos {
        let a = &real[rng.random_range(0..rows) * dim..][..dim];
        let b = &real[rng.random_range(0..rows) * dim..][..dim];
        let l: f32 = rng.random_range(0.0..0.3);
        for (x, y) in a.iter().zip(b) {
            let scale: f32 = rng.random_range(0.8..1.2);
            out.push(((1.0 - l) * x + l * y) * scale);
        }
    }
    out.truncate(photos * dim);
    out
}

/// The real vectors (row-major) and their width: from the cache, else computed and cached.
fn real_vectors(args: &SimilarBench) -> Result<(Vec<f32>, usize)> {
    if let Some(cached) = read_cache(&args.cache)? {
        return Ok(cached);
    }
    let config = RuntimeConfig {
        intra_threads: 2,
        max_batch: 32,
        ..RuntimeConfig::for_model_dir(&args.model_dir)
    };
    let model = OrtBackend::load(&args.model_dir, &config)
        .with_context(|| format!("loading the model in {}", args.model_dir.display()))?;
    let dim = model.info().feature_dim;
    let pre = Preprocessor::new(PreprocessConfig::default());
    let mut photos: Vec<Vec<u8>> = Vec::new();
    if let Ok(dir) = std::fs::read_dir(&args.samples) {
        let mut paths: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("png" | "jpg")))
            .collect();
        paths.sort();
        for p in paths {
            photos.push(std::fs::read(&p)?);
        }
    }
    let test = fashion_mnist::load(&fashion_mnist::dir(args.fashion_mnist_dir.as_ref()), "test")?;
    for i in 0..args.fashion.min(test.len()) {
        photos.push(fashion_mnist::png(test.image(i))?);
    }
    eprintln!(
        "running the backbone over {} photos (cached afterwards)",
        photos.len()
    );
    let mut out = Vec::with_capacity(photos.len() * dim);
    for batch in photos.chunks(32) {
        let tensors = batch
            .iter()
            .map(|b| Ok(pre.run(b)?.tensor))
            .collect::<Result<Vec<_>>>()?;
        let outputs = model.run(&tensors)?;
        for i in 0..tensors.len() {
            out.extend_from_slice(outputs.features(i));
        }
    }
    write_cache(&args.cache, &out, dim)?;
    Ok((out, dim))
}

/// The cache: `dim` as u32 LE, then f32 LE values.
fn read_cache(path: &Path) -> Result<Option<(Vec<f32>, usize)>> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(None);
    };
    ensure!(bytes.len() >= 4, "{} is too short", path.display());
    let dim = u32::from_le_bytes(bytes[..4].try_into()?) as usize;
    let values: Vec<f32> = bytes[4..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    ensure!(
        dim > 0 && values.len().is_multiple_of(dim),
        "{} is damaged",
        path.display()
    );
    Ok(Some((values, dim)))
}

fn write_cache(path: &Path, values: &[f32], dim: usize) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut bytes = (dim as u32).to_le_bytes().to_vec();
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Mean and (min..max) of one column over the rounds of `scalar`.
fn spread(rounds: &[Round], scalar: &str, f: impl Fn(&Round) -> f64) -> (f64, f64, f64) {
    let v: Vec<f64> = rounds
        .iter()
        .filter(|r| r.scalar == scalar)
        .map(f)
        .collect();
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, min, max)
}

fn print_table(args: &SimilarBench, real: usize, dim: usize, rounds: &[Round]) {
    println!(
        "similar: {} photos ({real} real EfficientNet-Lite0 vectors, the rest perturbed mixes), \
         {dim}-d, k = {}, {} queries x {} rounds, M = {}, ef_construction = {}, ef = {}",
        args.photos,
        args.k,
        args.queries,
        args.rounds,
        args.connectivity,
        args.expansion_add,
        args.expansion_search
    );
    println!(
        "{:<6} {:>22} {:>22} {:>22} {:>22} {:>10} {:>16} {:>10}",
        "scalar", "recall@k", "p50 ms", "p99 ms", "exact p99 ms", "p50 x", "build s", "index MiB"
    );
    let cell = |(m, lo, hi): (f64, f64, f64), digits: usize| {
        format!("{m:.digits$} ({lo:.digits$}..{hi:.digits$})")
    };
    for scalar in ["f16", "f32"] {
        if !rounds.iter().any(|r| r.scalar == scalar) {
            continue;
        }
        let p50 = spread(rounds, scalar, |r| r.p50_ms);
        let exact50 = spread(rounds, scalar, |r| r.exact_p50_ms);
        println!(
            "{scalar:<6} {:>22} {:>22} {:>22} {:>22} {:>10.0} {:>16} {:>10.1}",
            cell(spread(rounds, scalar, |r| r.recall), 3),
            cell(p50, 2),
            cell(spread(rounds, scalar, |r| r.p99_ms), 2),
            cell(spread(rounds, scalar, |r| r.exact_p99_ms), 1),
            exact50.0 / p50.0,
            cell(spread(rounds, scalar, |r| r.build_s), 1),
            spread(rounds, scalar, |r| r.index_bytes as f64).0 / f64::from(1 << 20),
        );
    }
    println!(
        "(p50 x: the exact search's p50 over the index's, in the same rounds; targets: recall >= 0.95, p99 <= 50 ms)"
    );
}
