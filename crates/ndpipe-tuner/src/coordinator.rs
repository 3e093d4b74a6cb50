//! The Tuner's jobs across PipeStores: pipelined fine-tuning from features, two-phase deploy,
//! re-labelling and rollback.
//!
//! Fine-tuning follows NDPipe: every node streams its validation features first, then its
//! training features in `runs` chunks; the Tuner trains run `k` (warm-started from run `k-1`,
//! with NDPipe's per-run learning-rate scale) while the nodes produce run `k+1`, and validates
//! after every run. Only features, labels and photo ids cross the network.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ndpipe_catalog::ModelVersion;
use ndpipe_model::{ImageTensor, InferenceBackend};
use ndpipe_proto::pb::{self, extract_event::Event};
use ndpipe_proto::{Features, HeadWeights, ProtoError, Tensors, decode_chunk, decode_tensor_chunk};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::cached::{CacheReport, CacheSetup, RemoteRow, train_run_cached};
use crate::nodes::{Node, Nodes};
use crate::versions::Versions;
use crate::{Head, HeadConfig, TunerError};

/// What a fine-tuning job is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinetuneRequest {
    /// Pipelined runs (NDPipe's `num_of_run`).
    pub runs: u32,
    /// Epochs per run.
    pub epochs: usize,
    /// Training batch size.
    pub batch: usize,
    /// Validation split: "val", or "test"; empty picks "val" when any node has such photos.
    pub val_split: String,
    /// Re-use stored features when the backbone is unchanged.
    pub use_stored_features: bool,
    /// Width of an optional hidden layer (not deployable in this version of the protocol).
    pub hidden: Option<usize>,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Photos per feature chunk on the wire.
    pub chunk_size: u32,
    /// Run boundaries are aligned to this many photos (the nodes' batch size).
    pub align: u32,
    /// Deploy the new version to every node and re-label the stores when training is done.
    pub deploy: bool,
    /// Per-node throttle in images/s, by node name (for load-balancing experiments).
    pub throttle: std::collections::BTreeMap<String, f64>,
    /// "near-data" (nodes send features) or "conventional" (nodes send preprocessed tensors and
    /// the Tuner runs the backbone), for comparison.
    pub mode: String,
    /// Cap on each node's sending rate, bytes/s (0: none): a stand-in for a slower network.
    pub bandwidth_bytes_per_second: f64,
    /// Once every node has sent its validation set, move work from slow nodes to fast ones in
    /// proportion to their measured throughput (the fast node fetches the slow node's tensors).
    pub load_balance: bool,
    /// Bytes of training features the Tuner may hold (0: no limit). When the job's features
    /// exceed it, training reads them through `cache_policy`, fetching misses from the nodes.
    pub memory_budget_bytes: u64,
    /// The cache used over the memory budget: spidercache, shade, icache, quiver, lru, lfu,
    /// static or nocache.
    pub cache_policy: String,
}

impl Default for FinetuneRequest {
    fn default() -> Self {
        FinetuneRequest {
            runs: 2,
            epochs: 30,
            batch: 1024,
            val_split: String::new(),
            use_stored_features: true,
            hidden: None,
            seed: 0,
            chunk_size: 256,
            align: 32,
            deploy: true,
            throttle: Default::default(),
            mode: "near-data".into(),
            bandwidth_bytes_per_second: 0.0,
            load_balance: true,
            memory_budget_bytes: 0,
            cache_policy: "spidercache".into(),
        }
    }
}

/// The timeline of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunTimeline {
    /// Run index, from 0.
    pub run: usize,
    /// Training rows of the run (all nodes).
    pub images: usize,
    /// Seconds from the job's start until every node had sent the run.
    pub ready_at: f64,
    /// Seconds from the job's start when training of the run began.
    pub train_start: f64,
    /// Seconds of training.
    pub train_seconds: f64,
    /// Validation top-1 after the run.
    pub val_top1: f32,
}

/// Per-node figures of a job.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// "name (node N)".
    pub node: String,
    /// Photos whose features it sent.
    pub images: u64,
    /// Of those, features computed by its backbone during the job.
    pub extracted: u64,
    /// Its seconds from first to last feature.
    pub seconds: f64,
    /// Its last reported throughput.
    pub images_per_second: f64,
}

/// Photos moved from a slow node to a fast one.
#[derive(Debug, Clone, Serialize)]
pub struct Rebalanced {
    /// The slow node.
    pub from: String,
    /// The fast node.
    pub to: String,
    /// Photos moved.
    pub photos: usize,
}

/// What a deploy and the re-labelling after it did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeployReport {
    /// The version now serving.
    pub version: String,
    /// Nodes that committed it.
    pub nodes: usize,
    /// Photos re-labelled, all nodes.
    pub relabelled: u64,
    /// Photos whose top-1 label was compared with the previous version's.
    pub compared: u64,
    /// Of those, photos whose top-1 label changed.
    pub changed: u64,
    /// `changed / compared`.
    pub changed_fraction: f64,
    /// How nodes re-labelled ("head": a matrix multiply over stored features).
    pub modes: Vec<String>,
}

