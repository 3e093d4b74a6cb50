//! `ndpipe-bench fuzz`: builds the cargo-fuzz targets of `fuzz/` and runs each for a given
//! number of executions from its committed seeds, then prints one row per target: executions,
//! time, coverage at the start and the end (new coverage is the difference), corpus growth,
//! crashes, timeouts, out-of-memory stops and peak RSS, as libFuzzer reports them.
//!
//! The build is `cargo fuzz build -s none` (no sanitizer: the product forbids `unsafe`, and
//! AddressSanitizer needs a nightly compiler). It is optimised with debug assertions and
//! overflow checks, as cargo-fuzz builds by default, and works on the stable toolchain.
//! Each run starts from a fresh copy of `fuzz/corpus/<target>` and `fuzz/regressions/<target>`
//! in `fuzz/corpus-run/<target>`; a crashing input is written to `fuzz/artifacts/<target>/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;

/// Every fuzz target, in the order they run.
const TARGETS: [&str; 7] = [
    "volume",
    "tensor_blob",
    "head_file",
    "grpc",
    "preprocess",
    "s3",
    "idx",
];

/// Flags of `ndpipe-bench fuzz`.
#[derive(Debug, Args)]
pub(crate) struct FuzzBench {
    /// Executions of each target.
    #[arg(long, default_value_t = 1_000_000)]
    execs: u64,
    /// Targets to run (all when none is given).
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// The fuzz crate.
    #[arg(long, default_value = "fuzz")]
    fuzz_dir: PathBuf,
    /// An input that runs longer than this many seconds is a timeout.
    #[arg(long, default_value_t = 10)]
    timeout_secs: u64,
    /// A run whose memory exceeds this many MB stops as out-of-memory.
    #[arg(long, default_value_t = 2048)]
    rss_limit_mb: u64,
    /// Longest input the fuzzer generates, in bytes.
    #[arg(long, default_value_t = 65536)]
    max_len: u64,
    /// Use the targets already built instead of running `cargo fuzz build`.
    #[arg(long)]
    no_build: bool,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One target's run, as libFuzzer reported it.
#[derive(Debug, Default, serde::Serialize)]
struct Row {
    target: String,
    execs: u64,
    seconds: f64,
    execs_per_s: f64,
    seeds: usize,
    cov_start: u64,
    cov_end: u64,
    new_coverage: u64,
    corpus_end: u64,
    crashes: u32,
    timeouts: u32,
    ooms: u32,
    peak_rss_mb: u64,
    artifact: Option<String>,
}

/// Runs `ndpipe-bench fuzz`.
pub(crate) async fn run(args: FuzzBench) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&args)).await?
}

fn run_blocking(args: &FuzzBench) -> Result<()> {
    let targets: Vec<String> = if args.targets.is_empty() {
        TARGETS.iter().map(|t| t.to_string()).collect()
    } else {
        args.targets.clone()
    };
    if let Some(unknown) = targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        bail!(
            "no fuzz target {unknown:?}; the targets are {}",
            TARGETS.join(", ")
        );
    }
    let dir = &args.fuzz_dir;
    ensure!(
        dir.join("Cargo.toml").is_file(),
        "{} is not the fuzz crate (run from the repository root or pass --fuzz-dir)",
        dir.display()
    );
    if !args.no_build {
        build(dir)?;
    }
    println!(
        "bench fuzz: {} executions per target, timeout {} s per input, RSS limit {} MB",
        args.execs, args.timeout_secs, args.rss_limit_mb
    );
    let mut rows = Vec::new();
    for target in &targets {
        let row = run_target(args, target)?;
        print_row(&row, rows.is_empty());
        rows.push(row);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.crashes + r.timeouts + r.ooms > 0)
        .map(|r| r.target.as_str())
        .collect();
    ensure!(
        failed.is_empty(),
        "fuzz targets that failed: {}",
        failed.join(", ")
    );
    Ok(())
}

/// `cargo fuzz build -s none`: optimised, debug assertions and overflow checks on, no
/// sanitizer, 16 codegen units (a faster build on a small machine).
fn build(dir: &Path) -> Result<()> {
    println!("building the fuzz targets: cargo fuzz build -s none --codegen-units 16");
    let status = Command::new("cargo")
        .args([
            "fuzz",
            "build",
            "-s",
            "none",
            "--codegen-units",
            "16",
            "--fuzz-dir",
        ])
        .arg(dir)
        .status()
        .context("running cargo fuzz (install it with `cargo install cargo-fuzz`)")?;
    ensure!(status.success(), "cargo fuzz build failed: {status}");
    Ok(())
}

/// The built binary of `target`.
fn binary(dir: &Path, target: &str) -> PathBuf {
    dir.join("target/x86_64-unknown-linux-gnu/release")
        .join(target)
}

/// A fresh working corpus of `target`: its seeds and kept crashes.
fn working_corpus(dir: &Path, target: &str) -> Result<(PathBuf, usize)> {
    let work = dir.join("corpus-run").join(target);
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    let mut seeds = 0;
    for sub in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            if path.is_file() {
                let name = format!(
                    "{sub}-{}",
                    path.file_name().unwrap_or_default().to_string_lossy()
                );
                std::fs::copy(&path, work.join(name))?;
                seeds += 1;
            }
        }
    }
    Ok((work, seeds))
}

