//! `ndpipe-bench console`: the web console's pages rendered server-side at `--photos` photos.
//! A PipeStore without a model runs in this process; the photos are small PNGs uploaded over
//! HTTP (each a photo of its own), a task is created and every photo given a class of it (the
//! label & train page counts them), and a tenth are uploaded twice so the duplicates page has
//! groups. The photos are 4x4 blocks of related colours, whose perceptual hashes pair about one
//! photo pair in a hundred at the default threshold (one near group of nearly every photo), or
//! with `--distinct` 8x8 blocks of random colours, which pair about as rarely as distinct real
//! photos. Once the hashing worker has hashed every photo, each page is fetched over HTTP
//! `--rounds` times (after one unmeasured warm-up fetch) and its median and spread printed
//! against the target of 100 ms, then what the near level found. Thumbnails are
//! separate requests the browser makes; they are not part of a page's time. Without a model
//! there is no search by class (409) and no Tuner (the registry says so): those rows time an
//! error answer, and say so.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Args;
use futures::StreamExt;
use serde_json::json;

use crate::cluster::store_config;

/// The target of issue 24: a page in under 100 ms server-side.
const TARGET_MS: f64 = 100.0;
/// Uploads in flight at once.
const IN_FLIGHT: usize = 16;
/// Photos labelled per call of `POST /v1/tasks/{task}/labels` (its limit).
const LABEL_BATCH: usize = 10_000;
/// The classes the photos get, round-robin.
const CLASSES: [&str; 4] = ["shirt", "trouser", "dress", "bag"];

/// Flags of `ndpipe-bench console`.
#[derive(Debug, Args)]
pub(crate) struct ConsoleBench {
    /// Photos in the store.
    #[arg(long, default_value_t = 100_000)]
    photos: usize,
    /// Measured fetches of each page.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Where the store keeps its data (default: a temporary folder).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Photos of 8x8 blocks of random colours, which few pairs of perceptual hashes link,
    /// instead of 4x4 blocks of related colours, which link about one pair in a hundred.
    #[arg(long)]
    distinct: bool,
}

/// Runs the benchmark.
pub(crate) async fn run(args: ConsoleBench) -> Result<()> {
    ensure!(
        args.photos >= 2 && args.rounds >= 1,
        "give at least 2 photos and 1 round"
    );
    let tmp = tempfile::tempdir()?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| tmp.path().join("store"));
    let store = ndpipe_store::PipeStore::open(store_config(data, None))
        .await
        .context("opening the PipeStore")?;
    let running = store.start(None, None).await.context("starting it")?;
    let base = format!("http://{}", running.http_addr());
    let http = reqwest::Client::new();
    let started = Instant::now();
    let ids = fill(&http, &base, args.photos, args.distinct).await?;
    eprintln!(
        "{} photos stored and labelled in {:.1} s",
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    wait_for_hashes(&http, &base).await?;
    eprintln!(
        "every photo hashed {:.1} s later",
        started.elapsed().as_secs_f64()
    );
    let middle = ids[ids.len() / 2];
    let pages = [
        ("photos grid", "/ui/photos".to_string()),
        ("photo page", format!("/ui/photos/{middle}")),
        (
            "search by class",
            "/ui/search?label=shirt&task=tops".to_string(),
        ),
        ("jobs", "/ui/jobs".to_string()),
        ("cluster", "/ui/cluster".to_string()),
        ("label & train", "/ui/train?task=tops".to_string()),
        ("model registry", "/ui/models".to_string()),
        ("duplicates", "/ui/duplicates".to_string()),
        (
            "duplicates, exact only",
            "/ui/duplicates?level=exact".to_string(),
        ),
        ("storage", "/ui/storage".to_string()),
    ];
    println!(
        "console pages at {} photos, {} rounds each (ms; target {TARGET_MS} ms)",
        ids.len(),
        args.rounds
    );
    println!("| page | status | median | min | max | under target |");
    println!("|---|---|---:|---:|---:|---|");
    for (name, path) in pages {
        let (status, mut ms) = time_page(&http, &format!("{base}{path}"), args.rounds).await?;
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        let verdict = match (status, median < TARGET_MS) {
            (200, true) => "yes",
            (200, false) => "no",
            _ => "not a page (an error answer)",
        };
        println!(
            "| {name} (`{path}`) | {status} | {median:.1} | {:.1} | {:.1} | {verdict} |",
            ms[0],
            ms[ms.len() - 1]
        );
    }
    let (groups, members) = near_groups(&http, &base).await?;
    println!("near level: {members} photos in {groups} groups");
    running.stop().await.context("stopping the store")?;
    Ok(())
}

/// `GET /v1/duplicates` at the near level: the reply of one page.
async fn near_page(
    http: &reqwest::Client,
    base: &str,
    limit: usize,
    after: Option<u64>,
) -> Result<serde_json::Value> {
    let mut url = format!("{base}/v1/duplicates?level=near&limit={limit}");
    if let Some(after) = after {
        url.push_str(&format!("&after={after}"));
    }
    let r = http.get(url).send().await?;
    let status = r.status();
    let body = r.text().await?;
    ensure!(status.is_success(), "near duplicates: {status} {body}");
    Ok(serde_json::from_str(&body)?)
}

/// Looks that may miss their deadline while waiting for the hashes (the first builds the near
/// pairs of every hash stored by then; it goes on after its 503).
const LATE_LOOKS: usize = 10;