/// The result of a fine-tuning job.
#[derive(Debug, Clone, Serialize)]
pub struct FinetuneReport {
    /// The new version.
    pub version: String,
    /// The version it was derived from.
    pub parent: Option<String>,
    /// The head's classes.
    pub classes: Vec<String>,
    /// Training photos, all nodes.
    pub train_images: usize,
    /// Validation photos, all nodes.
    pub val_images: usize,
    /// The validation split used.
    pub val_split: String,
    /// Per run.
    pub runs: Vec<RunTimeline>,
    /// Validation top-1 of the head before this job (0 for a new head).
    pub val_top1_before: f32,
    /// Validation top-1 at the end.
    pub val_top1: f32,
    /// Bytes of features, labels and ids received.
    pub bytes_received: u64,
    /// `bytes_received / (train + val images)`.
    pub bytes_per_image: f64,
    /// Chunks whose checksum failed and were fetched again.
    pub chunks_refetched: u64,
    /// Seconds from start until the last node sent its last run.
    pub extract_seconds: f64,
    /// Seconds of training in all runs.
    pub train_seconds: f64,
    /// Training seconds that overlapped feature extraction.
    pub train_hidden_seconds: f64,
    /// Seconds until the head was trained.
    pub seconds: f64,
    /// Per node.
    pub nodes: Vec<NodeReport>,
    /// Work moved by load balancing.
    pub rebalanced: Vec<Rebalanced>,
    /// The cache's figures, when the features exceeded the memory budget.
    pub cache: Option<CacheReport>,
    /// The deploy, when asked for.
    pub deploy: Option<DeployReport>,
}

/// The Tuner: nodes, registry, and the jobs over them.
pub struct Coordinator {
    nodes: Arc<Nodes>,
    versions: Versions,
    backbone: Option<Arc<dyn InferenceBackend>>,
    job: tokio::sync::Mutex<()>,
}

enum Msg {
    Event(usize, Event),
    Failed(usize, String),
    Ended(usize),
    Trained(Result<(usize, f64, f64, f32), TunerError>),
}

struct NodeState {
    val_ready: bool,
    runs_ready: BTreeSet<u32>,
    done: bool,
    images: u64,
    extracted: u64,
    seconds: f64,
    rate: f64,
}

impl Coordinator {
    /// A Tuner over its node registry and model registry.
    pub fn new(nodes: Arc<Nodes>, versions: Versions) -> Self {
        Coordinator {
            nodes,
            versions,
            backbone: None,
            job: tokio::sync::Mutex::new(()),
        }
    }

    /// Gives the Tuner its own copy of the backbone, for conventional mode.
    pub fn with_backbone(mut self, backbone: Arc<dyn InferenceBackend>) -> Self {
        self.backbone = Some(backbone);
        self
    }

    /// The node registry, shared with the Tuner's gRPC service.
    pub fn nodes_handle(&self) -> Arc<Nodes> {
        self.nodes.clone()
    }

