//! What a person reads: markdown tables of means and spreads over seeds,
//! SpiderCache's per-epoch diagnostics, the targets of issue 12 met or not,
//! PNG plots, and the JSON of everything.

use std::fmt::Write as _;
use std::path::Path;

use crate::bench::BenchResults;
use crate::error::Result;
use crate::metrics::RunResult;
use crate::model::ModelKind;
use crate::replay::ReplayResult;
use crate::summary::PolicySummary;

/// One line summarising a finished run.
pub fn run_line(r: &RunResult) -> String {
    format!(
        "{} {:<22} {:>4.0}% seed {:<3} reads/req {:.3}  exact {:.3}  subst {:.3}  acc {:.3}  epoch {:.2} s",
        r.model,
        r.policy,
        r.cache_fraction * 100.0,
        r.seed,
        r.reads_per_request(),
        r.exact_ratio(),
        r.substitute_ratio(),
        r.final_accuracy(),
        r.mean_epoch_time(),
    )
}

fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// The summaries of `model` at `fraction`, with the no-cache one first.
fn at(results: &BenchResults, model: ModelKind, fraction: f64) -> Vec<&PolicySummary> {
    results
        .summaries
        .iter()
        .filter(|s| s.model == model && (s.policy == "nocache" || s.cache_fraction == fraction))
        .collect()
}

/// Every (model, cache size) pair the configuration ran, in order.
fn tables(results: &BenchResults) -> Vec<(ModelKind, f64)> {
    let c = &results.config;
    c.models
        .iter()
        .flat_map(|&m| c.cache_fractions.iter().map(move |&f| (m, f)))
        .collect()
}

fn find<'a>(rows: &[&'a PolicySummary], policy: &str) -> Option<&'a PolicySummary> {
    rows.iter().copied().find(|s| s.policy == policy)
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The markdown report: per cache size, a table of means ± spreads over the
/// seeds, reads and accuracy per epoch, SpiderCache's diagnostics; then the
/// issue's targets.
pub fn markdown(results: &BenchResults) -> String {
    let c = &results.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# cachebench: {} train / {} test Fashion-MNIST photos, {} epochs, batch {}, {} seeds\n\n\
         Policy seeds {}..{}, model seeds {}..{}. Storage model: {:.2} ms per read{}; a read \
         took {:.3} ms on average (loopback HTTP included). Setup {:.0} s, total {:.0} s. \
         Figures are means ± sample standard deviations over the seeds; reads/req counts the \
         loop's misses and the policy's own reads (representatives, iCache's stream, Quiver's \
         packages); distinct is the share of the training set trained per epoch.\n",
        c.train,
        c.test,
        c.epochs,
        c.batch_size,
        c.seeds,
        c.seed,
        c.seed + c.seeds as u64 - 1,
        c.model.seed,
        c.model.seed + c.seeds as u64 - 1,
        c.storage.latency.as_secs_f64() * 1e3,
        c.storage.bandwidth.map_or(String::new(), |b| format!(
            ", {:.1} MiB/s cap",
            b as f64 / 1048576.0
        )),
        results.mean_miss_s * 1e3,
        results.setup_s,
        results.wall_s,
    );
    for (model, f) in tables(results) {
        let rows = at(results, model, f);
        let _ = writeln!(
            s,
            "## {}, cache {}\n\n\
             | policy | reads/req | exact | subst | distinct | steps | top-1 | Δ vs nocache (pp) | epoch s | t→{} modelled s (seeds) |\n\
             |---|---|---|---|---|---|---|---|---|---|",
            model.name().to_uppercase(),
            pct(f),
            pct(c.target_for(model))
        );
        for r in &rows {
            let _ = writeln!(
                s,
                "| {} | {:.3} ± {:.3} | {:.3} | {:.3} ± {:.3} | {:.2} | {:.0} | {:.3} ± {:.3} | {} | {:.2} ± {:.2} | {} ({}) |",
                r.policy,
                r.reads_per_request,
                r.reads_per_request_sd,
                r.exact_ratio,
                r.substitute_ratio,
                r.substitute_ratio_sd,
                r.distinct_per_epoch,
                r.steps,
                r.top1_mean,
                r.top1_sd,
                match (r.top1_gap_pp, r.top1_gap_sd_pp) {
                    (Some(m), Some(sd)) => format!("{m:+.1} ± {sd:.1}"),
                    _ => "-".into(),
                },
                r.epoch_time_s,
                r.epoch_time_sd,
                opt(r.modelled_time_to_target_s, 1),
                r.reached_target,
            );
        }
        let _ = writeln!(
            s,
            "\nPer epoch, reads per request / validation top-1 (means):\n\n| policy | {} |\n|---|{}",
            (0..c.epochs)
                .map(|e| format!("e{e}"))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(c.epochs as usize)
        );
        for r in &rows {
            let cells: Vec<String> = r
                .per_epoch
                .iter()
                .map(|e| format!("{:.2} / {:.3}", e.reads_per_request, e.val_accuracy))
                .collect();
            let _ = writeln!(s, "| {} | {} |", r.policy, cells.join(" | "));
        }
        s.push('\n');
        s.push_str(&diagnostics(results, model, f));
    }
    for &model in &c.models {
        s.push_str(&targets(results, model));
    }
    s
}

