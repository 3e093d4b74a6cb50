//! What `ndpipe-bench duplicates` scores, all from a real PipeStore: a set is uploaded over
//! HTTP to a fresh node in this process (with the model, and `exact_duplicates = "store"` so
//! that every upload is a photo of its own), and what the node kept is read back: its exact
//! groups (`GET /v1/duplicates?level=exact`), the perceptual hashes its worker wrote to the
//! catalog, its stored tensors (hashed by the other algorithms for the sweep), and the
//! features online labelling stored.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use ndpipe::client::{Client, UploadError};
use ndpipe_catalog::{DuplicateCatalog, SqliteCatalog};
use ndpipe_model::{ImageTensor, TensorBlob};
use ndpipe_store::{DEFAULT_FEATURE_CACHE_BYTES, FeatureStore, NearHash, PipeStore};
use serde::Deserialize;

use crate::cluster::{client, store_config};
use crate::dup_set::Photo;

/// Uploads in flight at once.
const IN_FLIGHT: usize = 4;
/// Pause between two looks at what the node does in the background.
const POLL: Duration = Duration::from_millis(100);
/// Looks before a wait counts as a hang (a bounded count: 5 minutes of pauses).
const POLLS: u32 = 3000;
/// Groups per page of `GET /v1/duplicates`.
const PAGE: usize = 1000;

/// What a node kept of a set, by the photos' indices in the set.
pub(crate) struct Kept {
    /// Pairs of photos in one exact group of the node's.
    pub(crate) exact: Vec<(usize, usize)>,
    /// Each photo's hash by each algorithm: of its stored tensor, the node's own for the
    /// configured algorithm.
    pub(crate) hashes: HashMap<NearHash, Vec<u64>>,
    /// Each photo's stored features, unit length; `None` when the node ran without a model.
    pub(crate) features: Option<Vec<Vec<f32>>>,
}

/// One page of `GET /v1/duplicates`, as far as the benchmark reads it.
#[derive(Deserialize)]
struct Page {
    unhashed: Option<u64>,
    groups: Vec<Group>,
    next_after: Option<u64>,
}

/// A group of the page.
#[derive(Deserialize)]
struct Group {
    members: Vec<Member>,
}

/// A member of a group.
#[derive(Deserialize)]
struct Member {
    id: u64,
}

/// Stores `photos` on a fresh node (with the model in `model_dir`, or none) and reads back
/// what it kept.
pub(crate) async fn store_and_read(photos: &[Photo], model_dir: Option<&Path>) -> Result<Kept> {
    let dir = tempfile::tempdir().context("creating a temporary data directory")?;
    let data = dir.path().to_path_buf();
    let node = PipeStore::open(store_config(data.clone(), model_dir)).await?;
    let running = node.start(None, None).await?;
    let client = client(running.http_addr())?;
    let ids = upload_all(&client, photos).await?;
    let index: HashMap<u64, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    ensure!(
        index.len() == ids.len(),
        "two uploads answered the same photo id"
    );
    wait_hashed(&client).await?;
    if model_dir.is_some() {
        wait_labelled(&client, &ids).await?;
    }
    let exact = exact_pairs(&client, &index).await?;
    let tensors = stored_tensors(&client, &ids).await?;
    running.stop().await?;
    let hashes = hashes(&tensors)?;
    check_node_hashes(&data, &index, &hashes[&NearHash::default()])?;
    let features = match model_dir {
        Some(_) => Some(stored_features(&data, &ids)?),
        None => None,
    };
    Ok(Kept {
        exact,
        hashes,
        features,
    })
}

/// Uploads every photo, a few at a time; their ids in order.
async fn upload_all(client: &Client, photos: &[Photo]) -> Result<Vec<u64>> {
    let uploads = futures::stream::iter(photos.iter().map(|p| p.bytes.clone()))
        .map(|bytes| client.upload(bytes, None))
        .buffered(IN_FLIGHT);
    let results: Vec<Result<u64, UploadError>> = uploads.collect().await;
    results
        .into_iter()
        .map(|r| match r {
            Ok(id) => Ok(id),
            Err(UploadError::Rejected(b)) => bail!("upload rejected: {} ({})", b.message, b.error),
            Err(UploadError::Failed(e)) => Err(e),
        })
        .collect()
}

