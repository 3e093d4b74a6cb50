//! The PipeStore's gRPC service for the Tuner: inventory, feature extraction in pipelined runs,
//! two-phase head deploys and re-labelling.
//!
//! Features leave the node, photos never do. Extraction re-uses the feature store when the
//! backbone is unchanged and runs the backbone (storing the result) for photos that have none.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ndpipe_catalog::{Catalog, ModelVersion, Prediction, Split};
use ndpipe_model::{ImageTensor, TensorBlob};
use ndpipe_proto::pb::pipe_store_server::PipeStore as PipeStoreRpc;
use ndpipe_proto::pb::{self, extract_event::Event};
use ndpipe_proto::{Features, HeadWeights, RunPlan, Tensors, encode_chunk, encode_tensor_chunk};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::PhotoStore;
use crate::labeler::{ActiveModel, SharedModel, head_predictions};
use crate::relabel::{RelabelOptions, RelabelReport, Relabeler, previous_top1};

/// A job's photos, fixed when extraction starts so that a chunk can be sent again.
struct JobPlan {
    val: Vec<(u64, u32)>,
    train: Vec<(u64, u32)>,
    plan: RunPlan,
    chunk_size: usize,
    ship_tensors: bool,
    use_stored: bool,
    /// The last run's (next row to extract, rows it keeps): load balancing may lower the limit
    /// while extraction runs, giving the tail to a faster node.
    last: Mutex<(usize, usize)>,
}

impl JobPlan {
    fn is_last(&self, part: pb::Part, run: u32) -> bool {
        part == pb::Part::Train && run as usize + 1 == self.plan.runs()
    }

    /// All rows of a part and run (the last run without the tail given away).
    fn rows(&self, part: pb::Part, run: u32) -> &[(u64, u32)] {
        match part {
            pb::Part::Train => {
                let all = self
                    .plan
                    .chunk(run as usize)
                    .map_or(&[][..], |r| &self.train[r]);
                if self.is_last(part, run) {
                    &all[..lock(&self.last).1.min(all.len())]
                } else {
                    all
                }
            }
            _ => &self.val,
        }
    }

    /// The next chunk to extract of a part and run, as (seq, rows); `cursor` tracks progress in
    /// runs that cannot shrink.
    fn take_chunk(
        &self,
        part: pb::Part,
        run: u32,
        cursor: &mut usize,
    ) -> Option<(u32, &[(u64, u32)])> {
        let cs = self.chunk_size;
        if self.is_last(part, run) {
            let all = self
                .plan
                .chunk(run as usize)
                .map_or(&[][..], |r| &self.train[r]);
            let mut last = lock(&self.last);
            let (start, limit) = *last;
            if start >= limit {
                return None;
            }
            let end = (start + cs).min(limit);
            last.0 = end;
            return Some(((start / cs) as u32, &all[start..end]));
        }
        let rows = self.rows(part, run);
        if *cursor >= rows.len() {
            return None;
        }
        let start = *cursor;
        *cursor = (start + cs).min(rows.len());
        Some(((start / cs) as u32, &rows[start..*cursor]))
    }

    /// Gives up to `give` not yet extracted rows from the tail of the last run.
    fn give_tail(&self, give: usize) -> (u32, Vec<(u64, u32)>) {
        let run = self.plan.runs().saturating_sub(1);
        let all = self.plan.chunk(run).map_or(&[][..], |r| &self.train[r]);
        let mut last = lock(&self.last);
        let (next, limit) = *last;
        let new_limit = limit.saturating_sub(give).max(next);
        last.1 = new_limit;
        (run as u32, all[new_limit..limit].to_vec())
    }
}

struct Staged {
    head: HeadWeights,
    request: pb::StageHeadRequest,
}

/// The PipeStore side of the Tuner protocol.
pub struct PipeStoreNode {
    store: Arc<PhotoStore>,
    catalog: Arc<dyn Catalog>,
    model: SharedModel,
    pretrained: ActiveModel,
    node_id: AtomicU32,
    plans: Mutex<HashMap<String, Arc<JobPlan>>>,
    staged: Mutex<HashMap<String, Staged>>,
    heads_dir: PathBuf,
    corrupt_chunks: AtomicU32,
    previous: Mutex<Option<String>>,
}