/// SpiderCache's scan and homophily cache per epoch, for the first seed.
fn diagnostics(results: &BenchResults, model: ModelKind, fraction: f64) -> String {
    let mut s = String::new();
    let seed = results.config.seed;
    for r in results.runs.iter().filter(|r| {
        r.model == model
            && r.seed == seed
            && r.cache_fraction == fraction
            && r.policy.starts_with("spidercache")
    }) {
        let _ = writeln!(
            s,
            "{} with the {model} (seed {seed}), per epoch:\n\n\
             | epoch | score p10 / p50 / p90 | with a same-label neighbour | same / other | radius² | importance share | reps / covered | subst |\n\
             |---|---|---|---|---|---|---|---|",
            r.policy
        );
        for e in &r.epochs {
            let scan = e.scan.map_or("- | - | - | -".into(), |x| {
                format!(
                    "{:.3} / {:.3} / {:.3} | {:.2} | {:.2} / {:.2} | {:.1}",
                    x.score_p10,
                    x.score_p50,
                    x.score_p90,
                    x.with_same,
                    x.same_mean,
                    x.other_mean,
                    x.radius_p50
                )
            });
            let h = e.homophily.map_or("-".into(), |h| {
                format!("{} / {}", h.representatives, h.covered)
            });
            let _ = writeln!(
                s,
                "| {} | {scan} | {} | {h} | {} |",
                e.epoch,
                opt(e.importance_share, 2),
                e.substitutes
            );
        }
        s.push('\n');
    }
    s
}

