//! `ndpipe-bench words`: search in words. A written list of queries (`bench/data/
//! word-queries.tsv`: everyday words, Fashion-MNIST words, ImageNet synonyms and exact class
//! names, each with the classes it may fairly map to) is mapped onto ImageNet's 1,000 classes
//! (task `general`) and Fashion-MNIST's 10 (task `fashion`) by the words model, and by two
//! controls that must lose: exact/substring matching only (no model, the reference of the
//! ratios), and the model over the class list with its names shuffled within each task. Top-1
//! and top-3 accuracy, the share of queries answered at all, the cost of loading the model,
//! embedding the class names and answering a query (3 rounds, spread printed), and how often a
//! random string of letters maps to a class.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use ndpipe_model::words::{ClassMatcher, ClassName, MatchOptions, TextEncoder, WORDS_SUBDIR};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

use crate::emulated::Spread;
use crate::words_eval::{FASHION, GENERAL, Query, hit, read_queries, shuffled, substring_answer};

/// Flags of `ndpipe-bench words`.
#[derive(Debug, Args)]
pub(crate) struct WordsBench {
    /// Model folder: the words model in its `words` folder, ImageNet's class names in
    /// `imagenet_classes.txt`.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// The query list.
    #[arg(long, default_value = "bench/data/word-queries.tsv")]
    queries: PathBuf,
    /// Rounds of loading, embedding the class names and answering every query.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Least cosine similarity of an embedding match (the product's default).
    #[arg(long, default_value_t = MatchOptions::default().min_score)]
    min_score: f32,
    /// Most classes of each task one query maps to (the product's default).
    #[arg(long, default_value_t = MatchOptions::default().max_classes)]
    max_classes: usize,
    /// Random strings of letters for the false-match rate.
    #[arg(long, default_value_t = 200)]
    random_strings: usize,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One method's accuracy over the query list.
#[derive(Debug, Serialize)]
struct Accuracy {
    method: String,
    top1: f64,
    top3: f64,
    /// Top-1 per group of queries, in [`GROUPS`] order.
    top1_by_group: Vec<f64>,
    answered: f64,
}

/// The groups of the query list.
const GROUPS: [&str; 4] = ["everyday", "fashion", "synonym", "exact"];

/// Costs, in ms, one entry per round.
#[derive(Debug, Default, Serialize)]
struct Costs {
    load_ms: Vec<f64>,
    build_ms: Vec<f64>,
    cached_build_ms: Vec<f64>,
    rebuild_ms: Vec<f64>,
    query_p50_ms: Vec<f64>,
    query_p99_ms: Vec<f64>,
    substring_p50_ms: Vec<f64>,
}

/// How random strings fare at the cut-off.
#[derive(Debug, Serialize)]
struct Random {
    strings: usize,
    answered: f64,
    best_score_p50: f64,
    best_score_p95: f64,
    best_score_max: f64,
}

/// One query's answer from the words model.
#[derive(Debug, Serialize)]
struct Answer {
    query: String,
    group: String,
    top1: bool,
    top3: bool,
    answer: Vec<(String, String, f32)>,
}

#[derive(Debug, Serialize)]
struct Report {
    classes: usize,
    queries: usize,
    min_score: f32,
    max_classes: usize,
    accuracy: Vec<Accuracy>,
    costs: Costs,
    random: Random,
    answers: Vec<Answer>,
}

/// Runs the benchmark.
pub(crate) async fn run(args: WordsBench) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&args)).await?
}

fn run_blocking(args: &WordsBench) -> Result<()> {
    let classes = class_list(args)?;
    let queries = read_queries(&args.queries, &classes)?;
    let options = MatchOptions {
        min_score: args.min_score,
        max_classes: args.max_classes,
    };
    let mut costs = Costs::default();
    let mut matcher = None;
    for round in 0..args.rounds.max(1) {
        let m = build(args, &classes, options, &mut costs)?;
        time_queries(&m, &queries, &classes, &mut costs)?;
        eprintln!("round {} of {} done", round + 1, args.rounds.max(1));
        matcher = Some(m);
    }
    let matcher = matcher.context("no round ran")?;
    let open = matcher.with_options(MatchOptions {
        min_score: -1.0,
        ..options
    })?;
    let mut accuracy = vec![
        score_method(
            &format!("words, cut-off {:.2}", args.min_score),
            &queries,
            |q| answer_of(&matcher, q),
        )?,
        score_method("words, no cut-off", &queries, |q| answer_of(&open, q))?,
        score_method("control: exact/substring only", &queries, |q| {
            Ok(substring_answer(&classes, q, args.max_classes))
        })?,
    ];
    for seed in 0..args.rounds.max(1) as u64 {
        let (list, back) = shuffled(&classes, seed);
        let control = open.with_classes(list)?;
        accuracy.push(score_method(
            &format!("control: shuffled names, seed {seed}, no cut-off"),
            &queries,
            |q| {
                Ok(answer_of(&control, q)?
                    .into_iter()
                    .map(|c| back[&c].clone())
                    .collect())
            },
        )?);
    }
    let random = random_strings(&matcher, &open, args.random_strings)?;
    let answers = answers(&matcher, &queries)?;
    let report = Report {
        classes: classes.len(),
        queries: queries.len(),
        min_score: args.min_score,
        max_classes: args.max_classes,
        accuracy,
        costs,
        random,
        answers,
    };
    print_report(&report, &queries);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// ImageNet's classes as task `general`, then Fashion-MNIST's as task `fashion`.
fn class_list(args: &WordsBench) -> Result<Vec<ClassName>> {
    let path = args.model_dir.join("imagenet_classes.txt");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run tools/setup.sh)", path.display()))?;
    let general = text.lines().map(|c| ClassName::new(GENERAL, c));
    let fashion = ndpipe::fashion_mnist::CLASSES
        .iter()
        .map(|c| ClassName::new(FASHION, *c));
    Ok(general.chain(fashion).collect())
}