impl PipeStoreNode {
    /// A node over its store, catalog and model; committed heads are kept in `heads_dir`. The
    /// head of the catalog's active version, if it has one there, is loaded.
    pub fn new(
        store: Arc<PhotoStore>,
        catalog: Arc<dyn Catalog>,
        model: SharedModel,
        heads_dir: PathBuf,
    ) -> Result<Self, Status> {
        std::fs::create_dir_all(&heads_dir)
            .map_err(|e| Status::internal(format!("creating {}: {e}", heads_dir.display())))?;
        let pretrained = ActiveModel {
            head: None,
            ..model.get()
        };
        let node = PipeStoreNode {
            store,
            catalog,
            model,
            pretrained,
            node_id: AtomicU32::new(0),
            plans: Mutex::new(HashMap::new()),
            staged: Mutex::new(HashMap::new()),
            heads_dir,
            corrupt_chunks: AtomicU32::new(0),
            previous: Mutex::new(None),
        };
        node.load_active_head()?;
        Ok(node)
    }

    /// Testing only: damages the next `n` chunks sent, so that their checksum fails.
    pub fn with_corrupt_chunks(self, n: u32) -> Self {
        self.corrupt_chunks.store(n, Ordering::Relaxed);
        self
    }

    /// The backbone this node runs.
    pub fn backbone(&self) -> Arc<dyn ndpipe_model::InferenceBackend> {
        self.pretrained.backend.clone()
    }

    /// A stored photo's compressed tensor.
    fn stored_blob(&self, id: u64) -> Result<Vec<u8>, Status> {
        self.store
            .tensor(id)
            .map_err(internal)?
            .map(|(_, blob)| blob)
            .ok_or_else(|| Status::not_found(format!("photo {id} has no tensor")))
    }

    /// A stored photo's decoded tensor.
    fn stored_tensor(&self, id: u64) -> Result<ImageTensor, Status> {
        TensorBlob::decode(&self.stored_blob(id)?)
            .map_err(|e| Status::data_loss(format!("tensor of photo {id}: {e}")))
    }

