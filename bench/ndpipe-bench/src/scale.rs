//! `ndpipe-bench scale`: one `ndpipe serve` process filled to N photos (Fashion-MNIST repeated,
//! each upload a photo of its own id, labelled by the model at ingest), measured at every step:
//! ingest rate, label-search and listing p99, disk bytes per photo and the server's RSS; then a
//! fine-tune from the stored features and its head-only re-labelling of every photo.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use ndpipe::client::{Client, UploadError};
use ndpipe::fashion_mnist;
use ndpipe_tuner::{FinetuneRequest, JobResult, JobView, Phase};

use crate::cluster::client;
use crate::serve_process::Server;

/// The section of `docs/benchmarks.md` this benchmark rewrites.
const HEADING: &str = "## `make bench-scale`";
/// A label no model predicts.
const NO_HIT: &str = "no such label at all";
/// Polls of `/metrics` at 1 s without progress before labelling counts as stuck.
const STUCK_POLLS: u32 = 120;

/// Flags of `ndpipe-bench scale`.
#[derive(Debug, Args)]
pub(crate) struct ScaleBench {
    /// Photos to fill the node with.
    #[arg(long, default_value_t = 1_000_000)]
    photos: usize,
    /// Photos between two measurements.
    #[arg(long, default_value_t = 100_000)]
    step: usize,
    /// Uploads in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds of queries at each step; the spread of their p99s is printed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Queries of each kind per round.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Stop filling before a step that would end after this many minutes, at the photos reached
    /// (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_minutes: u64,
    /// Epochs of the fine-tune at the end (0: no fine-tune).
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    fashion_mnist_dir: Option<PathBuf>,
    /// The model folder the server labels with.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// The data directory of the server (default: a temporary one, deleted at the end).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The benchmark file whose scale section is rewritten with the table.
    #[arg(long, default_value = "docs/benchmarks.md")]
    doc: PathBuf,
    /// Folder of the PNG plots (ingest rate and p99 against photos).
    #[arg(long, default_value = "docs/bench-scale")]
    plots: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The server's `--index-cache-bytes` (default: the server's default).
    #[arg(long)]
    index_cache_bytes: Option<usize>,
    /// The server's `--feature-cache-bytes` (default: the server's default).
    #[arg(long)]
    feature_cache_bytes: Option<usize>,
}

impl ScaleBench {
    /// The server's flags for the caches that were set.
    fn server_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(b) = self.index_cache_bytes {
            flags.extend(["--index-cache-bytes".to_string(), b.to_string()]);
        }
        if let Some(b) = self.feature_cache_bytes {
            flags.extend(["--feature-cache-bytes".to_string(), b.to_string()]);
        }
        flags
    }

    /// MB of memory the server may grow by as it fills: its two caches and the online-labelling
    /// queue of tensors (224x224x3 bytes each), as configured.
    fn allowance_mb(&self) -> f64 {
        let defaults = ndpipe_store::Config::default();
        let caches = self.index_cache_bytes.unwrap_or(defaults.index_cache_bytes)
            + self
                .feature_cache_bytes
                .unwrap_or(defaults.feature_cache_bytes);
        let queue = defaults.label_queue * 224 * 224 * 3;
        (caches + queue) as f64 / (1024.0 * 1024.0)
    }
}

/// The server's memory: at start (model loaded, store empty), after the first step (ONNX
/// Runtime's arena has grown to the largest batch by then), at its peak while filling, and at
/// its peak with the fine-tune.
#[derive(Debug, serde::Serialize)]
struct Memory {
    start_mb: f64,
    first_step_mb: f64,
    fill_peak_mb: f64,
    peak_mb: f64,
}

