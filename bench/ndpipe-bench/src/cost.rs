//! `ndpipe-bench cost`: dollars per million images for the feature extraction of a fine-tune,
//! near-data (each storage node runs the backbone, only features cross the network) against
//! conventional (storage nodes ship preprocessed tensors to a training server that runs the
//! backbone), from figures measured in this run and a stated price table.
//!
//! Measured here: the backbone's model-only rate on this machine over real-photo crops
//! preprocessed as uploads are (3 rounds, spread printed), and the bytes per image each path
//! puts on the wire (a chunk of real features and one of the same crops' tensors, encoded by the
//! wire protocol, with gRPC's 5-byte message prefix). Stated (flags): the hourly prices of a
//! storage node and of a training server, the price of a GB on the network, and the training
//! server's rate (default: a server like this machine, at the rate measured here, since no GPU
//! is measured on this machine).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args;
use ndpipe_model::{InferenceBackend, OrtBackend, RuntimeConfig};
use ndpipe_proto::{Features, Tensors, encode_chunk, encode_tensor_chunk, pb};
use prost::Message;
use serde::Serialize;

use crate::crops::Sources;
use crate::emulated::{Spread, chart};
use crate::infer::model_only;

/// Flags of `ndpipe-bench cost`.
#[derive(Debug, Args)]
pub(crate) struct CostBench {
    /// Model folder.
    #[arg(long, env = "NDPIPE_MODEL_DIR", default_value = ".cache/model")]
    model_dir: PathBuf,
    /// Folder of the sample photos the crops are cut from.
    #[arg(
        long,
        env = "NDPIPE_SAMPLES_DIR",
        default_value = ".cache/model/samples"
    )]
    samples: PathBuf,
    /// Folder of wallpaper JPEGs, cropped along with the sample photos.
    #[arg(long, default_value = ".cache/wallpapers")]
    wallpapers: PathBuf,
    /// Crops the model runs over in each round.
    #[arg(long, default_value_t = 256)]
    crops: usize,
    /// Rounds of the model-only measurement.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Batch size of the model runs.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Dollars per hour of a storage node's compute (default: 2 vCPUs of a general-purpose cloud
    /// instance at about $0.0425 per vCPU-hour, on demand).
    #[arg(long, default_value_t = 0.085)]
    node_dollars_per_hour: f64,
    /// Dollars per hour of the conventional training server (default: the storage node's price,
    /// a server like this machine; a one-GPU cloud instance is about $1.01 on demand, with its
    /// rate in --server-images-per-second).
    #[arg(long, default_value_t = 0.085)]
    server_dollars_per_hour: f64,
    /// Images per second the training server's backbone runs at (0: the rate measured here).
    #[arg(long, default_value_t = 0.0)]
    server_images_per_second: f64,
    /// Dollars per GB crossing the network between storage and the training server (default:
    /// $0.01 out and $0.01 in, as between a cloud's availability zones).
    #[arg(long, default_value_t = 0.02)]
    network_dollars_per_gb: f64,
    /// Folder of the table (`cost.md`) and the plot (`cost.png`).
    #[arg(long, default_value = "docs/experiments")]
    out: PathBuf,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One path's cost per million images.
#[derive(Debug, Serialize)]
struct PathCost {
    name: &'static str,
    images_per_second: f64,
    compute_dollars: f64,
    wire_bytes_per_image: f64,
    network_dollars: f64,
    total_dollars: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    model_only: Spread,
    near_data: PathCost,
    conventional: PathCost,
}

const MILLION: f64 = 1e6;