/// Loads the model and embeds the class names (writing the cache file), timing both; times a
/// build from that file and a rebuild that adds a task of 10 classes.
fn build(
    args: &WordsBench,
    classes: &[ClassName],
    options: MatchOptions,
    costs: &mut Costs,
) -> Result<ClassMatcher> {
    let started = Instant::now();
    let encoder = TextEncoder::load(&args.model_dir.join(WORDS_SUBDIR))?;
    costs.load_ms.push(ms(started));
    let encoder = Arc::new(encoder);
    let cache = tempfile::tempdir().context("a folder for the cache file")?;
    let started = Instant::now();
    ClassMatcher::build_cached(encoder.clone(), options, classes.to_vec(), cache.path())?;
    costs.build_ms.push(ms(started));
    let started = Instant::now();
    let matcher = ClassMatcher::build_cached(encoder, options, classes.to_vec(), cache.path())?;
    costs.cached_build_ms.push(ms(started));
    let cifar = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ];
    let mut more = classes.to_vec();
    more.extend(cifar.iter().map(|c| ClassName::new("cifar", *c)));
    let started = Instant::now();
    matcher.with_classes(more)?;
    costs.rebuild_ms.push(ms(started));
    Ok(matcher)
}

/// Answers every query once with the matcher and once with the substring control, timing each.
fn time_queries(
    matcher: &ClassMatcher,
    queries: &[Query],
    classes: &[ClassName],
    costs: &mut Costs,
) -> Result<()> {
    let mut words = Vec::new();
    let mut substring = Vec::new();
    for q in queries {
        let started = Instant::now();
        matcher.match_query(&q.text)?;
        words.push(ms(started));
        let started = Instant::now();
        substring_answer(classes, &q.text, matcher.options().max_classes);
        substring.push(ms(started));
    }
    words.sort_by(f64::total_cmp);
    substring.sort_by(f64::total_cmp);
    costs.query_p50_ms.push(percentile(&words, 0.5));
    costs.query_p99_ms.push(percentile(&words, 0.99));
    costs.substring_p50_ms.push(percentile(&substring, 0.5));
    Ok(())
}

fn answer_of(matcher: &ClassMatcher, query: &str) -> Result<Vec<ClassName>> {
    Ok(matcher
        .match_query(query)?
        .into_iter()
        .map(|m| ClassName::new(m.task, m.class))
        .collect())
}

/// Top-1, top-3, top-1 per group and the share answered of one method.
fn score_method(
    method: &str,
    queries: &[Query],
    mut answer: impl FnMut(&str) -> Result<Vec<ClassName>>,
) -> Result<Accuracy> {
    let mut top1 = vec![false; queries.len()];
    let mut top3 = vec![false; queries.len()];
    let mut answered = 0;
    for (i, q) in queries.iter().enumerate() {
        let a = answer(&q.text)?;
        top1[i] = hit(q, &a, 1);
        top3[i] = hit(q, &a, 3);
        answered += usize::from(!a.is_empty());
    }
    let share = |hits: &[bool], group: Option<&str>| {
        let picked: Vec<bool> = queries
            .iter()
            .zip(hits)
            .filter(|(q, _)| group.is_none_or(|g| q.group == g))
            .map(|(_, &h)| h)
            .collect();
        picked.iter().filter(|&&h| h).count() as f64 / picked.len().max(1) as f64
    };
    Ok(Accuracy {
        method: method.to_string(),
        top1: share(&top1, None),
        top3: share(&top3, None),
        top1_by_group: GROUPS.iter().map(|g| share(&top1, Some(g))).collect(),
        answered: answered as f64 / queries.len().max(1) as f64,
    })
}