/// Waits until the node's hashing worker has hashed every photo.
async fn wait_hashed(client: &Client) -> Result<()> {
    for _ in 0..POLLS {
        let page: Page = client.get_json("/v1/duplicates?level=near&limit=1").await?;
        if page.unhashed == Some(0) {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("the node did not hash every photo in {POLLS} looks")
}

/// Waits until online labelling has labelled every photo of `ids` (a photo's labels are filed
/// after its features are stored).
async fn wait_labelled(client: &Client, ids: &[u64]) -> Result<()> {
    for id in ids {
        let mut looks = 0;
        loop {
            let labels: serde_json::Value =
                client.get_json(&format!("/v1/photos/{id}/labels")).await?;
            if labels.as_array().is_some_and(|a| !a.is_empty()) {
                break;
            }
            looks += 1;
            ensure!(
                looks < POLLS,
                "photo {id} was not labelled in {POLLS} looks"
            );
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// Every pair of photos in one of the node's exact groups, by index.
async fn exact_pairs(client: &Client, index: &HashMap<u64, usize>) -> Result<Vec<(usize, usize)>> {
    let mut pairs = Vec::new();
    let mut after = None;
    loop {
        let path = match after {
            Some(a) => format!("/v1/duplicates?level=exact&limit={PAGE}&after={a}"),
            None => format!("/v1/duplicates?level=exact&limit={PAGE}"),
        };
        let page: Page = client.get_json(&path).await?;
        for group in &page.groups {
            let members = group
                .members
                .iter()
                .map(|m| {
                    index
                        .get(&m.id)
                        .copied()
                        .context("a group names a photo not uploaded")
                })
                .collect::<Result<Vec<usize>>>()?;
            for (k, &a) in members.iter().enumerate() {
                pairs.extend(members[k + 1..].iter().map(|&b| (a, b)));
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(pairs),
        }
    }
}

/// The stored tensor of every photo (`GET /v1/photos/{id}/tensor`).
async fn stored_tensors(client: &Client, ids: &[u64]) -> Result<Vec<ImageTensor>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let blob = client.get_bytes(&format!("/v1/photos/{id}/tensor")).await?;
        out.push(TensorBlob::decode(&blob).with_context(|| format!("the tensor of photo {id}"))?);
    }
    Ok(out)
}

/// The hashes of `tensors` by every algorithm.
fn hashes(tensors: &[ImageTensor]) -> Result<HashMap<NearHash, Vec<u64>>> {
    NearHash::ALL
        .into_iter()
        .map(|alg| {
            let hasher = alg.hasher();
            let all = tensors
                .iter()
                .map(|t| {
                    hasher
                        .hash_tensor(t)
                        .context("a stored tensor that is not RGB")
                })
                .collect::<Result<Vec<u64>>>()?;
            Ok((alg, all))
        })
        .collect()
}

/// Checks that the hashes the node's worker wrote to its catalog (in `data`) are `ours`, the
/// hashes of its stored tensors by the same algorithm.
fn check_node_hashes(data: &Path, index: &HashMap<u64, usize>, ours: &[u64]) -> Result<()> {
    let catalog = SqliteCatalog::open(&data.join("catalog.sqlite"))?;
    let kept = catalog.near_hashes(NearHash::default().name(), 0)?;
    ensure!(
        kept.len() == ours.len(),
        "the node hashed {} of {} photos",
        kept.len(),
        ours.len()
    );
    for (id, hash) in kept {
        let i = index
            .get(&id)
            .copied()
            .context("a hash of a photo not uploaded")?;
        ensure!(
            ours[i] == hash,
            "photo {id}: the node's hash is not its tensor's"
        );
    }
    Ok(())
}

/// The features the node stored for every photo of `ids` (one backbone), unit length.
fn stored_features(data: &Path, ids: &[u64]) -> Result<Vec<Vec<f32>>> {
    let store = FeatureStore::open(
        &data.join("store/features.redb"),
        DEFAULT_FEATURE_CACHE_BYTES,
    )?;
    let first = ids.first().context("an empty set")?;
    let backbones = store.photo_features(*first)?;
    let [(backbone, _)] = backbones.as_slice() else {
        bail!(
            "photo {first} has features under {} backbones, not one",
            backbones.len()
        );
    };
    ids.iter()
        .map(|id| {
            let f = store
                .get(backbone, *id)?
                .with_context(|| format!("photo {id} has no features"))?;
            let norm = f
                .iter()
                .map(|v| v * v)
                .sum::<f32>()
                .sqrt()
                .max(f32::EPSILON);
            Ok(f.iter().map(|v| v / norm).collect())
        })
        .collect()
}