    /// The registered nodes.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes.snapshot()
    }

    /// The model registry.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    /// Fine-tunes a new head from the nodes' features; deploys and re-labels when asked.
    pub async fn finetune(&self, req: FinetuneRequest) -> Result<FinetuneReport, TunerError> {
        let _job = self.job.try_lock().map_err(|_| TunerError::Busy)?;
        let started = Instant::now();
        let nodes = self.nodes.snapshot();
        if nodes.is_empty() {
            return Err(TunerError::NoNodes);
        }
        let inventories = self.inventories(&nodes).await?;
        let backbone = inventories[0].backbone_version.clone();
        let feature_dim = inventories[0].feature_dim as usize;
        for (node, inv) in nodes.iter().zip(&inventories) {
            if inv.backbone_version != backbone {
                return Err(node_error(
                    node,
                    format!(
                        "runs backbone {}, others run {backbone}",
                        inv.backbone_version
                    ),
                ));
            }
        }
        let pretrained = inventories[0].active_version.clone();
        let val_split = match req.val_split.as_str() {
            "" if inventories
                .iter()
                .flat_map(|i| &i.classes)
                .any(|c| c.val > 0) =>
            {
                "val".to_string()
            }
            "" => "test".to_string(),
            s => s.to_string(),
        };
        if req.runs == 0 {
            return Err(TunerError::InvalidArgument(
                "runs must be at least 1".into(),
            ));
        }
        let conventional = match req.mode.as_str() {
            "near-data" | "" => None,
            "conventional" => Some(self.backbone.clone().ok_or_else(|| {
                TunerError::InvalidArgument(
                    "conventional mode needs a backbone on the Tuner (--model-dir)".into(),
                )
            })?),
            other => {
                return Err(TunerError::InvalidArgument(format!(
                    "unknown mode {other:?}: use near-data or conventional"
                )));
            }
        };
        let (head, parent) =
            self.starting_head(&req, feature_dim, &inventories, &pretrained, &backbone)?;
        let classes = head.classes().to_vec();
        let mut head_slot = Some(head);
        let job_id = format!("ft-{}", now_ms());
        info!(job = %job_id, nodes = nodes.len(), classes = classes.len(), runs = req.runs, %val_split, "fine-tuning starts");

        let (tx, mut rx) = mpsc::channel::<Msg>(64);
        for (i, node) in nodes.iter().enumerate() {
            let request = pb::ExtractRequest {
                job_id: job_id.clone(),
                runs: req.runs,
                align: req.align,
                classes: classes.clone(),
                chunk_size: req.chunk_size,
                use_stored_features: req.use_stored_features,
                val_split: val_split.clone(),
                throttle_images_per_second: req.throttle.get(&node.name).copied().unwrap_or(0.0),
                ship_tensors: conventional.is_some(),
                bandwidth_bytes_per_second: req.bandwidth_bytes_per_second,
            };
            tokio::spawn(stream_node(i, node.clone(), request, tx.clone()));
        }

        let (train_tx, train_rx) = std::sync::mpsc::channel::<(usize, RunData)>();
        let mut train_rx_slot = Some(train_rx);
        let mut val = empty(feature_dim);
        let mut runs: Vec<Features> = (0..req.runs).map(|_| empty(feature_dim)).collect();
        let mut state: Vec<NodeState> = nodes
            .iter()
            .map(|_| NodeState {
                val_ready: false,
                runs_ready: BTreeSet::new(),
                done: false,
                images: 0,
                extracted: 0,
                seconds: 0.0,
                rate: 0.0,
            })
            .collect();
        let mut timeline: Vec<RunTimeline> = Vec::new();
        let mut next_to_train = 0usize;
        let mut trainer: Option<std::thread::JoinHandle<(Head, Option<CacheReport>)>> = None;
        let mut val_top1_before = 0.0;
        let mut bytes = 0u64;
        let mut refetched = 0u64;
        let mut extract_seconds = 0.0;
        let mut trained = 0usize;
        let mut seen_chunks: HashSet<(i32, u32, u32, usize)> = HashSet::new();
        let runs_total = req.runs as usize;
        let have: Vec<u64> = inventories
            .iter()
            .map(|i| i.classes.iter().map(|c| c.train).sum())
            .collect();
        let mut balanced = !req.load_balance || nodes.len() < 2;
        let mut takeovers: Vec<(usize, bool, usize)> = Vec::new();
        let feature_bytes: u64 = have.iter().sum::<u64>() * feature_dim as u64 * 4;
        let cache_setup = if req.memory_budget_bytes > 0 && feature_bytes > req.memory_budget_bytes
        {
            crate::cached::policy_kind(&req.cache_policy)?;
            info!(feature_bytes, budget = req.memory_budget_bytes, policy = %req.cache_policy, "features exceed the memory budget: training reads them through the cache");
            Some(CacheSetup {
                policy: req.cache_policy.clone(),
                budget_bytes: req.memory_budget_bytes,
                clients: nodes
                    .iter()
                    .map(|n| {
                        n.client()
                            .map_err(|e| node_error(n, e.message().to_string()))
                    })
                    .collect::<Result<_, _>>()?,
                handle: tokio::runtime::Handle::current(),
                dim: feature_dim,
                batch: req.batch,
                seed: req.seed,
            })
        } else {
            None
        };
        let mut remote: Vec<Vec<RemoteRow>> = (0..req.runs).map(|_| Vec::new()).collect();
        let mut rebalanced = Vec::new();

        while let Some(msg) = rx.recv().await {
            let msg = match msg {
                Msg::Event(v, event) if v >= nodes.len() => {
                    let (fast, done, slow) = &mut takeovers[v - nodes.len()];
                    match event {
                        Event::Chunk(chunk) => {
                            bytes += wire_bytes(&chunk);
                            let f = decode_chunk(&chunk, classes.len())
                                .map_err(|e| node_error(&nodes[*fast], e.to_string()))?;
                            state[*fast].images += f.len() as u64;
                            let run = chunk.run as usize % runs_total;
                            if cache_setup.is_some() {
                                remote[run].extend(rows_of(*slow, &f));
                            } else {
                                append(&mut runs[run], f);
                            }
                        }
                        Event::Done(_) => *done = true,
                        Event::RunReady(_) | Event::Throughput(_) => {}
                    }
                    None
                }
                Msg::Failed(v, message) if v >= nodes.len() => {
                    let (fast, _, slow) = takeovers[v - nodes.len()];
                    return Err(node_error(
                        &nodes[fast],
                        format!(
                            "taking over work from {} failed: {message}",
                            nodes[slow].label()
                        ),
                    ));
                }
                Msg::Ended(v) if v >= nodes.len() => {
                    if !takeovers[v - nodes.len()].1 {
                        return Err(node_error(
                            &nodes[takeovers[v - nodes.len()].0],
                            "its take-over stream ended early".into(),
                        ));
                    }
                    None
                }
                other => Some(other),
            };
            if let Some(msg) = msg {
                match msg {
                    Msg::Failed(i, message) => return Err(node_error(&nodes[i], message)),
                    Msg::Ended(i) if !state[i].done => {
                        return Err(node_error(
                            &nodes[i],
                            "its feature stream ended before the job was done".into(),
                        ));
                    }
                    Msg::Ended(_) => {}
                    Msg::Trained(result) => {
                        let (run, start, seconds, top1) = result?;
                        timeline[run].train_start = start;
                        timeline[run].train_seconds = seconds;
                        timeline[run].val_top1 = top1;
                        trained += 1;
                        if trained == runs_total {
                            break;
                        }
                    }
                    Msg::Event(i, Event::Chunk(chunk)) => {
                        let key = (chunk.part, chunk.run, chunk.seq, i);
                        if !seen_chunks.insert(key) {
                            continue;
                        }
                        bytes += wire_bytes(&chunk);
                        let chunk = match verify(&chunk, classes.len()) {
                            Ok(()) => chunk,
                            Err(ProtoError::Checksum { .. }) => {
                                warn!(node = %nodes[i].label(), run = chunk.run, seq = chunk.seq, "chunk checksum mismatch; fetching it again");
                                refetched += 1;
                                let again = refetch(&nodes[i], &job_id, &chunk).await?;
                                bytes += wire_bytes(&again);
                                verify(&again, classes.len())
                                    .map_err(|e| node_error(&nodes[i], e.to_string()))?;
                                again
                            }
                            Err(e) => return Err(node_error(&nodes[i], e.to_string())),
                        };
                        let features = match &conventional {
                            None => decode_chunk(&chunk, classes.len())
                                .map_err(|e| node_error(&nodes[i], e.to_string()))?,
                            Some(backbone) => {
                                let tensors = decode_tensor_chunk(&chunk, classes.len())
                                    .map_err(|e| node_error(&nodes[i], e.to_string()))?;
                                let backbone = backbone.clone();
                                tokio::task::spawn_blocking(move || {
                                    extract_on_tuner(&*backbone, tensors)
                                })
                                .await
                                .map_err(|e| TunerError::InvalidArgument(e.to_string()))??
                            }
                        };
                        if features.dim != feature_dim {
                            return Err(node_error(
                                &nodes[i],
                                format!("sent {}-d features, expected {feature_dim}", features.dim),
                            ));
                        }
                        state[i].images += features.len() as u64;
                        if cache_setup.is_some() && chunk.part == pb::Part::Train as i32 {
                            let run = remote.get_mut(chunk.run as usize).ok_or_else(|| {
                                node_error(
                                    &nodes[i],
                                    format!("sent run {} of {}", chunk.run, req.runs),
                                )
                            })?;
                            run.extend(rows_of(i, &features));
                            continue;
                        }
                        let target = if chunk.part == pb::Part::Val as i32 {
                            &mut val
                        } else {
                            runs.get_mut(chunk.run as usize).ok_or_else(|| {
                                node_error(
                                    &nodes[i],
                                    format!("sent run {} of {}", chunk.run, req.runs),
                                )
                            })?
                        };
                        append(target, features);
                    }
                    Msg::Event(i, Event::RunReady(ready)) => {
                        if ready.part == pb::Part::Val as i32 {
                            state[i].val_ready = true;
                        } else {
                            state[i].runs_ready.insert(ready.run);
                        }
                    }
                    Msg::Event(i, Event::Throughput(t)) => {
                        state[i].rate = t.images_per_second;
                    }
                    Msg::Event(i, Event::Done(done)) => {
                        state[i].done = true;
                        state[i].extracted = done.extracted;
                        state[i].seconds = done.seconds;
                        if state.iter().all(|s| s.done) {
                            extract_seconds = started.elapsed().as_secs_f64();
                        }
                    }
                }
            }
            if !balanced && state.iter().all(|s| s.val_ready) {
                balanced = true;
                let rates: Vec<f64> = state.iter().map(|s| s.rate).collect();
                for (slow, fast, n) in balance_plan(&have, &rates, req.chunk_size as u64) {
                    let reply = nodes[slow]
                        .client()
                        .map_err(|e| node_error(&nodes[slow], e.message().to_string()))?
                        .rebalance(pb::RebalanceRequest {
                            job_id: job_id.clone(),
                            give: n as u32,
                        })
                        .await
                        .map_err(|e| {
                            node_error(&nodes[slow], format!("rebalance failed: {}", e.message()))
                        })?
                        .into_inner();
                    if reply.photos.is_empty() {
                        continue;
                    }
                    info!(from = %nodes[slow].label(), to = %nodes[fast].label(), photos = reply.photos.len(), "load balancing");
                    rebalanced.push(Rebalanced {
                        from: nodes[slow].label(),
                        to: nodes[fast].label(),
                        photos: reply.photos.len(),
                    });
                    let request = pb::TakeOverRequest {
                        job_id: job_id.clone(),
                        source_url: nodes[slow].url.clone(),
                        photos: reply.photos,
                        run: reply.run,
                        chunk_size: req.chunk_size,
                        first_seq: 1_000_000 * (takeovers.len() as u32 + 1),
                    };
                    let index = nodes.len() + takeovers.len();
                    takeovers.push((fast, false, slow));
                    tokio::spawn(stream_takeover(
                        index,
                        nodes[fast].clone(),
                        request,
                        tx.clone(),
                    ));
                }
            }
            // Start the next run once every node has sent it (and the validation set); the last
            // run also waits for the work other nodes took over.
            while next_to_train < runs_total
                && state
                    .iter()
                    .all(|s| s.val_ready && s.runs_ready.contains(&(next_to_train as u32)))
                && (next_to_train + 1 < runs_total || takeovers.iter().all(|t| t.1))
            {
                if trainer.is_none() {
                    let head = head_slot.take().ok_or_else(|| {
                        TunerError::InvalidArgument("the head was already handed over".into())
                    })?;
                    val_top1_before = if val.is_empty() {
                        0.0
                    } else {
                        head.evaluate(&val.values, &val.labels)?
                    };
                    let val_set = std::mem::replace(&mut val, empty(feature_dim));
                    trainer = Some(spawn_trainer(
                        head,
                        val_set,
                        req.epochs,
                        runs_total,
                        started,
                        train_rx_slot.take().ok_or_else(|| {
                            TunerError::InvalidArgument("trainer started twice".into())
                        })?,
                        tx.clone(),
                        cache_setup.clone(),
                    ));
                }
                let run = std::mem::replace(&mut runs[next_to_train], empty(feature_dim));
                let data = if cache_setup.is_some() {
                    RunData::Remote(std::mem::take(&mut remote[next_to_train]))
                } else {
                    RunData::Memory(run.values, run.labels)
                };
                timeline.push(RunTimeline {
                    run: next_to_train,
                    images: data.len(),
                    ready_at: started.elapsed().as_secs_f64(),
                    train_start: 0.0,
                    train_seconds: 0.0,
                    val_top1: 0.0,
                });
                if train_tx.send((next_to_train, data)).is_err() {
                    return Err(TunerError::InvalidArgument(
                        "the training thread stopped".into(),
                    ));
                }
                next_to_train += 1;
            }
        }
        drop(train_tx);
        let (head, cache_report) = trainer
            .ok_or_else(|| TunerError::InvalidArgument("no run was trained".into()))?
            .join()
            .map_err(|_| TunerError::InvalidArgument("the training thread panicked".into()))?;
        if extract_seconds == 0.0 {
            extract_seconds = started.elapsed().as_secs_f64();
        }
        let seconds = started.elapsed().as_secs_f64();
        let train_images: usize = timeline.iter().map(|t| t.images).sum();
        let val_images = state.iter().map(|s| s.images).sum::<u64>() as usize - train_images;
        let train_seconds: f64 = timeline.iter().map(|t| t.train_seconds).sum();
        let train_hidden_seconds: f64 = timeline
            .iter()
            .map(|t| {
                (extract_seconds.min(t.train_start + t.train_seconds) - t.train_start).max(0.0)
            })
            .sum();
        let val_top1 = timeline.last().map_or(0.0, |t| t.val_top1);
        let version = format!("{job_id}-{}", &backbone[..backbone.len().min(8)]);
        head.save(&self.versions.head_path(&version))?;
        if !pretrained.is_empty() {
            self.versions.record(&ModelVersion {
                id: pretrained.clone(),
                backbone: backbone.clone(),
                parent: None,
                metrics: serde_json::json!({"head": "pretrained"}),
                created_ms: 0,
                active: false,
            })?;
        }
        let mut report = FinetuneReport {
            version: version.clone(),
            parent: parent.clone(),
            classes: classes.clone(),
            train_images,
            val_images,
            val_split,
            runs: timeline,
            val_top1_before,
            val_top1,
            bytes_received: bytes,
            bytes_per_image: bytes as f64 / (train_images + val_images).max(1) as f64,
            chunks_refetched: refetched,
            extract_seconds,
            train_seconds,
            train_hidden_seconds,
            seconds,
            nodes: nodes
                .iter()
                .zip(&state)
                .map(|(n, s)| NodeReport {
                    node: n.label(),
                    images: s.images,
                    extracted: s.extracted,
                    seconds: s.seconds,
                    images_per_second: s.rate,
                })
                .collect(),
            rebalanced,
            cache: cache_report,
            deploy: None,
        };
        self.versions.record(&ModelVersion {
            id: version.clone(),
            backbone: backbone.clone(),
            parent,
            metrics: serde_json::json!({
                "val_top1": report.val_top1,
                "val_top1_before": report.val_top1_before,
                "val_split": report.val_split,
                "train_images": report.train_images,
                "runs": req.runs,
                "epochs": req.epochs,
                "classes": classes.len(),
            }),
            created_ms: now_ms(),
            active: false,
        })?;
        info!(%version, val_top1, seconds, "fine-tuning done");
        if req.deploy {
            report.deploy = Some(self.deploy_locked(&version).await?);
        }
        Ok(report)
    }

    /// Deploys `version` (two-phase) to every node and re-labels the stores; also a rollback.
    pub async fn deploy(&self, version: &str) -> Result<DeployReport, TunerError> {
        let _job = self.job.try_lock().map_err(|_| TunerError::Busy)?;
        self.deploy_locked(version).await
    }

    async fn deploy_locked(&self, version: &str) -> Result<DeployReport, TunerError> {
        let record = self.versions.get(version)?;
        let nodes = self.nodes.snapshot();
        if nodes.is_empty() {
            return Err(TunerError::NoNodes);
        }
        let path = self.versions.head_path(version);
        if path.exists() {
            let head = Head::load(&path)?;
            let (weights, bias) = head.linear_weights()?;
            let wire = HeadWeights {
                classes: head.classes().to_vec(),
                input_dim: head.input_dim(),
                weights,
                bias,
            };
            let (bytes, crc32c) = wire.to_bytes();
            let request = pb::StageHeadRequest {
                version: version.to_string(),
                backbone_version: record.backbone.clone(),
                classes: wire.classes.clone(),
                input_dim: wire.input_dim as u32,
                weights: bytes,
                crc32c,
                parent: record.parent.clone().unwrap_or_default(),
                metrics_json: record.metrics.to_string(),
            };
            let staged = futures::future::join_all(nodes.iter().map(|n| {
                let request = request.clone();
                async move {
                    n.client()
                        .map_err(|e| e.message().to_string())?
                        .stage_head(request)
                        .await
                        .map_err(|e| e.message().to_string())
                }
            }))
            .await;
            if let Some((node, err)) = nodes
                .iter()
                .zip(&staged)
                .find_map(|(n, r)| r.as_ref().err().map(|e| (n, e.clone())))
            {
                for n in &nodes {
                    if let Ok(mut c) = n.client() {
                        let _ = c
                            .abort_head(pb::AbortHeadRequest {
                                version: version.to_string(),
                            })
                            .await;
                    }
                }
                return Err(TunerError::DeployAborted {
                    version: version.to_string(),
                    reason: format!("{}: {err}", node.label()),
                });
            }
        }
        for n in &nodes {
            n.client()
                .map_err(|e| node_error(n, e.message().to_string()))?
                .commit_head(pb::CommitHeadRequest {
                    version: version.to_string(),
                })
                .await
                .map_err(|e| node_error(n, format!("commit failed: {}", e.message())))?;
        }
        self.versions.set_active(version)?;
        let mut report = DeployReport {
            version: version.to_string(),
            nodes: nodes.len(),
            ..DeployReport::default()
        };
        let replies = futures::future::join_all(nodes.iter().map(|n| async move {
            n.client()?
                .relabel(pb::RelabelRequest {
                    version: version.to_string(),
                })
                .await
                .map(|r| r.into_inner())
        }))
        .await;
        for (n, reply) in nodes.iter().zip(replies) {
            let reply = reply
                .map_err(|e| node_error(n, format!("re-labelling failed: {}", e.message())))?;
            report.relabelled += reply.photos;
            report.compared += reply.compared;
            report.changed += reply.changed;
            report.modes.push(reply.mode);
        }
        report.changed_fraction = if report.compared == 0 {
            0.0
        } else {
            report.changed as f64 / report.compared as f64
        };
        info!(
            version,
            changed = report.changed_fraction,
            "deployed and re-labelled"
        );
        Ok(report)
    }

    async fn inventories(&self, nodes: &[Node]) -> Result<Vec<pb::InventoryReply>, TunerError> {
        let replies = futures::future::join_all(nodes.iter().map(|n| async move {
            n.client()?
                .inventory(pb::InventoryRequest {})
                .await
                .map(|r| r.into_inner())
        }))
        .await;
        nodes
            .iter()
            .zip(replies)
            .map(|(n, r)| r.map_err(|e| node_error(n, e.message().to_string())))
            .collect()
    }

    /// The head to start from: the active version's (with new classes added) or a new one.
    fn starting_head(
        &self,
        req: &FinetuneRequest,
        feature_dim: usize,
        inventories: &[pb::InventoryReply],
        pretrained: &str,
        backbone: &str,
    ) -> Result<(Head, Option<String>), TunerError> {
        let labels: BTreeSet<String> = inventories
            .iter()
            .flat_map(|i| &i.classes)
            .filter(|c| c.train > 0)
            .map(|c| c.label.clone())
            .collect();
        if labels.is_empty() {
            return Err(TunerError::EmptyData);
        }
        let active = self.versions.active()?.filter(|v| v.backbone == backbone);
        if let Some(active) = active {
            let path = self.versions.head_path(&active.id);
            if path.exists() && req.hidden.is_none() {
                let mut head = Head::load(&path)?;
                let new: Vec<String> = labels
                    .iter()
                    .filter(|l| !head.classes().contains(l))
                    .cloned()
                    .collect();
                if !new.is_empty() {
                    head.grow_classes(new)?;
                }
                return Ok((head, Some(active.id)));
            }
        }
        let mut config = HeadConfig::new(labels.into_iter().collect());
        config.input_dim = feature_dim;
        config.hidden = req.hidden;
        config.epochs = req.epochs;
        config.batch = req.batch;
        config.seed = req.seed;
        Ok((
            Head::new(config)?,
            Some(pretrained.to_string()).filter(|p| !p.is_empty()),
        ))
    }
}