    /// The plan of a job whose extraction started on this node.
    fn job(&self, id: &str) -> Result<Arc<JobPlan>, Status> {
        lock(&self.plans)
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("unknown job {id}")))
    }

    /// Records the id the Tuner assigned.
    pub fn set_node_id(&self, id: u32) {
        self.node_id.store(id, Ordering::Relaxed);
    }

    fn load_active_head(&self) -> Result<(), Status> {
        let active = self
            .catalog
            .models()
            .map_err(internal)?
            .into_iter()
            .find(|m| m.active);
        let Some(active) = active else { return Ok(()) };
        let path = self.head_path(&active.id);
        if !path.exists() {
            return Ok(());
        }
        let bytes = std::fs::read(&path)
            .map_err(|e| Status::internal(format!("reading {}: {e}", path.display())))?;
        let request: pb::StageHeadRequest = prost::Message::decode(&bytes[..]).map_err(internal)?;
        let head = HeadWeights::from_request(&request).map_err(internal)?;
        info!(version = %active.id, classes = head.classes.len(), "loaded the active fine-tuned head");
        self.model.set(ActiveModel {
            version: active.id,
            head: Some(Arc::new(head)),
            ..self.pretrained.clone()
        });
        Ok(())
    }

    fn head_path(&self, version: &str) -> PathBuf {
        let safe: String = version
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.heads_dir.join(format!("{safe}.head"))
    }

    fn plan(&self, req: &pb::ExtractRequest) -> Result<JobPlan, Status> {
        if req.runs == 0 || req.align == 0 || req.chunk_size == 0 {
            return Err(Status::invalid_argument(
                "runs, align and chunk_size must be at least 1",
            ));
        }
        let index: HashMap<&str, u32> = req
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i as u32))
            .collect();
        let val_split: Split = req
            .val_split
            .parse()
            .map_err(|e| Status::invalid_argument(format!("{e}")))?;
        let select = |split: Split| -> Result<Vec<(u64, u32)>, Status> {
            Ok(self
                .catalog
                .labelled(split)
                .map_err(internal)?
                .into_iter()
                .filter_map(|(id, label)| index.get(label.as_str()).map(|c| (id, *c)))
                .collect())
        };
        // Runs are contiguous chunks, so the training photos are shuffled first (seeded by the
        // job): in id order, a run would hold only the photos of one arrival period.
        let mut train = select(Split::Train)?;
        let seed = req.job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        train.shuffle(&mut rand_pcg::Pcg64Mcg::seed_from_u64(seed));
        let plan = RunPlan::new(train.len(), req.runs as usize, req.align as usize)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let last_len = plan
            .chunk(plan.runs().saturating_sub(1))
            .map_or(0, |r| r.len());
        Ok(JobPlan {
            val: select(val_split)?,
            train,
            plan,
            chunk_size: req.chunk_size as usize,
            ship_tensors: req.ship_tensors,
            use_stored: req.use_stored_features,
            last: Mutex::new((0, last_len)),
        })
    }

    /// One wire chunk of `rows`: features (computing missing ones), or u8 tensors in
    /// conventional mode. Returns the chunk and how many features the backbone computed.
    fn chunk(
        &self,
        plan: &JobPlan,
        part: pb::Part,
        run: u32,
        seq: u32,
        rows: &[(u64, u32)],
    ) -> Result<(pb::FeatureChunk, usize), Status> {
        if !plan.ship_tensors {
            let (features, computed) = self.features(rows, plan.use_stored)?;
            return Ok((encode_chunk(part, run, seq, &features), computed));
        }
        let mut data = Vec::new();
        let (mut height, mut width) = (0, 0);
        for (id, _) in rows {
            let t = self.stored_tensor(*id)?;
            (height, width) = (t.height(), t.width());
            data.extend_from_slice(t.data());
        }
        let tensors = Tensors {
            data,
            height,
            width,
            labels: rows.iter().map(|r| r.1).collect(),
            photo_ids: rows.iter().map(|r| r.0).collect(),
        };
        Ok((encode_tensor_chunk(part, run, seq, &tensors), 0))
    }

    /// The features of `rows` under the backbone: stored ones when allowed, the rest computed by
    /// the backbone (and stored). Returns the features and how many were computed.
    fn features(&self, rows: &[(u64, u32)], use_stored: bool) -> Result<(Features, usize), Status> {
        let model = self.pretrained.clone();
        let info = model.info();
        let dim = info.feature_dim;
        let backbone = info.backbone_version.clone();
        let features = self.store.features();
        let mut values = vec![0f32; rows.len() * dim];
        let mut missing = Vec::new();
        for (i, (id, _)) in rows.iter().enumerate() {
            match use_stored
                .then(|| features.get(&backbone, *id))
                .transpose()
                .map_err(internal)?
                .flatten()
            {
                Some(f) if f.len() == dim => values[i * dim..(i + 1) * dim].copy_from_slice(&f),
                _ => missing.push(i),
            }
        }
        for batch in missing.chunks(model.backend.max_batch().max(1)) {
            let tensors = batch
                .iter()
                .map(|&i| self.stored_tensor(rows[i].0))
                .collect::<Result<Vec<_>, _>>()?;
            let out = model.backend.run(&tensors).map_err(internal)?;
            let mut stored = Vec::with_capacity(batch.len());
            for (j, &i) in batch.iter().enumerate() {
                values[i * dim..(i + 1) * dim].copy_from_slice(out.features(j));
                stored.push((rows[i].0, out.features(j)));
            }
            features.put_many(&backbone, &stored).map_err(internal)?;
        }
        let computed = missing.len();
        Ok((
            Features {
                values,
                dim,
                labels: rows.iter().map(|r| r.1).collect(),
                photo_ids: rows.iter().map(|r| r.0).collect(),
            },
            computed,
        ))
    }

    fn extract(
        &self,
        req: pb::ExtractRequest,
        plan: Arc<JobPlan>,
        tx: mpsc::Sender<Result<pb::ExtractEvent, Status>>,
    ) {
        let send = |event: Event| {
            tx.blocking_send(Ok(pb::ExtractEvent { event: Some(event) }))
                .is_ok()
        };
        let started = Instant::now();
        let total = (plan.val.len() + plan.train.len()) as u64;
        let mut done = 0u64;
        let mut extracted = 0u64;
        let mut sent_bytes = 0u64;
        let parts = std::iter::once((pb::Part::Val, 0))
            .chain((0..plan.plan.runs() as u32).map(|k| (pb::Part::Train, k)));
        for (part, run) in parts {
            let run_started = Instant::now();
            let mut chunks = 0;
            let mut count = 0u64;
            let mut cursor = 0;
            while let Some((seq, rows)) = plan.take_chunk(part, run, &mut cursor) {
                count += rows.len() as u64;
                let (mut chunk, computed) = match self.chunk(&plan, part, run, seq, rows) {
                    Ok(c) => c,
                    Err(status) => {
                        let _ = tx.blocking_send(Err(status));
                        return;
                    }
                };
                extracted += computed as u64;
                done += rows.len() as u64;
                throttle(started, done, req.throttle_images_per_second);
                sent_bytes += chunk.features.len() as u64;
                throttle(started, sent_bytes, req.bandwidth_bytes_per_second);
                let damage = self
                    .corrupt_chunks
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if damage && !chunk.features.is_empty() {
                    chunk.features[0] ^= 0x55;
                }
                if !send(Event::Chunk(chunk)) {
                    return;
                }
                chunks += 1;
                let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
                if !send(Event::Throughput(pb::Throughput {
                    images_per_second: rate,
                    done,
                    total,
                })) {
                    return;
                }
            }
            let ready = pb::RunReady {
                part: part as i32,
                run,
                chunks,
                count,
                seconds: run_started.elapsed().as_secs_f64(),
            };
            if !send(Event::RunReady(ready)) {
                return;
            }
        }
        send(Event::Done(pb::ExtractDone {
            images: done,
            seconds: started.elapsed().as_secs_f64(),
            extracted,
        }));
    }

    fn commit(&self, version: &str) -> Result<(), Status> {
        let before = self.model.get().version;
        if before != version {
            *lock(&self.previous) = Some(before);
        }
        if version == self.pretrained.version {
            self.catalog.set_active_model(version).map_err(internal)?;
            self.model.set(self.pretrained.clone());
            return Ok(());
        }
        let staged = lock(&self.staged).remove(version);
        let staged = match staged {
            Some(s) => s,
            None if self.head_path(version).exists() => {
                let bytes = std::fs::read(self.head_path(version)).map_err(internal)?;
                let request: pb::StageHeadRequest =
                    prost::Message::decode(&bytes[..]).map_err(internal)?;
                let head = HeadWeights::from_request(&request).map_err(internal)?;
                Staged { head, request }
            }
            None => {
                return Err(Status::not_found(format!(
                    "model version {version} is not staged on this node"
                )));
            }
        };
        write_durably(
            &self.head_path(version),
            &prost::Message::encode_to_vec(&staged.request),
        )?;
        let known = self
            .catalog
            .models()
            .map_err(internal)?
            .iter()
            .any(|m| m.id == version);
        if known {
            self.catalog.set_active_model(version).map_err(internal)?;
        } else {
            let metrics = serde_json::from_str(&staged.request.metrics_json)
                .unwrap_or(serde_json::Value::Null);
            self.catalog
                .register_model(&ModelVersion {
                    id: version.to_string(),
                    backbone: staged.request.backbone_version.clone(),
                    parent: Some(staged.request.parent.clone()).filter(|p| !p.is_empty()),
                    metrics,
                    created_ms: now_ms(),
                    active: true,
                })
                .map_err(internal)?;
        }
        self.model.set(ActiveModel {
            version: version.to_string(),
            head: Some(Arc::new(staged.head)),
            ..self.pretrained.clone()
        });
        info!(version, "committed a new head");
        Ok(())
    }

    /// Re-labels every photo with the active model: the head over stored features (running the
    /// backbone only for photos without features).
    fn relabel(&self, version: &str) -> Result<pb::RelabelReply, Status> {
        let model = self.model.get();
        if model.version != version {
            return Err(Status::failed_precondition(format!(
                "the active version is {}, not {version}",
                model.version
            )));
        }
        let Some(head) = model.head.clone() else {
            return self.relabel_full(&model);
        };
        let compare_with = lock(&self.previous).clone();
        let started = Instant::now();
        let ids: Vec<u64> = self
            .store
            .entries()
            .map_err(internal)?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let (mut compared, mut changed, mut extracted) = (0u64, 0u64, 0u64);
        for batch in ids.chunks(256) {
            let rows: Vec<(u64, u32)> = batch.iter().map(|id| (*id, 0)).collect();
            let (features, computed) = self.features(&rows, true)?;
            extracted += computed as u64;
            let mut out: Vec<(u64, Vec<Prediction>)> = Vec::with_capacity(batch.len());
            for (i, id) in batch.iter().enumerate() {
                let f = &features.values[i * features.dim..(i + 1) * features.dim];
                let preds = head_predictions(&head, f, 5);
                let old = previous_top1(&*self.catalog, *id, version, compare_with.as_deref())
                    .map_err(internal)?;
                if let (Some(old), Some(new)) = (old, preds.first()) {
                    compared += 1;
                    changed += u64::from(old != new.label);
                }
                out.push((*id, preds));
            }
            self.catalog
                .put_predictions_many(version, &out)
                .map_err(internal)?;
        }
        Ok(pb::RelabelReply {
            photos: ids.len() as u64,
            compared,
            changed,
            seconds: started.elapsed().as_secs_f64(),
            mode: if extracted == 0 {
                "head".into()
            } else {
                "head+backbone".into()
            },
        })
    }
}

