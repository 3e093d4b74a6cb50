//! `ndpipe import`: parallel bulk upload of a folder or of Fashion-MNIST, with progress.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use ndpipe::client::{Client, ServerArgs, Truth, UploadError, Uploaded};
use ndpipe::fashion_mnist;

/// File extensions imported from folders.
const PHOTO_EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];

/// Flags of `ndpipe import`.
#[derive(Debug, Args)]
pub(super) struct ImportArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Folder to import recursively (JPEG, PNG and WebP files; other files are skipped).
    #[arg(required_unless_present = "fashion_mnist")]
    pub dir: Option<PathBuf>,
    /// Import Fashion-MNIST (Debian package dataset-fashion-mnist) with its class as ground truth
    /// and its official train/test split.
    #[arg(long, conflicts_with = "dir")]
    pub fashion_mnist: bool,
    /// Where the Fashion-MNIST IDX files are.
    #[arg(long, env = "NDPIPE_FASHION_MNIST_DIR")]
    pub fashion_mnist_dir: Option<PathBuf>,
    /// Import at most this many photos (Fashion-MNIST: taken 6:1 from train and test).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Fashion-MNIST: skip this many photos first (taken 6:1 from train and test), e.g. to give
    /// each PipeStore its own slice.
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Ground-truth label for every photo of the folder.
    #[arg(long, conflicts_with = "label_from_folder")]
    pub label: Option<String>,
    /// Use each photo's parent folder name as its ground-truth label.
    #[arg(long)]
    pub label_from_folder: bool,
    /// Split of the labelled photos of a folder: train, val or test.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// The task the labels belong to (created before with `ndpipe tasks create`) [default: the
    /// default task].
    #[arg(long)]
    pub task: Option<String>,
    /// Uploads in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One photo to upload.
enum Item {
    File {
        path: PathBuf,
        label: Option<String>,
    },
    Fashion {
        split: Arc<fashion_mnist::Split>,
        index: usize,
    },
}

impl Item {
    fn name(&self) -> String {
        match self {
            Item::File { path, .. } => path.display().to_string(),
            Item::Fashion { split, index } => format!("fashion-mnist {} #{index}", split.name),
        }
    }
}

/// Counts of an import, printed at the end.
#[derive(Debug, Default)]
struct Summary {
    imported: u64,
    /// Uploads answered with a photo the store had already (the same bytes).
    already: u64,
    skipped: u64,
    rejected: BTreeMap<String, Vec<String>>,
    failed: Vec<String>,
}