/// Seeded strings of one or two "words" of 3 to 8 random letters: the share the matcher
/// answers, and the best class score each gets with no cut-off.
fn random_strings(matcher: &ClassMatcher, open: &ClassMatcher, n: usize) -> Result<Random> {
    let mut rng = Pcg64Mcg::seed_from_u64(0x5eed);
    let mut answered = 0;
    let mut best = Vec::with_capacity(n);
    for _ in 0..n {
        let words = rng.random_range(1..=2);
        let text = (0..words)
            .map(|_| {
                let len = rng.random_range(3..=8);
                (0..len)
                    .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join(" ");
        answered += usize::from(!matcher.match_query(&text)?.is_empty());
        let top = open.match_query(&text)?;
        best.push(
            top.iter()
                .map(|m| f64::from(m.score))
                .fold(f64::MIN, f64::max),
        );
    }
    best.sort_by(f64::total_cmp);
    Ok(Random {
        strings: n,
        answered: answered as f64 / n.max(1) as f64,
        best_score_p50: percentile(&best, 0.5),
        best_score_p95: percentile(&best, 0.95),
        best_score_max: best.last().copied().unwrap_or(f64::NAN),
    })
}

fn answers(matcher: &ClassMatcher, queries: &[Query]) -> Result<Vec<Answer>> {
    queries
        .iter()
        .map(|q| {
            let got = matcher.match_query(&q.text)?;
            let names: Vec<ClassName> = got
                .iter()
                .map(|m| ClassName::new(m.task.clone(), m.class.clone()))
                .collect();
            Ok(Answer {
                query: q.text.clone(),
                group: q.group.clone(),
                top1: hit(q, &names, 1),
                top3: hit(q, &names, 3),
                answer: got
                    .into_iter()
                    .map(|m| (m.task, m.class, m.score))
                    .collect(),
            })
        })
        .collect()
}

fn print_report(r: &Report, queries: &[Query]) {
    let count = |g: &str| queries.iter().filter(|q| q.group == g).count();
    println!(
        "\nSearch in words: {} queries ({}) over {} classes in two tasks (general: ImageNet's \
         1000, fashion: Fashion-MNIST's 10); at most {} classes of each task per query.",
        r.queries,
        GROUPS.map(|g| format!("{} {g}", count(g))).join(", "),
        r.classes,
        r.max_classes
    );
    let reference = r
        .accuracy
        .iter()
        .find(|a| a.method.starts_with("control: exact"));
    println!(
        "\n| method | top-1 | top-3 | top-1 vs exact/substring | {} | answered |",
        GROUPS.map(|g| format!("top-1 {g}")).join(" | ")
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for a in &r.accuracy {
        let ratio = reference
            .filter(|c| c.top1 > 0.0)
            .map_or("-".into(), |c| format!("{:.2}x", a.top1 / c.top1));
        println!(
            "| {} | {:.1}% | {:.1}% | {ratio} | {} | {:.1}% |",
            a.method,
            100.0 * a.top1,
            100.0 * a.top3,
            a.top1_by_group
                .iter()
                .map(|t| format!("{:.1}%", 100.0 * t))
                .collect::<Vec<_>>()
                .join(" | "),
            100.0 * a.answered
        );
    }
    let c = &r.costs;
    let p50 = Spread::of(&c.query_p50_ms).mean;
    let sub = Spread::of(&c.substring_p50_ms).mean;
    println!(
        "\nCosts in ms, mean (min..max) of {} rounds: loading the model {}, embedding the class \
         names {} (from the cache file instead: {}), a rebuild adding a task of 10 classes {}; a \
         query p50 {} and p99 {} (the exact/substring control's p50 {:.3}, {:.0}x less).",
        c.load_ms.len(),
        Spread::of(&c.load_ms),
        Spread::of(&c.build_ms),
        Spread::of(&c.cached_build_ms),
        Spread::of(&c.rebuild_ms),
        Spread::of(&c.query_p50_ms),
        Spread::of(&c.query_p99_ms),
        sub,
        p50 / sub.max(f64::MIN_POSITIVE)
    );
    println!(
        "{} random strings of letters: {:.1}% answered at the cut-off {:.2}; their best class \
         score p50 {:.3}, p95 {:.3}, max {:.3}.",
        r.random.strings,
        100.0 * r.random.answered,
        r.min_score,
        r.random.best_score_p50,
        r.random.best_score_p95,
        r.random.best_score_max
    );
    println!("\nMisses of the words model (no acceptable class in its first 3):");
    for a in r.answers.iter().filter(|a| !a.top3) {
        let got: Vec<String> = a
            .answer
            .iter()
            .take(3)
            .map(|(task, class, score)| {
                let first = class.split(',').next().unwrap_or(class);
                format!("{task}:{first} {score:.2}")
            })
            .collect();
        println!(
            "- {} ({}): {}",
            a.query,
            a.group,
            if got.is_empty() {
                "nothing".into()
            } else {
                got.join(", ")
            }
        );
    }
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}
