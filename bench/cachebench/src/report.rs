//! What a person reads: markdown tables, the targets of issue 5, SVG line
//! plots of hit ratio and accuracy per epoch, and the JSON of everything.

use std::fmt::Write as _;
use std::path::Path;

use crate::bench::BenchResults;
use crate::error::Result;
use crate::replay::ReplayResult;
use crate::train::RunResult;

/// One line summarising a finished run.
pub fn run_line(r: &RunResult) -> String {
    format!(
        "{:<22} {:>4.0}%  hit {:.3}  acc {:.3}  epoch {:.2} s  stall {:.2} s",
        r.policy,
        r.cache_fraction * 100.0,
        r.hit_ratio(),
        r.final_accuracy(),
        r.mean_epoch_time(),
        r.mean_stall()
    )
}

fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// The runs at `fraction`, with the no-cache run first.
fn at(results: &BenchResults, fraction: f64) -> Vec<&RunResult> {
    results
        .runs
        .iter()
        .filter(|r| r.policy == "nocache" || r.cache_fraction == fraction)
        .collect()
}

fn find<'a>(runs: &[&'a RunResult], policy: &str) -> Option<&'a RunResult> {
    runs.iter().copied().find(|r| r.policy == policy)
}

/// The markdown report: one table per cache size, per-epoch hit ratio and
/// accuracy, and the targets.
pub fn markdown(results: &BenchResults) -> String {
    let c = &results.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# cachebench: {} train / {} test Fashion-MNIST photos, {} epochs, batch {}\n\n\
         Storage model: {:.2} ms per miss{}; a miss took {:.3} ms on average \
         (loopback HTTP included), a hit is a memory read. Setup {:.0} s, total {:.0} s.\n",
        c.train,
        c.test,
        c.epochs,
        c.batch_size,
        c.storage.latency.as_secs_f64() * 1e3,
        c.storage.bandwidth.map_or(String::new(), |b| format!(
            ", {:.1} MiB/s cap",
            b as f64 / 1048576.0
        )),
        results.mean_miss_s * 1e3,
        results.setup_s,
        results.wall_s,
    );
    for &f in &c.cache_fractions {
        let runs = at(results, f);
        let base = find(&runs, "nocache");
        let lru = find(&runs, "lru");
        let _ = writeln!(
            s,
            "## Cache {}\n\n\
             | policy | steers | hit | exact | subst | miss | final acc | Δacc vs nocache (pp) | epoch s | vs LRU | stall s | scoring s | index KiB | t→{} s |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            pct(f),
            pct(c.target_accuracy)
        );
        for r in &runs {
            let req: u64 = r.epochs.iter().map(|e| e.requests).sum::<u64>().max(1);
            let share = |x: fn(&crate::train::EpochResult) -> u64| {
                r.epochs.iter().map(x).sum::<u64>() as f64 / req as f64
            };
            let last = r.epochs.last();
            let _ = writeln!(
                s,
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.2} | {} | {:.2} | {:.3} | {} | {} |",
                r.policy,
                if r.steers_sampling { "yes" } else { "no" },
                r.hit_ratio(),
                share(|e| e.exact_hits),
                share(|e| e.substitutes),
                share(|e| e.misses),
                r.final_accuracy(),
                base.map_or("-".into(), |b| format!(
                    "{:+.1}",
                    (r.final_accuracy() - b.final_accuracy()) * 100.0
                )),
                r.mean_epoch_time(),
                lru.map_or("-".into(), |l| format!(
                    "{:.2}x",
                    r.mean_epoch_time() / l.mean_epoch_time()
                )),
                r.mean_stall(),
                r.epochs.iter().map(|e| e.scoring_s).sum::<f64>() / r.epochs.len().max(1) as f64,
                last.map_or(0, |e| e.index_memory_bytes / 1024),
                r.time_to_target_s.map_or("-".into(), |t| format!("{t:.1}")),
            );
        }
        let _ = writeln!(
            s,
            "\nPer epoch, hit ratio / validation accuracy:\n\n| policy | {} |\n|---|{}",
            (0..c.epochs)
                .map(|e| format!("e{e}"))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(c.epochs as usize)
        );
        for r in &runs {
            let cells: Vec<String> = r
                .epochs
                .iter()
                .map(|e| format!("{:.2} / {:.3}", e.hit_ratio(), e.val_accuracy))
                .collect();
            let _ = writeln!(s, "| {} | {} |", r.policy, cells.join(" | "));
        }
        s.push('\n');
    }
    s.push_str(&targets(results));
    s
}