/// Runs `ndpipe import`.
pub(super) async fn run(args: ImportArgs) -> Result<()> {
    let client = Client::new(&args.server)?;
    let mut summary = Summary::default();
    let items = if args.fashion_mnist {
        fashion_items(&args)?
    } else {
        let dir = args
            .dir
            .as_ref()
            .context("a folder to import is required")?;
        folder_items(dir, &args, &mut summary)?
    };
    let total = items.len() as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} photos, {per_sec}, eta {eta}",
        )
        .context("progress bar template")?,
    );
    let started = std::time::Instant::now();
    let (split, task) = (args.split.clone(), args.task.clone());
    let mut results = futures::stream::iter(items)
        .map(|item| {
            let client = client.clone();
            let (split, task) = (split.clone(), task.clone());
            async move {
                let name = item.name();
                (name, upload(&client, item, &split, task.as_deref()).await)
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    while let Some((name, result)) = results.next().await {
        match result {
            Ok(u) if u.duplicate_of == Some(u.id) => summary.already += 1,
            Ok(_) => summary.imported += 1,
            Err(UploadError::Rejected(body)) => {
                summary
                    .rejected
                    .entry(format!("{}: {}", body.error, body.message))
                    .or_default()
                    .push(name);
            }
            Err(UploadError::Failed(e)) => summary.failed.push(format!("{name}: {e:#}")),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    print_summary(&summary, started.elapsed());
    if !summary.failed.is_empty() {
        bail!("{} uploads failed (see above)", summary.failed.len());
    }
    Ok(())
}

async fn upload(
    client: &Client,
    item: Item,
    split: &str,
    task: Option<&str>,
) -> Result<Uploaded, UploadError> {
    match item {
        Item::File { path, label } => {
            let bytes = tokio::fs::read(&path).await.map_err(|e| {
                UploadError::Failed(
                    anyhow::anyhow!(e).context(format!("reading {}", path.display())),
                )
            })?;
            let truth = label.as_deref().map(|label| Truth { label, split, task });
            client.upload_reply(bytes, truth).await
        }
        Item::Fashion { split, index } => {
            let png = fashion_mnist::png(split.image(index)).map_err(UploadError::Failed)?;
            let label = fashion_mnist::CLASSES[usize::from(split.labels[index])];
            let truth = Truth {
                label,
                split: split.name,
                task,
            };
            client.upload_reply(png, Some(truth)).await
        }
    }
}

fn fashion_items(args: &ImportArgs) -> Result<Vec<Item>> {
    let dir = fashion_mnist::dir(args.fashion_mnist_dir.as_ref());
    let train = Arc::new(fashion_mnist::load(&dir, "train")?);
    let test = Arc::new(fashion_mnist::load(&dir, "test")?);
    // Both the skip and the limit are taken 6:1 from train and test, as the data set is.
    let six_to_one = |n: usize| {
        let n_train = (n * 6).div_ceil(7);
        (n_train, n - n_train)
    };
    let (skip_train, skip_test) = six_to_one(args.skip);
    let (skip_train, skip_test) = (skip_train.min(train.len()), skip_test.min(test.len()));
    let (n_train, n_test) = match args.limit {
        Some(n) => {
            let (n_train, n_test) = six_to_one(n);
            (
                n_train.min(train.len() - skip_train),
                n_test.min(test.len() - skip_test),
            )
        }
        None => (train.len() - skip_train, test.len() - skip_test),
    };
    let mut items = Vec::with_capacity(n_train + n_test);
    items.extend(
        (skip_train..skip_train + n_train).map(|index| Item::Fashion {
            split: train.clone(),
            index,
        }),
    );
    items.extend((skip_test..skip_test + n_test).map(|index| Item::Fashion {
        split: test.clone(),
        index,
    }));
    Ok(items)
}

fn folder_items(dir: &Path, args: &ImportArgs, summary: &mut Summary) -> Result<Vec<Item>> {
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let mut items = Vec::new();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
        if !entry.file_type().is_file() {
            continue;
        }
        let path = entry.into_path();
        let is_photo = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| PHOTO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
        if !is_photo {
            summary.skipped += 1;
            continue;
        }
        let label = if args.label_from_folder {
            path.parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .map(str::to_owned)
        } else {
            args.label.clone()
        };
        items.push(Item::File { path, label });
        if args.limit.is_some_and(|l| items.len() >= l) {
            break;
        }
    }
    Ok(items)
}

fn print_summary(s: &Summary, elapsed: std::time::Duration) {
    let rejected: usize = s.rejected.values().map(Vec::len).sum();
    println!(
        "imported {} photos in {:.1} s ({:.0} photos/s); {} already stored; skipped {} non-photo files; rejected {}; failed {}",
        s.imported,
        elapsed.as_secs_f64(),
        s.imported as f64 / elapsed.as_secs_f64().max(1e-9),
        s.already,
        s.skipped,
        rejected,
        s.failed.len()
    );
    for (reason, names) in &s.rejected {
        println!("  rejected ({}): {reason}", names.len());
        for name in names.iter().take(5) {
            println!("    {name}");
        }
        if names.len() > 5 {
            println!("    ... and {} more", names.len() - 5);
        }
    }
    for f in s.failed.iter().take(10) {
        println!("  failed: {f}");
    }
}