/// The targets of issue 12 for `model` at the smallest cache size, met or not.
pub fn targets(results: &BenchResults, model: ModelKind) -> String {
    let Some(&f) = results
        .config
        .cache_fractions
        .iter()
        .min_by(|a, b| a.total_cmp(b))
    else {
        return String::new();
    };
    let rows = at(results, model, f);
    if rows.is_empty() {
        return String::new();
    }
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut s = format!(
        "## Targets of issue 12, {}, at {} cache ({} seeds)\n\n",
        model.name().to_uppercase(),
        pct(f),
        results.config.seeds
    );
    let lowest = rows
        .iter()
        .min_by(|a, b| a.reads_per_request.total_cmp(&b.reads_per_request));
    let base = find(&rows, "nocache");
    let plain = find(&rows, "spidercache");
    for spider in ["spidercache+homophily", "spidercache"] {
        let Some(sp) = find(&rows, spider) else {
            continue;
        };
        let _ = writeln!(
            s,
            "- {spider} reads per request {:.3} ± {:.3} <= 0.50: {}",
            sp.reads_per_request,
            sp.reads_per_request_sd,
            verdict(sp.reads_per_request <= 0.50)
        );
        if let Some(low) = lowest {
            let _ = writeln!(
                s,
                "- {spider} has the fewest reads per request (lowest: {} at {:.3}): {}",
                low.policy,
                low.reads_per_request,
                verdict(low.policy == sp.policy)
            );
        }
        if spider.ends_with("homophily") {
            let _ = writeln!(
                s,
                "- {spider} substitutes {:.3} ± {:.3} of requests >= 0.05 (same-label share of \
                 the neighbours in the radius {}; substitutes are same-label by construction): {}",
                sp.substitute_ratio,
                sp.substitute_ratio_sd,
                opt(sp.neighbour_purity, 2),
                verdict(sp.substitute_ratio >= 0.05)
            );
        }
        if let (Some(m), Some(sd)) = (sp.top1_gap_pp, sp.top1_gap_sd_pp) {
            let _ = writeln!(
                s,
                "- {spider} top-1 {:.3} ± {:.3}, {m:+.1} ± {sd:.1} pp from no-cache's {}: within 1 pp: {}",
                sp.top1_mean,
                sp.top1_sd,
                base.map_or("-".into(), |b| format!("{:.3}", b.top1_mean)),
                verdict(m >= -1.0)
            );
        }
        if let Some(p) = plain.filter(|p| p.policy != sp.policy) {
            let d = (sp.top1_mean - p.top1_mean) * 100.0;
            let _ = writeln!(
                s,
                "- {spider} top-1 {d:+.1} pp from spidercache without homophily: within 1 pp: {}",
                verdict(d >= -1.0)
            );
        }
        let _ = writeln!(
            s,
            "- {spider} trains {:.2} of the samples per epoch >= 0.40: {}",
            sp.distinct_per_epoch,
            verdict(sp.distinct_per_epoch >= 0.40)
        );
        let faster = rows.iter().filter(|p| p.policy != sp.policy).all(|p| {
            match (sp.modelled_time_to_target_s, p.modelled_time_to_target_s) {
                (Some(a), Some(b)) => a < b && sp.reached_target >= p.reached_target,
                (Some(_), None) => true,
                (None, _) => false,
            }
        });
        let _ = writeln!(
            s,
            "- {spider} modelled time to {} ({} s, reached by {} of {} seeds) below every peer's: {}",
            pct(results.config.target_for(model)),
            opt(sp.modelled_time_to_target_s, 1),
            sp.reached_target,
            sp.seeds,
            verdict(faster)
        );
    }
    s.push('\n');
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

/// Writes `results.json`, `results.md` and, per model and cache size,
/// `<model>_reads_<pct>.png`, `<model>_hit_ratio_<pct>.png` and
/// `<model>_accuracy_<pct>.png` (means over seeds) into `dir`. Without a
/// font the plots are skipped and the report says why.
pub fn write_all(results: &BenchResults, dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    let mut md = markdown(results);
    for (model, f) in tables(results) {
        let rows = at(results, model, f);
        let p = (f * 100.0).round();
        let (m, title) = (model.name(), model.name().to_uppercase());
        let series = |g: fn(&crate::summary::EpochMeans) -> f64| -> Vec<(String, Vec<f64>)> {
            rows.iter()
                .map(|r| (r.policy.clone(), r.per_epoch.iter().map(g).collect()))
                .collect()
        };
        let charts = [
            (
                format!("{m}_reads_{p}.png"),
                format!("{title}: storage reads per request, cache {p}%"),
                "reads per request",
                series(|e| e.reads_per_request),
            ),
            (
                format!("{m}_hit_ratio_{p}.png"),
                format!("{title}: hit ratio (exact + substitute), cache {p}%"),
                "hit ratio",
                series(|e| e.hit_ratio),
            ),
            (
                format!("{m}_accuracy_{p}.png"),
                format!("{title}: validation top-1, cache {p}%"),
                "top-1",
                series(|e| e.val_accuracy),
            ),
        ];
        for (file, title, y, data) in charts {
            let values = || data.iter().flat_map(|(_, v)| v.iter().copied());
            // Ratios from 0; accuracies over their own span, so that the curves part.
            let span = if y == "top-1" {
                let lo = values().fold(1.0, f64::min);
                let hi = values().fold(0.0, f64::max);
                (lo - 0.02).max(0.0)..(hi + 0.02).min(1.0)
            } else {
                0.0..values().fold(1.0, f64::max)
            };
            if let Err(e) = crate::plot::line_chart(&dir.join(&file), &title, y, span, &data) {
                let _ = writeln!(md, "\n{file} not drawn: {e}");
            }
        }
    }
    std::fs::write(dir.join("results.md"), md)?;
    Ok(())
}