fn run_target(args: &FuzzBench, target: &str) -> Result<Row> {
    let dir = &args.fuzz_dir;
    let exe = binary(dir, target);
    ensure!(exe.is_file(), "{} is not built", exe.display());
    let (corpus, seeds) = working_corpus(dir, target)?;
    let artifacts = dir.join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts)?;
    let started = Instant::now();
    let output = Command::new(&exe)
        .arg(format!("-runs={}", args.execs))
        .arg(format!("-timeout={}", args.timeout_secs))
        .arg(format!("-rss_limit_mb={}", args.rss_limit_mb))
        .arg(format!("-max_len={}", args.max_len))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .arg(&corpus)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&output.stderr);
    std::fs::write(artifacts.join("last-run.log"), log.as_bytes())?;
    let mut row = parse(&log);
    row.target = target.to_string();
    row.seconds = seconds;
    row.seeds = seeds;
    row.execs_per_s = row.execs as f64 / seconds.max(1e-9);
    if !output.status.success() && row.crashes + row.timeouts + row.ooms == 0 {
        row.crashes = 1;
    }
    Ok(row)
}

/// The figures of a libFuzzer log: coverage when the seeds were loaded (`INITED`) and at the
/// end, the final stats, and how it stopped.
fn parse(log: &str) -> Row {
    let mut row = Row::default();
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(name)? + name.len();
        line[at..]
            .split_whitespace()
            .next()?
            .trim_end_matches("Mb")
            .split('/')
            .next()?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if line.contains("INITED") {
            row.cov_start = field(line, "cov: ").unwrap_or(0);
        }
        if line.starts_with('#') {
            if let Some(cov) = field(line, "cov: ") {
                row.cov_end = cov;
            }
            if let Some(corp) = field(line, "corp: ") {
                row.corpus_end = corp;
            }
        }
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units: ") {
            row.execs = v.trim().parse().unwrap_or(0);
        }
        if let Some(v) = line.strip_prefix("stat::peak_rss_mb: ") {
            row.peak_rss_mb = v.trim().parse().unwrap_or(0);
        }
        if line.contains("ERROR: libFuzzer: timeout") {
            row.timeouts += 1;
        } else if line.contains("ERROR: libFuzzer: out-of-memory") {
            row.ooms += 1;
        } else if line.contains("ERROR: libFuzzer: deadly signal")
            || line.contains("ERROR: libFuzzer: fuzz target exited")
        {
            row.crashes += 1;
        }
        if let Some(at) = line.find("Test unit written to ") {
            row.artifact = Some(
                line[at + "Test unit written to ".len()..]
                    .trim()
                    .to_string(),
            );
        }
    }
    row.new_coverage = row.cov_end.saturating_sub(row.cov_start);
    row
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:<12} {:>10} {:>8} {:>9} {:>6} {:>15} {:>7} {:>7} {:>7} {:>8} {:>5} {:>9}",
            "target",
            "execs",
            "seconds",
            "execs/s",
            "seeds",
            "cov start->end",
            "new cov",
            "corpus",
            "crashes",
            "timeouts",
            "ooms",
            "peak RSS"
        );
    }
    println!(
        "{:<12} {:>10} {:>8.0} {:>9.0} {:>6} {:>15} {:>7} {:>7} {:>7} {:>8} {:>5} {:>6} MB",
        r.target,
        r.execs,
        r.seconds,
        r.execs_per_s,
        r.seeds,
        format!("{} -> {}", r.cov_start, r.cov_end),
        r.new_coverage,
        r.corpus_end,
        r.crashes,
        r.timeouts,
        r.ooms,
        r.peak_rss_mb
    );
    if let Some(a) = &r.artifact {
        println!("  {}: crashing input kept at {a}", r.target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libfuzzer_log_gives_its_figures() {
        let log = "INFO: seed corpus: files: 3 min: 5b max: 99b total: 120b rss: 30Mb\n\
#4\tINITED cov: 120 ft: 150 corp: 3/120b exec/s: 0 rss: 31Mb\n\
#1000\tNEW    cov: 130 ft: 170 corp: 5/200b lim: 4 exec/s: 0 rss: 32Mb\n\
#100000\tDONE   cov: 141 ft: 190 corp: 9/400b lim: 100 exec/s: 33333 rss: 40Mb\n\
Done 100000 runs in 3 second(s)\n\
stat::number_of_executed_units: 100000\n\
stat::peak_rss_mb: 40\n";
        let row = parse(log);
        assert_eq!(
            (row.cov_start, row.cov_end, row.new_coverage),
            (120, 141, 21)
        );
        assert_eq!(
            (row.execs, row.peak_rss_mb, row.corpus_end),
            (100000, 40, 9)
        );
        assert_eq!(row.crashes + row.timeouts + row.ooms, 0);
        let crashed = parse(
            "==1== ERROR: libFuzzer: deadly signal\nTest unit written to fuzz/artifacts/x/crash-ab\n",
        );
        assert_eq!(crashed.crashes, 1);
        assert_eq!(
            crashed.artifact.as_deref(),
            Some("fuzz/artifacts/x/crash-ab")
        );
    }
}