/// The training data of one run: in memory, or by reference (read through a cache).
enum RunData {
    Memory(Vec<f32>, Vec<u32>),
    Remote(Vec<RemoteRow>),
}

impl RunData {
    fn len(&self) -> usize {
        match self {
            RunData::Memory(_, labels) => labels.len(),
            RunData::Remote(rows) => rows.len(),
        }
    }
}

fn rows_of(node: usize, f: &Features) -> impl Iterator<Item = RemoteRow> + '_ {
    f.photo_ids
        .iter()
        .zip(&f.labels)
        .map(move |(photo, label)| RemoteRow {
            node,
            photo: *photo,
            label: *label,
        })
}

#[allow(clippy::too_many_arguments)]
fn spawn_trainer(
    mut head: Head,
    val: Features,
    epochs: usize,
    runs: usize,
    started: Instant,
    rx: std::sync::mpsc::Receiver<(usize, RunData)>,
    tx: mpsc::Sender<Msg>,
    cache: Option<CacheSetup>,
) -> std::thread::JoinHandle<(Head, Option<CacheReport>)> {
    std::thread::spawn(move || {
        let mut report = cache.as_ref().map(|_| CacheReport::default());
        for (run, data) in rx {
            let start = started.elapsed().as_secs_f64();
            let t = Instant::now();
            let result = (|| {
                let top1 = match (data, &cache, report.as_mut()) {
                    (RunData::Remote(rows), Some(setup), Some(report)) => {
                        train_run_cached(&mut head, rows, run, runs, epochs, &val, setup, report)?
                    }
                    (RunData::Memory(values, labels), _, _) => {
                        if !labels.is_empty() {
                            head.train_run(&values, &labels, run, runs, epochs)?;
                        }
                        if val.is_empty() {
                            0.0
                        } else {
                            head.evaluate(&val.values, &val.labels)?
                        }
                    }
                    _ => {
                        return Err(TunerError::InvalidArgument(
                            "remote rows without a cache".into(),
                        ));
                    }
                };
                Ok((run, start, t.elapsed().as_secs_f64(), top1))
            })();
            if tx.blocking_send(Msg::Trained(result)).is_err() {
                break;
            }
        }
        (head, report)
    })
}