/// Waits until the hashing worker has hashed every photo (a look a second, for at most an
/// hour), so that the pages are timed over every hash; prints the looks' times (each brings
/// the near pairs to the hashes written since the look before).
async fn wait_for_hashes(http: &reqwest::Client, base: &str) -> Result<()> {
    let mut looks = Vec::new();
    let mut late = 0;
    for _ in 0..3600 {
        let t = Instant::now();
        let page = match near_page(http, base, 1, None).await {
            Ok(page) => page,
            // A catalog deadline passed on a loaded machine: the next look tries again.
            Err(e) if e.to_string().contains("503") && late < LATE_LOOKS => {
                late += 1;
                eprintln!("a look failed, trying again: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let unhashed = page["unhashed"].as_u64();
        looks.push((t.elapsed().as_secs_f64() * 1e3, unhashed.unwrap_or(0)));
        if unhashed == Some(0) {
            let shown: Vec<String> = looks
                .iter()
                .map(|(ms, left)| format!("{ms:.0} ms ({left} left)"))
                .collect();
            eprintln!("near-level looks while hashing: {}", shown.join(", "));
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    anyhow::bail!("the photos were not all hashed within an hour")
}

/// The near level's groups and the photos in them, every page read.
async fn near_groups(http: &reqwest::Client, base: &str) -> Result<(usize, usize)> {
    let (mut groups, mut members, mut after) = (0, 0, None);
    loop {
        let page = near_page(http, base, 1000, after).await?;
        for g in page["groups"]
            .as_array()
            .context("a reply without groups")?
        {
            groups += 1;
            members += g["members"].as_array().map_or(0, Vec::len);
        }
        after = page["next_after"].as_u64();
        if after.is_none() {
            return Ok((groups, members));
        }
    }
}

/// Stores `n` photos (a tenth of them twice; `distinct`: of random blocks), creates task
/// `tops` and labels every photo; returns the ids.
async fn fill(http: &reqwest::Client, base: &str, n: usize, distinct: bool) -> Result<Vec<u64>> {
    let uploads = futures::stream::iter(0..n)
        .map(|i| upload(http, base, i, distinct))
        .buffer_unordered(IN_FLIGHT);
    let mut ids: Vec<u64> = uploads
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    ids.sort_unstable();
    let created = http
        .post(format!("{base}/v1/tasks"))
        .json(&json!({"name": "tops"}))
        .send()
        .await?;
    ensure!(
        created.status().is_success(),
        "creating the task: {}",
        created.status()
    );
    for (c, class) in CLASSES.iter().enumerate() {
        let of_class: Vec<u64> = ids.iter().copied().skip(c).step_by(CLASSES.len()).collect();
        for batch in of_class.chunks(LABEL_BATCH) {
            let r = http
                .post(format!("{base}/v1/tasks/tops/labels"))
                .json(&json!({"class": class, "ids": batch}))
                .send()
                .await?;
            ensure!(r.status().is_success(), "labelling: {}", r.status());
        }
    }
    Ok(ids)
}

/// Uploads photo `i` of the set: every tenth is the same bytes as the one before it.
async fn upload(http: &reqwest::Client, base: &str, i: usize, distinct: bool) -> Result<u64> {
    let seed = if i % 10 == 9 { i - 1 } else { i };
    let body = if distinct {
        random_blocks(seed as u64)
    } else {
        png(seed as u32)
    };
    let response = http
        .post(format!("{base}/v1/photos"))
        .body(body)
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "upload {i}: {}",
        response.status()
    );
    let body: serde_json::Value = response.json().await?;
    body["id"].as_u64().context("an upload's reply has no id")
}

/// A 64x64 PNG of 4x4 blocks whose colours differ by `seed`: distinct bytes and perceptual
/// hashes, a stored tensor of flat areas that compresses well (10^5 photos fit in a few GB of
/// disk), and sides of the default `near_min_side`, so the near level pairs every photo. The
/// blocks' related colours make related hashes: at the default 12 bits, 19,044 of the
/// 1,999,000 pairs of the first 2,000 photos are near.
fn png(seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(64, 64, |x, y| {
        let block = (y / 16) * 4 + x / 16;
        let v = seed
            .wrapping_add(1)
            .wrapping_mul(2_654_435_761)
            .rotate_left(block * 2);
        image::Rgb([
            (v & 0xff) as u8,
            (v >> 8 & 0xff) as u8,
            (v >> 16 & 0xff) as u8,
        ])
    });
    encode(&img)
}

/// A 64x64 PNG of 8x8 blocks of random colours (seeded by `seed`): hashes that pair about as
/// rarely as distinct photos' (4 near pairs among the first 2,000 photos at 12 bits).
fn random_blocks(seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let colours: Vec<[u8; 3]> = (0..64).map(|_| rng.random()).collect();
    let img = image::RgbImage::from_fn(64, 64, |x, y| {
        image::Rgb(colours[((y / 8) * 8 + x / 8) as usize])
    });
    encode(&img)
}

/// `img` as PNG bytes.
fn encode(img: &image::RgbImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("encoding a PNG in memory");
    out.into_inner()
}

/// The status of `url` and the milliseconds of `rounds` fetches of it, after one warm-up.
async fn time_page(http: &reqwest::Client, url: &str, rounds: usize) -> Result<(u16, Vec<f64>)> {
    let warm = http.get(url).send().await?;
    let status = warm.status().as_u16();
    warm.bytes().await?;
    let mut ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = http.get(url).send().await?;
        ensure!(
            r.status().as_u16() == status,
            "{url}: {} then {}",
            status,
            r.status()
        );
        r.bytes().await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((status, ms))
}