/// The measurements at one step.
#[derive(Debug, serde::Serialize)]
struct Step {
    photos: usize,
    /// Uploads acknowledged per second during the step.
    ingest_per_s: f64,
    /// Photos stored and labelled per second, from the step's first upload to its last label.
    labelled_per_s: f64,
    /// p99 in ms of each round: a search with hits, one without, a page of the listing.
    hit_p99_ms: Vec<f64>,
    no_hit_p99_ms: Vec<f64>,
    list_p99_ms: Vec<f64>,
    disk_bytes_per_photo: f64,
    rss_mb: f64,
}

/// The fine-tune at the end.
#[derive(Debug, serde::Serialize)]
struct Tuning {
    train_images: usize,
    /// Seconds until the head was trained (the report's), and of the whole job.
    finetune_s: f64,
    /// Seconds from the job's deploy phase to its end: staging, commit, head-only relabel.
    deploy_relabel_s: f64,
    relabelled: u64,
    modes: Vec<String>,
    val_top1: f32,
}

/// Runs `ndpipe-bench scale`.
pub(crate) async fn run(args: ScaleBench) -> Result<()> {
    ensure!(
        args.step > 0 && args.photos >= args.step,
        "--photos must be at least --step (> 0)"
    );
    let photos = load_photos(args.fashion_mnist_dir.as_ref())?;
    let temp = tempfile::tempdir().context("creating a temporary directory")?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| temp.path().join("data"));
    let mut server = Server::start(&data, &args.model_dir, temp.path(), &args.server_flags())?;
    let client = client(server.addr)?;
    server.wait_healthy(&client).await?;
    let start_mb = server.rss_kb("VmRSS")? as f64 / 1024.0;
    println!(
        "bench scale: one `ndpipe serve` (pid {}), {} photos in steps of {}, {} uploads in flight, {} cores",
        server.child.id(),
        args.photos,
        args.step,
        args.concurrency,
        std::thread::available_parallelism().map_or(2, |n| n.get())
    );
    let bar = ProgressBar::new(args.photos as u64);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {msg:10} {bar:40} {pos}/{len} photos ({per_sec})",
    )?);
    let mut steps: Vec<Step> = Vec::new();
    let mut stored = 0;
    let (begun, budget) = (Instant::now(), Duration::from_secs(args.max_minutes * 60));
    let mut last_step = Duration::ZERO;
    while stored < args.photos {
        if args.max_minutes > 0 && !steps.is_empty() && begun.elapsed() + last_step > budget {
            eprintln!("stopping at {stored} photos: the next step would pass --max-minutes");
            break;
        }
        let n = args.step.min(args.photos - stored);
        let started = Instant::now();
        bar.set_message("uploading");
        let ingest_s = upload(&client, &photos, stored..stored + n, args.concurrency, &bar).await?;
        stored += n;
        bar.set_message("labelling");
        wait_labelled(&client, &mut server, stored).await?;
        let labelled_s = started.elapsed().as_secs_f64();
        bar.set_message("querying");
        let hit = hit_label(&client).await?;
        let (mut hit_p99, mut no_hit_p99, mut list_p99) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..args.rounds {
            let seed = (round * args.queries) as u64;
            let search = |label: String| {
                move |i: u64| format!("/v1/search?label={label}&offset={}", (i % 4) * 50)
            };
            hit_p99.push(p99(&client, args.queries, search(hit.clone())).await?);
            no_hit_p99.push(p99(&client, args.queries, search(NO_HIT.replace(' ', "+"))).await?);
            let span = stored as u64;
            list_p99.push(
                p99(&client, args.queries, |i| {
                    format!("/v1/photos?after={}&limit=100", spread(seed + i) % span)
                })
                .await?,
            );
        }
        last_step = started.elapsed();
        steps.push(Step {
            photos: stored,
            ingest_per_s: n as f64 / ingest_s,
            labelled_per_s: n as f64 / labelled_s,
            hit_p99_ms: hit_p99,
            no_hit_p99_ms: no_hit_p99,
            list_p99_ms: list_p99,
            disk_bytes_per_photo: dir_bytes(&data)? as f64 / stored as f64,
            rss_mb: server.rss_kb("VmRSS")? as f64 / 1024.0,
        });
    }
    bar.finish_and_clear();
    let fill_peak_mb = server.rss_kb("VmHWM")? as f64 / 1024.0;
    let tuning = if args.epochs > 0 {
        eprintln!("fine-tuning from stored features, then re-labelling every photo...");
        Some(finetune(&client, args.epochs).await?)
    } else {
        None
    };
    let memory = Memory {
        start_mb,
        first_step_mb: steps.first().map_or(start_mb, |s| s.rss_mb),
        fill_peak_mb,
        peak_mb: server.rss_kb("VmHWM")? as f64 / 1024.0,
    };
    server.stop()?;
    let table = table(&args, &steps, tuning.as_ref(), &memory);
    println!("\n{table}");
    std::fs::create_dir_all(&args.plots)
        .with_context(|| format!("creating {}", args.plots.display()))?;
    plot(&args.plots, &steps)?;
    write_section(&args.doc, &args.plots, &table)?;
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "steps": steps, "finetune": tuning, "memory": memory });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The Fashion-MNIST training images as PNGs with their class names.
fn load_photos(dir: Option<&PathBuf>) -> Result<Vec<(Vec<u8>, &'static str)>> {
    let dir = fashion_mnist::dir(dir);
    let train = fashion_mnist::load(&dir, "train")
        .with_context(|| format!("loading Fashion-MNIST from {} (make setup)", dir.display()))?;
    (0..train.len())
        .map(|i| {
            let class = fashion_mnist::CLASSES[usize::from(train.labels[i])];
            Ok((fashion_mnist::png(train.image(i))?, class))
        })
        .collect()
}

