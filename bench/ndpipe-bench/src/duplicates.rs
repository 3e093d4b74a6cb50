//! `ndpipe-bench duplicates`: precision and recall of the duplicate pairs found at each level
//! on a generated set of real images (`dup_set.rs`), against a control that must lose, with
//! the sweep of thresholds behind the defaults; and the time to find near pairs among 10^5
//! hashes against a full scan of every pair.
//!
//! Every figure is of what a real PipeStore kept (`dup_store.rs`): the set is uploaded to a
//! fresh node, with its model. A found pair is right when both photos are of one family (an
//! original and its copies). Exact: the node's exact groups (same SHA-256), against as many
//! random pairs. Near: the perceptual hashes of the node's stored tensors (its worker's own for
//! the configured algorithm) and the store's multi-index pair search, per algorithm and
//! Hamming threshold, against random hashes. Semantic: the exact cosine between the features
//! the node stored at ingest (EfficientNet-Lite0, its backbone), per threshold, against the
//! same features shuffled between photos; in the product these pairs come from the feature
//! index, whose recall against exact search is measured by `ndpipe-bench similar`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use ndpipe_store::{DEFAULT_NEAR_HAMMING, DEFAULT_SEMANTIC_MIN_COSINE, NearHash, near_pairs};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

use crate::dup_set::{Edit, Inputs, Photo, Sizes, Sources};
use crate::dup_stats::{Score, Spread, score, table};
use crate::dup_store::store_and_read;

/// Flags of `ndpipe-bench duplicates`.
#[derive(Debug, Args)]
pub(crate) struct DuplicatesBench {
    /// Folder of real sample photos.
    #[arg(long, default_value = ".cache/model/samples")]
    samples: PathBuf,
    /// Folder of large JPEG wallpapers.
    #[arg(long, default_value = ".cache/wallpapers")]
    wallpapers: PathBuf,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// The model folder (EfficientNet-Lite0) of the node the sets are stored on.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Seeds (sets) to run; the spread is over them.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Wallpaper tiles that are originals per set (as many more are unrelated photos).
    #[arg(long, default_value_t = 25)]
    tiles: usize,
    /// Fashion-MNIST images that are originals per set.
    #[arg(long, default_value_t = 40)]
    fashion: usize,
    /// Fashion-MNIST images that are unrelated photos per set.
    #[arg(long, default_value_t = 60)]
    fashion_unrelated: usize,
    /// Hashes of the pair-search timing.
    #[arg(long, default_value_t = 100_000)]
    timing_hashes: usize,
    /// Rounds of the pair-search timing.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Leave out the semantic level (the node runs without a model).
    #[arg(long)]
    no_semantic: bool,
}

/// Hamming thresholds of the sweep.
const HAMMING: [u32; 9] = [0, 2, 4, 6, 8, 10, 12, 14, 16];
/// Cosine thresholds of the sweep.
const COSINE: [f64; 8] = [0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95];

/// One set with what the node kept of it.
struct Measured {
    photos: Vec<Photo>,
    exact: Vec<(usize, usize)>,
    hashes: HashMap<NearHash, Vec<u64>>,
    features: Option<Vec<Vec<f32>>>,
}

/// Runs the benchmark.
pub(crate) async fn run(args: DuplicatesBench) -> Result<()> {
    let fashion = ndpipe::fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let inputs = Inputs {
        wallpapers: args.wallpapers.clone(),
        samples: args.samples.clone(),
        fashion: fashion.clone(),
    };
    let count = 2 * (args.fashion + args.fashion_unrelated);
    let sources = tokio::task::spawn_blocking(move || Sources::load(&inputs, count)).await??;
    let sizes = Sizes {
        tiles: args.tiles,
        fashion: args.fashion,
        fashion_unrelated: args.fashion_unrelated,
    };
    let model_dir = (!args.no_semantic).then_some(args.model_dir.as_path());
    let mut sets = Vec::new();
    for &seed in &args.seeds {
        let photos = sources.set(seed, sizes)?;
        let families = photos
            .iter()
            .filter_map(|p| p.family)
            .max()
            .map_or(0, |f| f + 1);
        eprintln!(
            "seed {seed}: storing {} photos, {families} families",
            photos.len()
        );
        let kept = store_and_read(&photos, model_dir).await?;
        sets.push(Measured {
            photos,
            exact: kept.exact,
            hashes: kept.hashes,
            features: kept.features,
        });
    }
    tokio::task::spawn_blocking(move || {
        report_quality(&sets, &args.seeds);
        report_timing(&args, &fashion)
    })
    .await?
}