/// Runs `ndpipe-bench cost`.
pub(crate) fn run(args: CostBench) -> Result<()> {
    ensure!(
        args.crops > 0 && args.rounds > 0,
        "--crops and --rounds must be > 0"
    );
    let sources = Sources::load(&[&args.samples, &args.wallpapers])?;
    let tensors = sources.crops(args.crops, 7)?;
    let config = RuntimeConfig {
        max_batch: args.batch,
        ..RuntimeConfig::for_model_dir(&args.model_dir)
    };
    let backend = OrtBackend::load(&args.model_dir, &config)
        .with_context(|| format!("loading the model in {}", args.model_dir.display()))?;
    let rates = (0..args.rounds)
        .map(|_| model_only(&backend, &tensors, args.batch))
        .collect::<Result<Vec<f64>>>()?;
    let model_only = Spread::of(&rates);
    let (features, tensor) = wire_bytes(&backend, &tensors)?;
    let rate = model_only.mean;
    let server_rate = if args.server_images_per_second > 0.0 {
        args.server_images_per_second
    } else {
        rate
    };
    let near_data = cost(
        "near-data",
        rate,
        args.node_dollars_per_hour,
        features,
        &args,
    );
    let conventional = cost(
        "conventional",
        server_rate,
        args.server_dollars_per_hour,
        tensor,
        &args,
    );
    let results = Results {
        model_only,
        near_data,
        conventional,
    };
    let table = table(&args, &results);
    println!("\n{table}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("cost.md"), &table).context("writing cost.md")?;
    plot(&args.out, &args, &results)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Wire bytes per image of a feature chunk and of a tensor chunk of the same crops.
fn wire_bytes(backend: &OrtBackend, tensors: &[ndpipe_model::ImageTensor]) -> Result<(f64, f64)> {
    let batch = &tensors[..tensors.len().min(backend.max_batch())];
    let outputs = backend.run(batch)?;
    let n = batch.len();
    let dim = backend.info().feature_dim;
    let features = Features {
        values: (0..n).flat_map(|i| outputs.features(i).to_vec()).collect(),
        dim,
        labels: vec![0; n],
        photo_ids: (0..n as u64).collect(),
    };
    let (height, width) = (batch[0].height(), batch[0].width());
    let shipped = Tensors {
        data: batch.iter().flat_map(|t| t.data().to_vec()).collect(),
        height,
        width,
        labels: vec![0; n],
        photo_ids: (0..n as u64).collect(),
    };
    let per_image = |chunk: pb::FeatureChunk| (chunk.encoded_len() + 5) as f64 / n as f64;
    Ok((
        per_image(encode_chunk(pb::Part::Train, 0, 0, &features)),
        per_image(encode_tensor_chunk(pb::Part::Train, 0, 0, &shipped)),
    ))
}

/// The cost of a million images at `images_per_second` on a machine of `dollars_per_hour`, with
/// `bytes_per_image` on the network.
fn cost(
    name: &'static str,
    images_per_second: f64,
    dollars_per_hour: f64,
    bytes_per_image: f64,
    args: &CostBench,
) -> PathCost {
    let compute_dollars = MILLION / images_per_second / 3600.0 * dollars_per_hour;
    let network_dollars = network(bytes_per_image, args.network_dollars_per_gb);
    PathCost {
        name,
        images_per_second,
        compute_dollars,
        wire_bytes_per_image: bytes_per_image,
        network_dollars,
        total_dollars: compute_dollars + network_dollars,
    }
}

/// Dollars for a million images of `bytes_per_image` at `dollars_per_gb`.
fn network(bytes_per_image: f64, dollars_per_gb: f64) -> f64 {
    MILLION * bytes_per_image / 1e9 * dollars_per_gb
}

fn table(args: &CostBench, r: &Results) -> String {
    let m = &r.model_only;
    let mut out = format!(
        "Measured in this run: the backbone's model-only rate on this machine, {:.1} images/s \
         ({:.1}..{:.1}, {} rounds of {} real-photo crops, batch {}); bytes per image on the wire \
         from chunks of real features and tensors. Stated: a storage node at ${}/h, the training \
         server at ${}/h running at {:.1} images/s{}, the network at ${}/GB.\n\n",
        m.mean,
        m.min,
        m.max,
        args.rounds,
        args.crops,
        args.batch,
        args.node_dollars_per_hour,
        args.server_dollars_per_hour,
        r.conventional.images_per_second,
        if args.server_images_per_second > 0.0 {
            " (given)"
        } else {
            " (the rate measured here)"
        },
        args.network_dollars_per_gb
    );
    out.push_str("| path | images/s | compute $ per 10^6 | wire bytes/image | network $ per 10^6 | total $ per 10^6 |\n|---|---|---|---|---|---|\n");
    for p in [&r.near_data, &r.conventional] {
        out.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.0} | {:.2} | {:.2} |\n",
            p.name,
            p.images_per_second,
            p.compute_dollars,
            p.wire_bytes_per_image,
            p.network_dollars,
            p.total_dollars
        ));
    }
    out.push_str(&format!(
        "\nconventional / near-data: {:.1}x the cost per million images\n",
        r.conventional.total_dollars / r.near_data.total_dollars
    ));
    out
}

/// `cost.png`: dollars per million images against the network's price, in cents per GB.
fn plot(dir: &Path, args: &CostBench, r: &Results) -> Result<()> {
    let cents = [0.0, 1.0, 2.0, 5.0, 9.0];
    let line = |p: &PathCost| -> Vec<f64> {
        cents
            .iter()
            .map(|&c| p.compute_dollars + network(p.wire_bytes_per_image, c / 100.0))
            .collect()
    };
    let series = vec![
        ("near-data".to_string(), line(&r.near_data)),
        (
            format!("conventional (${}/h server)", args.server_dollars_per_hour),
            line(&r.conventional),
        ),
    ];
    chart(
        &dir.join("cost.png"),
        "feature extraction, $ per million images",
        "network cents per GB",
        "$ per million images",
        &cents,
        series,
    )
}