/// Uploads photos `range` (photo `i` is Fashion-MNIST image `i mod 60000`, every tenth in the
/// val split); returns the seconds it took.
async fn upload(
    client: &Client,
    photos: &[(Vec<u8>, &'static str)],
    range: std::ops::Range<usize>,
    concurrency: usize,
    bar: &ProgressBar,
) -> Result<f64> {
    let started = Instant::now();
    let mut results = futures::stream::iter(range)
        .map(|i| {
            let (png, class) = &photos[i % photos.len()];
            let split = if i % 10 == 0 { "val" } else { "train" };
            client.upload(
                png.clone(),
                Some(ndpipe::client::Truth {
                    label: class,
                    split,
                    task: None,
                }),
            )
        })
        .buffer_unordered(concurrency.max(1));
    while let Some(result) = results.next().await {
        match result {
            Ok(_) => bar.inc(1),
            Err(UploadError::Rejected(b)) => bail!("upload rejected: {} ({})", b.message, b.error),
            Err(UploadError::Failed(e)) => return Err(e),
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Waits until the server has labelled `n` photos; fails when it makes no progress for
/// [`STUCK_POLLS`] polls or exits.
async fn wait_labelled(client: &Client, server: &mut Server, n: usize) -> Result<()> {
    let (mut last, mut still) = (0, 0);
    loop {
        server.check_alive()?;
        let metrics = String::from_utf8(client.get_bytes("/metrics").await?)?;
        let labelled = metrics
            .lines()
            .find_map(|l| l.strip_prefix("ndpipe_store_labelled_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as usize;
        if labelled >= n {
            return Ok(());
        }
        still = if labelled == last { still + 1 } else { 0 };
        last = labelled;
        ensure!(
            still < STUCK_POLLS,
            "labelling stopped at {labelled} of {n} photos"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The first class name of the first photo's top-1 label (a label with many hits), with its
/// spaces as `+` for a query string.
async fn hit_label(client: &Client) -> Result<String> {
    let page: serde_json::Value = client.get_json("/v1/photos?limit=1").await?;
    let id = page["photos"][0]["id"]
        .as_u64()
        .context("the store lists no photo")?;
    let labels: serde_json::Value = client.get_json(&format!("/v1/photos/{id}/labels")).await?;
    let label = labels[0]["labels"][0]["label"]
        .as_str()
        .with_context(|| format!("photo {id} has no labels"))?;
    let name = label.split(',').next().unwrap_or(label).trim();
    Ok(name.replace(' ', "+"))
}

/// The p99 in ms of `n` GETs of `path(i)`, one at a time.
async fn p99(client: &Client, n: usize, path: impl Fn(u64) -> String) -> Result<f64> {
    let mut took = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        client.get_bytes(&path(i)).await?;
        took.push(t.elapsed().as_secs_f64() * 1e3);
    }
    took.sort_by(f64::total_cmp);
    Ok(took[((took.len() - 1) as f64 * 0.99).round() as usize])
}

/// A well-mixed number from `i` (splitmix64), for positions in the listing.
fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Fine-tunes from stored features and deploys, timing the training and the re-labelling.
async fn finetune(client: &Client, epochs: usize) -> Result<Tuning> {
    let request = FinetuneRequest {
        epochs,
        deploy: true,
        ..FinetuneRequest::default()
    };
    let mut job: JobView = client
        .post_json_body("/v1/tuner/finetune", &request)
        .await?;
    let path = format!("/v1/tuner/jobs/{}", job.id);
    let mut deploy_started = None;
    while !matches!(job.phase, Phase::Done | Phase::Failed) {
        if matches!(job.phase, Phase::Deploying | Phase::Relabelling) && deploy_started.is_none() {
            deploy_started = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        job = client.get_json(&path).await?;
    }
    if let Some(e) = &job.error {
        bail!("the fine-tune failed: {} ({})", e.message, e.kind);
    }
    let Some(JobResult::Finetune(report)) = job.result else {
        bail!("the fine-tune ended without a report");
    };
    let deploy = report.deploy.context("the fine-tune did not deploy")?;
    Ok(Tuning {
        train_images: report.train_images,
        finetune_s: report.seconds,
        deploy_relabel_s: deploy_started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
        relabelled: deploy.relabelled,
        modes: deploy.modes,
        val_top1: report.val_top1,
    })
}

/// Mean and range of the rounds' p99s, as "mean (min-max)".
fn spread_of(values: &[f64]) -> String {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mean:.1} ({min:.1}-{max:.1})")
}

fn last_photos(steps: &[Step]) -> usize {
    steps.last().map_or(0, |s| s.photos)
}

fn worst(steps: &[Step], f: impl Fn(&Step) -> &Vec<f64>) -> f64 {
    steps
        .iter()
        .flat_map(|s| f(s).iter().copied())
        .fold(0.0, f64::max)
}

/// The table and the verdicts on the targets, as printed and written to the doc.
fn table(args: &ScaleBench, steps: &[Step], tuning: Option<&Tuning>, memory: &Memory) -> String {
    let mut out = String::new();
    let first = &steps[0];
    out.push_str(&format!(
        "one `ndpipe serve` filled to {} photos (Fashion-MNIST 28x28 PNGs repeated, labelled at ingest), \
         {} uploads in flight; p99 of {} queries per round over HTTP, {} rounds: mean (min-max)\n",
        last_photos(steps), args.concurrency, args.queries, args.rounds
    ));
    out.push_str("| photos | ingest/s | labelled/s | vs first step | search hit p99 ms | search no-hit p99 ms | list p99 ms | disk bytes/photo | RSS MB |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for s in steps {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {:.0} | {:.0} |\n",
            s.photos,
            s.ingest_per_s,
            s.labelled_per_s,
            s.labelled_per_s / first.labelled_per_s,
            spread_of(&s.hit_p99_ms),
            spread_of(&s.no_hit_p99_ms),
            spread_of(&s.list_p99_ms),
            s.disk_bytes_per_photo,
            s.rss_mb
        ));
    }
    let last = &steps[steps.len() - 1];
    let ratio = last.labelled_per_s / first.labelled_per_s;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    out.push_str(&format!(
        "labelled/s, last step vs first: {ratio:.2} (target: no more than 10% slower: {})\n",
        verdict(ratio >= 0.9)
    ));
    let p99_max = worst(steps, |s| &s.hit_p99_ms)
        .max(worst(steps, |s| &s.no_hit_p99_ms))
        .max(worst(steps, |s| &s.list_p99_ms));
    out.push_str(&format!(
        "worst p99 of any step and round: {p99_max:.1} ms (target <= 50 ms: {})\n",
        verdict(p99_max <= 50.0)
    ));
    if let Some(t) = tuning {
        out.push_str(&format!(
            "fine-tune from stored features ({} training photos, {} epochs): {:.1} s; deploy and re-label of {} photos [{}]: {:.1} s; val top-1 {:.1}%\n",
            t.train_images,
            args.epochs,
            t.finetune_s,
            t.relabelled,
            t.modes.join(", "),
            t.deploy_relabel_s,
            100.0 * t.val_top1
        ));
    }
    let growth = memory.fill_peak_mb - memory.first_step_mb;
    let allowance = args.allowance_mb();
    out.push_str(&format!(
        "server RSS: {:.0} MB at start (model loaded, store empty), {:.0} MB after the first step \
         (the model's arena grown to its largest batch); peak while filling {:.0} MB, a growth of \
         {growth:.0} MB after the first step against {allowance:.0} MB of configured caches and \
         labelling queue (target: within it: {}); peak with the fine-tune (VmHWM) {:.0} MB\n",
        memory.start_mb,
        memory.first_step_mb,
        memory.fill_peak_mb,
        verdict(growth <= allowance),
        memory.peak_mb
    ));
    out
}

/// `ingest.png` (photos/s) and `p99.png` (ms) against photos.
fn plot(dir: &Path, steps: &[Step]) -> Result<()> {
    let xs: Vec<f64> = steps.iter().map(|s| s.photos as f64 / 1000.0).collect();
    let series = |name: &str, f: &dyn Fn(&Step) -> f64| {
        (name.to_owned(), steps.iter().map(f).collect::<Vec<_>>())
    };
    let chart = |file: &str, title: &str, unit: &str, floor: f64, lines: &[(String, Vec<f64>)]| {
        let top = lines
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(floor, f64::max)
            * 1.1;
        cachebench::plot::xy_chart(
            &dir.join(file),
            title,
            "photos (thousands)",
            unit,
            &xs,
            0.0..top,
            lines,
        )
    };
    chart(
        "ingest.png",
        "ingest rate",
        "photos/s",
        1.0,
        &[
            series("ingest/s", &|s| s.ingest_per_s),
            series("labelled/s", &|s| s.labelled_per_s),
        ],
    )?;
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
    chart(
        "p99.png",
        "p99 latency",
        "ms",
        50.0,
        &[
            series("search, hits", &|s| mean(&s.hit_p99_ms)),
            series("search, no hit", &|s| mean(&s.no_hit_p99_ms)),
            series("list", &|s| mean(&s.list_p99_ms)),
        ],
    )?;
    Ok(())
}

/// Replaces this benchmark's section of `doc` (or appends one) with `table`.
fn write_section(doc: &Path, plots: &Path, table: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
    let plots = plots.strip_prefix("docs").unwrap_or(plots).display();
    let section = format!(
        "{HEADING} (issue 14 part 4)\n\n`ndpipe-bench scale`, release build.\n\n```\n{table}```\n\n\
         ![ingest rate]({plots}/ingest.png)\n![p99]({plots}/p99.png)\n"
    );
    let text = match text.find(HEADING) {
        Some(start) => {
            let end = text[start + HEADING.len()..]
                .find("\n## ")
                .map_or(text.len(), |i| start + HEADING.len() + i + 1);
            format!("{}{section}\n{}", &text[..start], &text[end..])
        }
        None => format!(
            "{}\n{section}",
            text.trim_end_matches('\n').to_owned() + "\n"
        ),
    };
    std::fs::write(doc, text).with_context(|| format!("writing {}", doc.display()))
}