/// Whether photos `a` and `b` are of one family.
fn related(photos: &[Photo], a: usize, b: usize) -> bool {
    photos[a].family.is_some() && photos[a].family == photos[b].family
}

/// Every pair of one family: what a level should find.
fn truth(photos: &[Photo]) -> usize {
    let mut sizes: HashMap<usize, usize> = HashMap::new();
    for f in photos.iter().filter_map(|p| p.family) {
        *sizes.entry(f).or_default() += 1;
    }
    sizes.values().map(|n| n * (n - 1) / 2).sum()
}

/// Pairs (by index) whose hashes are within `t` bits, found by the store's pair search.
fn near(hashes: &[u64], t: u32) -> Vec<(usize, usize)> {
    let ids: Vec<(u64, u64)> = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| (i as u64, *h))
        .collect();
    near_pairs(&ids, t)
        .into_iter()
        .map(|p| (p.a as usize, p.b as usize))
        .collect()
}

/// Pairs (by index) whose features' cosine is at least `min`.
fn semantic(features: &[Vec<f32>], min: f64) -> Vec<(usize, usize)> {
    (0..features.len())
        .into_par_iter()
        .flat_map_iter(|a| {
            (a + 1..features.len()).filter_map(move |b| {
                let cos: f32 = features[a]
                    .iter()
                    .zip(&features[b])
                    .map(|(x, y)| x * y)
                    .sum();
                (f64::from(cos) >= min).then_some((a, b))
            })
        })
        .collect()
}

/// Precision and recall of `pairs` on set `m`, and the recall of each copy with its original.
fn judge(m: &Measured, pairs: &[(usize, usize)]) -> Score {
    let right = pairs
        .iter()
        .filter(|&&(a, b)| related(&m.photos, a, b))
        .count();
    let found: HashSet<(usize, usize)> = pairs.iter().map(|&(a, b)| (a.min(b), a.max(b))).collect();
    let originals: HashMap<usize, usize> = m
        .photos
        .iter()
        .enumerate()
        .filter(|(_, p)| p.edit == Edit::Original)
        .filter_map(|(i, p)| p.family.map(|f| (f, i)))
        .collect();
    let per_edit = Edit::COPIES.map(|edit| {
        let copies: Vec<(usize, usize)> = m
            .photos
            .iter()
            .enumerate()
            .filter(|(_, p)| p.edit == edit)
            .filter_map(|(i, p)| {
                p.family
                    .map(|f| (originals[&f].min(i), originals[&f].max(i)))
            })
            .collect();
        copies.iter().filter(|c| found.contains(c)).count() as f64 / copies.len().max(1) as f64
    });
    score(right, pairs.len(), truth(&m.photos), per_edit)
}

/// Random pairs as many as `n`.
fn random_pairs(len: usize, n: usize, rng: &mut Pcg64Mcg) -> Vec<(usize, usize)> {
    (0..n)
        .map(|_| (rng.random_range(0..len), rng.random_range(0..len)))
        .filter(|(a, b)| a != b)
        .collect()
}