/// The targets of issue 5 at the smallest cache size, met or not.
pub fn targets(results: &BenchResults) -> String {
    let Some(&f) = results
        .config
        .cache_fractions
        .iter()
        .min_by(|a, b| a.total_cmp(b))
    else {
        return String::new();
    };
    let runs = at(results, f);
    let mut s = format!("## Targets at {} cache\n\n", pct(f));
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for spider in ["spidercache", "spidercache+homophily"] {
        let Some(sp) = find(&runs, spider) else {
            continue;
        };
        for peer in ["shade", "icache"] {
            if let Some(p) = find(&runs, peer) {
                let _ = writeln!(
                    s,
                    "- {spider} hit ratio {:.3} >= {peer}'s {:.3}: {}",
                    sp.hit_ratio(),
                    p.hit_ratio(),
                    verdict(sp.hit_ratio() >= p.hit_ratio())
                );
            }
        }
        if let Some(b) = find(&runs, "nocache") {
            let delta = (sp.final_accuracy() - b.final_accuracy()) * 100.0;
            let _ = writeln!(
                s,
                "- {spider} final accuracy {:.3} vs no-cache {:.3} ({delta:+.1} pp, within 1 pp): {}",
                sp.final_accuracy(),
                b.final_accuracy(),
                verdict(delta >= -1.0)
            );
        }
        if let Some(l) = find(&runs, "lru") {
            let _ = writeln!(
                s,
                "- {spider} epoch time {:.2} s < LRU's {:.2} s: {}",
                sp.mean_epoch_time(),
                l.mean_epoch_time(),
                verdict(sp.mean_epoch_time() < l.mean_epoch_time())
            );
        }
    }
    s
}

/// The replay report: hit ratios per policy and cache size, flagging the
/// policies whose replay is approximate.
pub fn replay_markdown(results: &[ReplayResult]) -> String {
    let mut s = String::from(
        "| policy | cache | steers sampling | hit | exact | subst | miss |\n|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let (mut e, mut sub, mut m) = (0u64, 0u64, 0u64);
        for ep in &r.epochs {
            e += ep.exact_hits;
            sub += ep.substitutes;
            m += ep.misses;
        }
        let all = (e + sub + m).max(1) as f64;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.policy,
            pct(r.cache_fraction),
            if r.steers_sampling {
                "yes: approximate"
            } else {
                "no: exact"
            },
            r.hit_ratio(),
            e as f64 / all,
            sub as f64 / all,
            m as f64 / all
        );
    }
    let steering: Vec<&str> = results
        .iter()
        .filter(|r| r.steers_sampling)
        .map(|r| r.policy.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !steering.is_empty() {
        let _ = writeln!(
            s,
            "\nReplay is exact only for policies that do not steer sampling. {} choose what is \
             trained from the model's feedback, so their replayed hit ratios approximate a real run.",
            steering.join(", ")
        );
    }
    s
}

const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// An SVG line chart of one series per policy over epochs, y in `0..=1`.
pub fn line_chart(title: &str, y_label: &str, series: &[(String, Vec<f64>)]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 420.0, 60.0, 190.0, 40.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let n = series
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let x = |i: usize| left + pw * i as f64 / (n - 1) as f64;
    let y = |v: f64| top + ph * (1.0 - v.clamp(0.0, 1.0));
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{title}</text>\n\
         <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{y_label}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">epoch</text>\n",
        left + pw / 2.0,
        top + ph / 2.0,
        top + ph / 2.0,
        left + pw / 2.0,
        h - 12.0
    );
    for t in 0..=10 {
        let v = t as f64 / 10.0;
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.1}</text>",
            left + pw,
            left - 6.0,
            y(v) + 4.0,
            yy = y(v)
        );
    }
    for i in 0..n {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{i}</text>",
            x(i),
            top + ph + 18.0
        );
    }
    for (k, (name, values)) in series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| format!("{:.1},{:.1}", x(i), y(v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n\
             <rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{color}\"/>\
             <text x=\"{}\" y=\"{}\">{name}</text>",
            points.join(" "),
            left + pw + 16.0,
            top + 20.0 * k as f64 + 6.0,
            left + pw + 36.0,
            top + 20.0 * k as f64 + 12.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Writes `results.json`, `results.md` and, per cache size,
/// `hit_ratio_<pct>.svg` and `accuracy_<pct>.svg` into `dir`.
pub fn write_all(results: &BenchResults, dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(dir.join("results.md"), markdown(results))?;
    for &f in &results.config.cache_fractions {
        let runs = at(results, f);
        let p = (f * 100.0).round();
        let series = |g: fn(&crate::train::EpochResult) -> f64| -> Vec<(String, Vec<f64>)> {
            runs.iter()
                .map(|r| (r.policy.clone(), r.epochs.iter().map(g).collect()))
                .collect()
        };
        std::fs::write(
            dir.join(format!("hit_ratio_{p}.svg")),
            line_chart(
                &format!("Hit ratio (exact + substitute), cache {p}%"),
                "hit ratio",
                &series(|e| e.hit_ratio()),
            ),
        )?;
        std::fs::write(
            dir.join(format!("accuracy_{p}.svg")),
            line_chart(
                &format!("Validation top-1, cache {p}%"),
                "accuracy",
                &series(|e| e.val_accuracy),
            ),
        )?;
    }
    Ok(())
}