impl PipeStoreNode {
    /// Re-labels with the backbone's own classifier (a rollback to the pretrained version).
    fn relabel_full(&self, model: &ActiveModel) -> Result<pb::RelabelReply, Status> {
        let options = RelabelOptions {
            compare_with: lock(&self.previous).clone(),
            ..RelabelOptions::default()
        };
        let report = Mutex::new(RelabelReport::default());
        Relabeler {
            store: &self.store,
            catalog: &self.catalog,
            features: self.store.features_arc(),
            model,
            options: &options,
        }
        .run(&report, &AtomicBool::new(false), |_| {})
        .map_err(internal)?;
        let r = report.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(pb::RelabelReply {
            photos: r.done,
            compared: r.compared,
            changed: r.changed,
            seconds: r.wall_seconds,
            mode: "full".into(),
        })
    }
}

/// Sleeps until `done` units (images or bytes) fit under `limit` per second since `started`.
fn throttle(started: Instant, done: u64, limit: f64) {
    if limit > 0.0 {
        let due = Duration::from_secs_f64(done as f64 / limit);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

fn write_durably(path: &std::path::Path, bytes: &[u8]) -> Result<(), Status> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(internal)?;
    f.write_all(bytes).map_err(internal)?;
    f.sync_all().map_err(internal)?;
    std::fs::rename(&tmp, path).map_err(internal)?;
    if let Some(dir) = path.parent() {
        crate::volume::sync_dir(dir).map_err(internal)?;
    }
    Ok(())
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type ExtractStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExtractEvent, Status>> + Send>>;

/// The tonic service over a shared node.
pub struct PipeStoreService(pub Arc<PipeStoreNode>);

impl PipeStoreService {
    /// Runs `f` on the node off the async runtime (store, catalog and model calls block).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&PipeStoreNode) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        let node = self.0.clone();
        tokio::task::spawn_blocking(move || f(&node))
            .await
            .map_err(internal)?
    }
}

#[tonic::async_trait]
impl PipeStoreRpc for PipeStoreService {
    type ExtractStream = ExtractStream;
    type TakeOverStream = ExtractStream;

    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<pb::RebalanceReply>, Status> {
        let req = request.into_inner();
        let plan = self.0.job(&req.job_id)?;
        let (run, given) = plan.give_tail(req.give as usize);
        info!(job = %req.job_id, asked = req.give, given = given.len(), "gave the tail of the last run away");
        Ok(Response::new(pb::RebalanceReply {
            photos: given
                .into_iter()
                .map(|(id, label)| pb::LabelledPhoto { id, label })
                .collect(),
            run,
        }))
    }

    async fn take_over(
        &self,
        request: Request<pb::TakeOverRequest>,
    ) -> Result<Response<Self::TakeOverStream>, Status> {
        let req = request.into_inner();
        if req.chunk_size == 0 {
            return Err(Status::invalid_argument("chunk_size must be at least 1"));
        }
        let mut source = pb::pipe_store_client::PipeStoreClient::connect(req.source_url.clone())
            .await
            .map_err(|e| Status::unavailable(format!("cannot reach {}: {e}", req.source_url)))?
            .max_decoding_message_size(64 << 20);
        let backbone = self.0.backbone();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            let started = Instant::now();
            let mut done = 0u64;
            for (k, photos) in req.photos.chunks(req.chunk_size as usize).enumerate() {
                let ids: Vec<u64> = photos.iter().map(|p| p.id).collect();
                let blobs = match source
                    .get_tensors(pb::GetTensorsRequest { ids: ids.clone() })
                    .await
                {
                    Ok(r) => r.into_inner().tensors,
                    Err(e) => {
                        let _ = tx
                            .send(Err(Status::unavailable(format!(
                                "fetching tensors from {}: {}",
                                req.source_url,
                                e.message()
                            ))))
                            .await;
                        return;
                    }
                };
                let backbone = backbone.clone();
                let labels: Vec<u32> = photos.iter().map(|p| p.label).collect();
                let features = tokio::task::spawn_blocking(move || -> Result<Features, Status> {
                    let tensors = blobs
                        .iter()
                        .map(|b| {
                            TensorBlob::decode(b).map_err(|e| Status::data_loss(e.to_string()))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let dim = backbone.info().feature_dim;
                    let mut values = Vec::with_capacity(tensors.len() * dim);
                    for batch in tensors.chunks(backbone.max_batch().max(1)) {
                        values.extend_from_slice(
                            backbone.run(batch).map_err(internal)?.all_features(),
                        );
                    }
                    Ok(Features {
                        values,
                        dim,
                        labels,
                        photo_ids: ids,
                    })
                })
                .await;
                let features = match features {
                    Ok(Ok(f)) => f,
                    Ok(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(internal(e))).await;
                        return;
                    }
                };
                done += features.len() as u64;
                let chunk = encode_chunk(
                    pb::Part::Train,
                    req.run,
                    req.first_seq + k as u32,
                    &features,
                );
                if tx
                    .send(Ok(pb::ExtractEvent {
                        event: Some(Event::Chunk(chunk)),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let _ = tx
                .send(Ok(pb::ExtractEvent {
                    event: Some(Event::Done(pb::ExtractDone {
                        images: done,
                        seconds: started.elapsed().as_secs_f64(),
                        extracted: done,
                    })),
                }))
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_features(
        &self,
        request: Request<pb::GetFeaturesRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let ids = request.into_inner().ids;
        self.blocking(move |node| {
            let rows: Vec<(u64, u32)> = ids.iter().map(|id| (*id, 0)).collect();
            let (features, _) = node.features(&rows, true)?;
            Ok(Response::new(encode_chunk(
                pb::Part::Train,
                0,
                0,
                &features,
            )))
        })
        .await
    }

    async fn get_tensors(
        &self,
        request: Request<pb::GetTensorsRequest>,
    ) -> Result<Response<pb::GetTensorsReply>, Status> {
        let ids = request.into_inner().ids;
        let tensors = self
            .blocking(move |node| ids.iter().map(|id| node.stored_blob(*id)).collect())
            .await?;
        Ok(Response::new(pb::GetTensorsReply { tensors }))
    }

    async fn inventory(
        &self,
        _: Request<pb::InventoryRequest>,
    ) -> Result<Response<pb::InventoryReply>, Status> {
        self.blocking(|node| {
            let mut counts: BTreeMap<String, pb::ClassCount> = BTreeMap::new();
            for split in [Split::Train, Split::Val, Split::Test] {
                for (_, label) in node.catalog.labelled(split).map_err(internal)? {
                    let entry = counts
                        .entry(label.clone())
                        .or_insert_with(|| pb::ClassCount {
                            label,
                            ..Default::default()
                        });
                    match split {
                        Split::Train => entry.train += 1,
                        Split::Val => entry.val += 1,
                        Split::Test => entry.test += 1,
                    }
                }
            }
            let model = node.model.get();
            Ok(Response::new(pb::InventoryReply {
                node_id: node.node_id.load(Ordering::Relaxed),
                backbone_version: model.info().backbone_version.clone(),
                feature_dim: model.info().feature_dim as u32,
                classes: counts.into_values().collect(),
                active_version: model.version,
            }))
        })
        .await
    }

    async fn extract(
        &self,
        request: Request<pb::ExtractRequest>,
    ) -> Result<Response<Self::ExtractStream>, Status> {
        let req = request.into_inner();
        let r = req.clone();
        let plan = Arc::new(self.blocking(move |node| node.plan(&r)).await?);
        let node = self.0.clone();
        lock(&node.plans).insert(req.job_id.clone(), plan.clone());
        info!(job = %req.job_id, val = plan.val.len(), train = plan.train.len(), runs = req.runs, "extraction starts");
        let (tx, rx) = mpsc::channel(8);
        std::thread::Builder::new()
            .name("ndpipe-extract".into())
            .spawn(move || node.extract(req, plan, tx))
            .map_err(internal)?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_chunk(
        &self,
        request: Request<pb::FetchChunkRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let req = request.into_inner();
        self.blocking(move |node| {
            let plan = node.job(&req.job_id)?;
            let part = pb::Part::try_from(req.part)
                .map_err(|_| Status::invalid_argument("unknown part"))?;
            let rows = plan.rows(part, req.run);
            let chunk = rows
                .chunks(plan.chunk_size)
                .nth(req.seq as usize)
                .ok_or_else(|| {
                    Status::not_found(format!("no chunk {} in run {}", req.seq, req.run))
                })?;
            let (chunk, _) = node.chunk(&plan, part, req.run, req.seq, chunk)?;
            Ok(Response::new(chunk))
        })
        .await
    }

    async fn stage_head(
        &self,
        request: Request<pb::StageHeadRequest>,
    ) -> Result<Response<pb::StageHeadReply>, Status> {
        let req = request.into_inner();
        let head =
            HeadWeights::from_request(&req).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let info = self.0.pretrained.info();
        if req.backbone_version != info.backbone_version {
            return Err(Status::failed_precondition(format!(
                "head {} was trained on backbone {}, this node runs {}",
                req.version, req.backbone_version, info.backbone_version
            )));
        }
        if head.input_dim != info.feature_dim {
            return Err(Status::failed_precondition(format!(
                "head {} takes {}-d features, the backbone gives {}",
                req.version, head.input_dim, info.feature_dim
            )));
        }
        let version = req.version.clone();
        lock(&self.0.staged).insert(version.clone(), Staged { head, request: req });
        info!(version, "staged a head");
        Ok(Response::new(pb::StageHeadReply {}))
    }

    async fn commit_head(
        &self,
        request: Request<pb::CommitHeadRequest>,
    ) -> Result<Response<pb::CommitHeadReply>, Status> {
        let version = request.into_inner().version;
        self.blocking(move |node| node.commit(&version)).await?;
        Ok(Response::new(pb::CommitHeadReply {}))
    }

    async fn abort_head(
        &self,
        request: Request<pb::AbortHeadRequest>,
    ) -> Result<Response<pb::AbortHeadReply>, Status> {
        let version = request.into_inner().version;
        if lock(&self.0.staged).remove(&version).is_some() {
            warn!(version, "aborted a staged head");
        }
        Ok(Response::new(pb::AbortHeadReply {}))
    }

    async fn relabel(
        &self,
        request: Request<pb::RelabelRequest>,
    ) -> Result<Response<pb::RelabelReply>, Status> {
        let version = request.into_inner().version;
        let reply = self.blocking(move |node| node.relabel(&version)).await?;
        Ok(Response::new(reply))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