/// Prints the quality tables: each level at its default, its control, and the sweeps.
fn report_quality(sets: &[Measured], seeds: &[u64]) {
    let mut rows: Vec<(String, Spread)> = Vec::new();
    let over = |f: &dyn Fn(&Measured, usize) -> Score| -> Spread {
        Spread::of(sets.iter().enumerate().map(|(i, m)| f(m, i)).collect())
    };
    rows.push((
        "exact: same SHA-256".into(),
        over(&|m, _| judge(m, &m.exact)),
    ));
    rows.push((
        "exact control: random pairs".into(),
        over(&|m, i| {
            let n = m.exact.len();
            judge(
                m,
                &random_pairs(m.photos.len(), n, &mut Pcg64Mcg::seed_from_u64(seeds[i])),
            )
        }),
    ));
    let default_alg = NearHash::default();
    let t = DEFAULT_NEAR_HAMMING;
    rows.push((
        format!("near: {} <= {t} bits", default_alg.name()),
        over(&|m, _| judge(m, &near(&m.hashes[&default_alg], t))),
    ));
    rows.push((
        format!("near control: random hashes <= {t} bits"),
        over(&|m, i| {
            let mut rng = Pcg64Mcg::seed_from_u64(seeds[i]);
            let random: Vec<u64> = (0..m.photos.len()).map(|_| rng.random()).collect();
            judge(m, &near(&random, t))
        }),
    ));
    if sets.iter().all(|m| m.features.is_some()) {
        let c = DEFAULT_SEMANTIC_MIN_COSINE;
        let features = |m: &Measured| m.features.clone().unwrap_or_default();
        rows.push((
            format!("semantic: cosine >= {c}"),
            over(&|m, _| judge(m, &semantic(&features(m), c))),
        ));
        rows.push((
            format!("semantic control: shuffled features >= {c}"),
            over(&|m, i| {
                let mut shuffled = features(m);
                shuffled.shuffle(&mut Pcg64Mcg::seed_from_u64(seeds[i]));
                judge(m, &semantic(&shuffled, c))
            }),
        ));
    }
    println!("\nPairs found per level, seeds {seeds:?} (mean, [min, max] over seeds)\n");
    table(&rows);
    let mut sweep: Vec<(String, Spread)> = Vec::new();
    for alg in NearHash::ALL {
        for t in HAMMING {
            sweep.push((
                format!("near: {} <= {t}", alg.name()),
                over(&|m, _| judge(m, &near(&m.hashes[&alg], t))),
            ));
        }
    }
    if sets.iter().all(|m| m.features.is_some()) {
        for c in COSINE {
            sweep.push((
                format!("semantic: cosine >= {c}"),
                over(&|m, _| judge(m, &semantic(m.features.as_deref().unwrap_or_default(), c))),
            ));
        }
    }
    println!("\nThe sweep behind the defaults\n");
    table(&sweep);
}

/// Times the pair search among `args.timing_hashes` hashes against a full scan, on uniform
/// random hashes (each tenth with a copy a few bits away) and on real ones (Fashion-MNIST,
/// which cluster: many near-identical images).
fn report_timing(args: &DuplicatesBench, fashion: &std::path::Path) -> Result<()> {
    let n = args.timing_hashes;
    let t = DEFAULT_NEAR_HAMMING;
    let mut rng = Pcg64Mcg::seed_from_u64(7);
    let mut uniform: Vec<u64> = (0..n - n / 10).map(|_| rng.random()).collect();
    let copies: Vec<u64> = uniform[..n / 10]
        .iter()
        .map(|h| h ^ (1 << rng.random_range(0..64)) ^ (1 << rng.random_range(0..64)))
        .collect();
    uniform.extend(copies);
    let mut real = crate::dup_stats::fashion_hashes(fashion, NearHash::default(), n)?;
    real.extend((real.len()..n).map(|_| rng.random::<u64>()));
    println!(
        "\nNear pairs among {n} hashes within {t} bits (best of {} rounds)\n",
        args.rounds
    );
    println!(
        "{:<34} {:>8} {:>12} {:>12} {:>9}",
        "hashes", "pairs", "multi-index", "full scan", "speed-up"
    );
    for (name, hashes) in [
        ("uniform random, 10% copies", &uniform),
        ("Fashion-MNIST + random", &real),
    ] {
        let ids: Vec<(u64, u64)> = hashes
            .iter()
            .enumerate()
            .map(|(i, h)| (i as u64, *h))
            .collect();
        let (mut mih, mut scan, mut pairs) = (f64::MAX, f64::MAX, 0);
        for _ in 0..args.rounds.max(1) {
            let started = Instant::now();
            pairs = near_pairs(&ids, t).len();
            mih = mih.min(started.elapsed().as_secs_f64());
            let started = Instant::now();
            let scanned = crate::dup_stats::scan_pairs(hashes, t);
            scan = scan.min(started.elapsed().as_secs_f64());
            anyhow::ensure!(
                scanned == pairs,
                "the pair search found {pairs}, the scan {scanned}"
            );
        }
        println!(
            "{name:<34} {pairs:>8} {:>10.3} s {:>10.3} s {:>8.1}x",
            mih,
            scan,
            scan / mih
        );
    }
    Ok(())
}
