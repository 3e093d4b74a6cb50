//! The slow-node case of `ndpipe-bench rollout`: two emulated PipeStores, the second one's
//! model capped at the first one's rate divided by `--slowdown`, and `--rounds` rollouts over
//! them. The proportional ideal is both nodes busy with the model until the end, each with a
//! share of the photos in proportion to its rate: `photos / (sum of the nodes' model-only
//! rates)`, the rates each node timed in the same job. Completion is the job's extraction phase
//! (from the first extraction call to the last take-over's end). Target: at most 1.15x the
//! ideal.
//!
//! The table is appended to `OUT/rollout.md`, the plot goes to `OUT/rollout-slow.png`.

use std::path::Path;

use anyhow::Result;
use ndpipe_tuner::RolloutReport;
use serde::Serialize;

use crate::cluster::{Cluster, Photo};
use crate::emulated::{Spread, chart};
use crate::rollout::backbone_variant;

/// The completion a rollout with a slow node should reach, as a multiple of the ideal.
const TARGET: f64 = 1.15;

/// The slow-node rollouts' figures.
#[derive(Debug, Serialize)]
pub(crate) struct SlowResults {
    slowdown: f64,
    node_images_per_second: [f64; 2],
    photos: u64,
    rounds: Vec<SlowRound>,
    completion: Spread,
    ideal: Spread,
    over_ideal: Spread,
}

/// One rollout with a slow node.
#[derive(Debug, Serialize)]
struct SlowRound {
    seconds: f64,
    ideal_seconds: f64,
    model_only: [f64; 2],
    /// Photos the slow node gave away.
    given: u64,
    /// Photos the fast node extracted for the slow one.
    taken: u64,
}

/// Rollouts over a fast and a `slowdown` times slower emulated PipeStore, `rounds` times,
/// with `photos` spread over them; `variant` numbers the backbones made.
pub(crate) async fn run(
    photos: &[Photo],
    model_dir: &Path,
    variants: &Path,
    variant: &mut u8,
    (rate, slowdown, rounds): (f64, f64, usize),
) -> Result<SlowResults> {
    let rates = [rate, rate / slowdown];
    let cluster = Cluster::start_with_rates(photos, model_dir, &rates).await?;
    let mut done = Vec::new();
    for round in 0..rounds {
        *variant += 1;
        let upload = backbone_variant(model_dir, variants, *variant)?;
        let (added, _) = cluster.tuner().add_backbone(upload).await?;
        eprintln!(
            "  a fast and a {slowdown}x slower emulated PipeStore, rollout of backbone {} (round {round})",
            &added.backbone[..12]
        );
        done.push(measure(
            &cluster.tuner().rollout(&added.backbone, false).await?,
        ));
    }
    cluster.stop().await?;
    let of = |f: fn(&SlowRound) -> f64| Spread::of(&done.iter().map(f).collect::<Vec<_>>());
    Ok(SlowResults {
        slowdown,
        node_images_per_second: rates,
        photos: photos.len() as u64,
        completion: of(|r| r.seconds),
        ideal: of(|r| r.ideal_seconds),
        over_ideal: of(|r| r.seconds / r.ideal_seconds),
        rounds: done,
    })
}

fn measure(r: &RolloutReport) -> SlowRound {
    let rate = |i: usize| {
        r.nodes
            .get(i)
            .map_or(0.0, |n| n.model_only_images_per_second)
    };
    let model_only = [rate(0), rate(1)];
    SlowRound {
        seconds: r.extract_seconds,
        ideal_seconds: r.photos as f64 / (model_only[0] + model_only[1]).max(1e-9),
        model_only,
        given: r.nodes.get(1).map_or(0, |n| n.given),
        taken: r.nodes.first().map_or(0, |n| n.taken),
    }
}

/// The slow-node table.
pub(crate) fn table(r: &SlowResults) -> String {
    let mut out = format!(
        "\nWith a {}x slower node: 2 emulated PipeStores capped at {:.1} and {:.1} images/s, {} photos, {} rounds (mean, min..max).\n\n",
        r.slowdown,
        r.node_images_per_second[0],
        r.node_images_per_second[1],
        r.photos,
        r.rounds.len()
    );
    out.push_str(
        "| round | extraction phase s | ideal s (photos / sum of model-only rates) | ratio | model-only photos/s (fast, slow) | given by the slow node | taken by the fast node |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    for (i, round) in r.rounds.iter().enumerate() {
        out.push_str(&format!(
            "| {i} | {:.1} | {:.1} | {:.2} | {:.1}, {:.1} | {} | {} |\n",
            round.seconds,
            round.ideal_seconds,
            round.seconds / round.ideal_seconds,
            round.model_only[0],
            round.model_only[1],
            round.given,
            round.taken
        ));
    }
    out.push_str(&format!(
        "\nCompletion {} s against an ideal of {} s: {:.2}x ({:.2}..{:.2}), target at most {TARGET}x: {}.\n",
        r.completion,
        r.ideal,
        r.over_ideal.mean,
        r.over_ideal.min,
        r.over_ideal.max,
        if r.over_ideal.mean <= TARGET {
            "met"
        } else {
            "missed"
        }
    ));
    out
}

/// Completion and ideal per round.
pub(crate) fn plot(r: &SlowResults, out: &Path) -> Result<()> {
    let x: Vec<f64> = (0..r.rounds.len()).map(|i| i as f64).collect();
    chart(
        &out.join("rollout-slow.png"),
        &format!("Backbone rollout with a {}x slower node", r.slowdown),
        "round",
        "seconds",
        &x,
        vec![
            (
                "extraction phase".into(),
                r.rounds.iter().map(|d| d.seconds).collect(),
            ),
            (
                "proportional ideal".into(),
                r.rounds.iter().map(|d| d.ideal_seconds).collect(),
            ),
        ],
    )
}
