//! The S3 part of `ndpipe-bench replication`: plain objects (files that are not photos) put
//! and read through node 0's S3 API, and, with more than one copy, photos through a gateway's
//! `/v1` and plain objects through its S3 API. Requests are anonymous S3 (the cluster has no
//! keys), path-style, `buffer_unordered` at the bench's concurrency.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use ndpipe_store::{Gateway, GatewayConfig, RunningGateway};
use rand::{RngCore, SeedableRng};

use crate::cluster::{any_port, client};

/// Bytes of each plain object.
pub(crate) const PLAIN_BYTES: usize = 64 << 10;

/// `n` distinct plain objects of [`PLAIN_BYTES`] random bytes.
pub(crate) fn plain_objects(n: usize) -> Vec<Vec<u8>> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
    (0..n)
        .map(|_| {
            let mut bytes = vec![0u8; PLAIN_BYTES];
            rng.fill_bytes(&mut bytes);
            bytes
        })
        .collect()
}

/// Puts `objects` as `bucket/obj-N` through the S3 API at `s3` (the bucket made first);
/// seconds taken by the puts.
pub(crate) async fn put_plain(
    s3: SocketAddr,
    bucket: &str,
    objects: &[Vec<u8>],
    concurrency: usize,
) -> Result<f64> {
    let http = reqwest::Client::new();
    let base = format!("http://{s3}/{bucket}");
    let made = http.put(&base).send().await?;
    ensure!(
        made.status().is_success(),
        "creating {bucket}: {}",
        made.status()
    );
    let started = Instant::now();
    let puts = futures::stream::iter(objects.iter().enumerate())
        .map(|(i, bytes)| {
            let req = http
                .put(format!("{base}/obj-{i}"))
                .header("content-type", "application/octet-stream")
                .body(bytes.clone());
            async move { req.send().await }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    for r in puts {
        let r = r.context("an S3 put")?;
        ensure!(r.status().is_success(), "an S3 put answered {}", r.status());
    }
    Ok(seconds)
}

/// Reads every `bucket/obj-N` of `objects` back through the S3 API at `s3`, checking the
/// bytes; seconds taken.
pub(crate) async fn get_plain(
    s3: SocketAddr,
    bucket: &str,
    objects: &[Vec<u8>],
    concurrency: usize,
) -> Result<f64> {
    let http = reqwest::Client::new();
    let base = format!("http://{s3}/{bucket}");
    let started = Instant::now();
    let gets = futures::stream::iter(objects.iter().enumerate())
        .map(|(i, bytes)| {
            let req = http.get(format!("{base}/obj-{i}"));
            async move {
                let resp = req.send().await?.error_for_status()?;
                let body = resp.bytes().await?;
                Ok::<bool, reqwest::Error>(body.as_ref() == bytes.as_slice())
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    for r in gets {
        ensure!(r.context("an S3 get")?, "an S3 get answered other bytes");
    }
    Ok(seconds)
}

/// A gateway on catalog `url` placing `replicas` copies, with S3.
pub(crate) async fn start_gateway(
    url: &str,
    replicas: u32,
) -> Result<(RunningGateway, tempfile::TempDir)> {
    let staging = tempfile::tempdir()?;
    let config = GatewayConfig {
        listen: any_port(),
        s3_listen: Some(any_port()),
        s3_staging: Some(staging.path().to_path_buf()),
        catalog: Some(url.to_string()),
        replicas,
        // The same photos are uploaded again and again: each is stored, as on the nodes.
        exact_duplicates: ndpipe_store::ExactDuplicates::Store,
        ..GatewayConfig::default()
    };
    let gateway = Gateway::open(config).await.context("opening the gateway")?;
    Ok((
        gateway.start().await.context("starting the gateway")?,
        staging,
    ))
}

/// Uploads `photos` through the gateway's `/v1`; seconds taken.
pub(crate) async fn gateway_photos(
    gateway: &RunningGateway,
    photos: &[Vec<u8>],
    concurrency: usize,
) -> Result<f64> {
    let front = client(gateway.http_addr())?;
    let started = Instant::now();
    super::replication::upload_all(&front, photos, concurrency).await?;
    Ok(started.elapsed().as_secs_f64())
}