async fn stream_node(i: usize, node: Node, request: pb::ExtractRequest, tx: mpsc::Sender<Msg>) {
    let mut client = match node.client() {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(Msg::Failed(i, e.message().to_string())).await;
            return;
        }
    };
    match client.extract(request).await {
        Ok(s) => forward(i, s.into_inner(), tx).await,
        Err(e) => {
            let _ = tx.send(Msg::Failed(i, e.message().to_string())).await;
        }
    }
}

/// Passes a node's events to the job until the stream ends.
async fn forward(i: usize, mut stream: tonic::Streaming<pb::ExtractEvent>, tx: mpsc::Sender<Msg>) {
    loop {
        match stream.message().await {
            Ok(Some(pb::ExtractEvent { event: Some(event) })) => {
                if tx.send(Msg::Event(i, event)).await.is_err() {
                    return;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                let _ = tx.send(Msg::Ended(i)).await;
                return;
            }
            Err(e) => {
                let _ = tx.send(Msg::Failed(i, e.message().to_string())).await;
                return;
            }
        }
    }
}

/// Streams the features of work `node` took over from another node.
async fn stream_takeover(
    i: usize,
    node: Node,
    request: pb::TakeOverRequest,
    tx: mpsc::Sender<Msg>,
) {
    let mut client = match node.client() {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(Msg::Failed(i, e.message().to_string())).await;
            return;
        }
    };
    match client.take_over(request).await {
        Ok(stream) => forward(i, stream.into_inner(), tx).await,
        Err(e) => {
            let _ = tx.send(Msg::Failed(i, e.message().to_string())).await;
        }
    }
}

/// NDPipe's proportional split: node `i` should do `rate_i / sum(rates)` of all the work; each
/// overloaded node gives its excess to underloaded ones. Returns (slow, fast, photos) moves of at
/// least `min_move` photos.
pub fn balance_plan(have: &[u64], rates: &[f64], min_move: u64) -> Vec<(usize, usize, u64)> {
    let total: u64 = have.iter().sum();
    let rate_total: f64 = rates.iter().sum();
    if rate_total <= 0.0 || rates.iter().any(|r| *r <= 0.0) {
        return Vec::new();
    }
    let mut diff: Vec<i64> = have
        .iter()
        .zip(rates)
        .map(|(h, r)| *h as i64 - (r / rate_total * total as f64).floor() as i64)
        .collect();
    let mut moves = Vec::new();
    while let (Some((slow, &most)), Some((fast, &least))) = (
        diff.iter().enumerate().max_by_key(|(_, d)| **d),
        diff.iter().enumerate().min_by_key(|(_, d)| **d),
    ) {
        let n = most.min(-least);
        if n < min_move.max(1) as i64 {
            break;
        }
        moves.push((slow, fast, n as u64));
        diff[slow] -= n;
        diff[fast] += n;
    }
    moves
}

async fn refetch(
    node: &Node,
    job_id: &str,
    chunk: &pb::FeatureChunk,
) -> Result<pb::FeatureChunk, TunerError> {
    let mut client = node
        .client()
        .map_err(|e| node_error(node, e.message().to_string()))?;
    client
        .fetch_chunk(pb::FetchChunkRequest {
            job_id: job_id.to_string(),
            part: chunk.part,
            run: chunk.run,
            seq: chunk.seq,
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|e| node_error(node, format!("re-fetching a chunk failed: {}", e.message())))
}

/// Checks a chunk's shape and checksum without decoding it.
fn verify(chunk: &pb::FeatureChunk, classes: usize) -> Result<(), ProtoError> {
    if chunk.encoding == pb::Encoding::U8Tensors as i32 {
        decode_tensor_chunk(chunk, classes).map(drop)
    } else {
        decode_chunk(chunk, classes).map(drop)
    }
}

/// Conventional mode: the Tuner runs the backbone on shipped tensors.
fn extract_on_tuner(backbone: &dyn InferenceBackend, t: Tensors) -> Result<Features, TunerError> {
    let per = (t.height * t.width * 3) as usize;
    let images: Vec<ImageTensor> = t
        .data
        .chunks_exact(per)
        .map(|d| ImageTensor::new(t.height, t.width, 3, d.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| TunerError::InvalidArgument(e.to_string()))?;
    let dim = backbone.info().feature_dim;
    let mut values = Vec::with_capacity(images.len() * dim);
    for batch in images.chunks(backbone.max_batch().max(1)) {
        let out = backbone
            .run(batch)
            .map_err(|e| TunerError::InvalidArgument(format!("backbone on the Tuner: {e}")))?;
        values.extend_from_slice(out.all_features());
    }
    Ok(Features {
        values,
        dim,
        labels: t.labels,
        photo_ids: t.photo_ids,
    })
}

fn empty(dim: usize) -> Features {
    Features {
        values: Vec::new(),
        dim,
        labels: Vec::new(),
        photo_ids: Vec::new(),
    }
}

fn append(target: &mut Features, more: Features) {
    target.values.extend(more.values);
    target.labels.extend(more.labels);
    target.photo_ids.extend(more.photo_ids);
}

fn wire_bytes(c: &pb::FeatureChunk) -> u64 {
    (c.features.len() + c.labels.len() * 4 + c.photo_ids.len() * 8) as u64
}

fn node_error(node: &Node, message: String) -> TunerError {
    TunerError::Node {
        node: node.label(),
        message,
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::balance_plan;

    #[test]
    fn work_moves_from_slow_to_fast_in_proportion() {
        // Equal shares, but node 1 is three times slower: it should keep a quarter.
        assert_eq!(
            balance_plan(&[400, 400], &[300.0, 100.0], 10),
            vec![(1, 0, 200)]
        );
        // Balanced already, or moves smaller than a chunk: nothing to do.
        assert!(balance_plan(&[400, 400], &[100.0, 100.0], 10).is_empty());
        assert!(balance_plan(&[400, 405], &[100.0, 100.0], 10).is_empty());
        // No rate yet: no plan.
        assert!(balance_plan(&[400, 400], &[100.0, 0.0], 10).is_empty());
        // Three nodes: the slow one feeds both fast ones; the total is preserved.
        let moves = balance_plan(&[300, 300, 300], &[200.0, 200.0, 50.0], 1);
        let moved: u64 = moves.iter().map(|m| m.2).sum();
        assert!(moves.iter().all(|m| m.0 == 2 && m.1 != 2), "{moves:?}");
        assert_eq!(moved, 300 - 100, "{moves:?}");
    }
}
