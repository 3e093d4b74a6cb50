//! Fine-tuning and deploy end to end against fake PipeStores (gRPC servers in this process whose
//! features are a function of the photo's label): pipelined runs, a damaged chunk fetched again,
//! load balancing with a take-over (in the job's mode and limits), training through a cache,
//! the two-phase deploy and rollback, a stalled node failing the job by name, and a node that
//! missed a commit brought to the active version afterwards.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use ndpipe_proto::pb::extract_event::Event;
use ndpipe_proto::pb::pipe_store_server::{PipeStore, PipeStoreServer};
use ndpipe_proto::pb::{self, Part};
use ndpipe_proto::{
    Features, RunPlan, Tensors, encode_chunk, encode_tensor_chunk, head_from_request,
};
use ndpipe_tuner::{
    CachePolicy, Config, FinetuneReport, FinetuneRequest, JobResult, Mode, Phase, Tuner,
    TunerError, ValSplit,
};
use tokio::sync::{Notify, mpsc};
use tonic::{Request, Response, Status};

const DIM: usize = 4;
const BACKBONE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const CLASSES: [&str; 2] = ["cat", "cup"];

/// A photo's features: its class lights up its own dimension.
fn feature(id: u64, label: u32) -> Vec<f32> {
    let mut v = vec![0.05 * (id % 5) as f32; DIM];
    v[label as usize] += 2.0;
    v
}

fn features(rows: &[(u64, u32)]) -> Features {
    Features {
        values: rows.iter().flat_map(|&(id, l)| feature(id, l)).collect(),
        dim: DIM,
        labels: rows.iter().map(|r| r.1).collect(),
        photo_ids: rows.iter().map(|r| r.0).collect(),
    }
}

/// How a fake node behaves.
#[derive(Default)]
struct Behaviour {
    /// Images/s it reports.
    rate: f64,
    /// Send the first chunk with a wrong checksum (the right one on re-fetch).
    corrupt_first: bool,
    /// Wait (up to a second) for a rebalance before sending its training runs.
    wait_for_rebalance: bool,
    /// Damage the chunks of work it takes over.
    corrupt_takeovers: bool,
    /// After its validation set, send nothing more, keeping the stream open (a stalled node).
    stall_after_val: bool,
}

struct Fake {
    /// (id, class name, split).
    photos: Vec<(u64, &'static str, &'static str)>,
    behaviour: Behaviour,
    refuse_stage: AtomicBool,
    /// Commits to refuse before accepting them again.
    fail_commits: AtomicU32,
    job: Mutex<Option<Job>>,
    rebalanced: Notify,
    sent: Mutex<HashMap<(i32, u32, u32), pb::FeatureChunk>>,
    calls: Mutex<Vec<String>>,
    /// The task of every version staged here.
    tasks: Mutex<HashMap<String, String>>,
    /// What it serves, per task.
    serving: Mutex<ndpipe_proto::Serving>,
}

/// A job's training rows and plan, and how many rows of the last run were given away.
struct Job {
    train: Vec<(u64, u32)>,
    plan: RunPlan,
    given: usize,
}

type Events = Pin<Box<dyn Stream<Item = Result<pb::ExtractEvent, Status>> + Send>>;

fn stream(rx: mpsc::Receiver<Event>) -> Events {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        let event = rx.recv().await?;
        Some((Ok(pb::ExtractEvent { event: Some(event) }), rx))
    }))
}

impl Fake {
    fn call(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }

    fn rows(&self, split: &str, classes: &[String]) -> Vec<(u64, u32)> {
        self.photos
            .iter()
            .filter(|p| p.2 == split)
            .filter_map(|p| {
                let label = classes.iter().position(|c| c == p.1)?;
                Some((p.0, label as u32))
            })
            .collect()
    }

    fn chunk(&self, part: Part, run: u32, seq: u32, rows: &[(u64, u32)], tensors: bool) -> Event {
        let mut chunk = encode(part, run, seq, rows, tensors);
        let mut sent = self.sent.lock().unwrap();
        let first = sent.is_empty();
        sent.insert((part as i32, run, seq), chunk.clone());
        if first && self.behaviour.corrupt_first {
            chunk.crc32c ^= 1;
        }
        Event::Chunk(chunk)
    }
}

/// A chunk of `rows`: their features, or with `tensors` their (fake) u8 tensors.
fn encode(part: Part, run: u32, seq: u32, rows: &[(u64, u32)], tensors: bool) -> pb::FeatureChunk {
    if !tensors {
        return encode_chunk(part, run, seq, &features(rows));
    }
    let (h, w) = (224, 224);
    let t = Tensors {
        data: rows
            .iter()
            .flat_map(|r| vec![(r.1 * 200) as u8; h * w * 3])
            .collect(),
        height: h as u32,
        width: w as u32,
        labels: rows.iter().map(|r| r.1).collect(),
        photo_ids: rows.iter().map(|r| r.0).collect(),
    };
    encode_tensor_chunk(part, run, seq, &t)
}

#[derive(Clone)]
struct Node(Arc<Fake>);

#[tonic::async_trait]
impl PipeStore for Node {
    async fn inventory(
        &self,
        _: Request<pb::InventoryRequest>,
    ) -> Result<Response<pb::InventoryReply>, Status> {
        let classes = CLASSES
            .iter()
            .map(|&c| {
                let n = |s: &str| {
                    self.0
                        .photos
                        .iter()
                        .filter(|p| p.1 == c && p.2 == s)
                        .count()
                };
                pb::ClassCount {
                    label: c.into(),
                    train: n("train") as u64,
                    val: n("val") as u64,
                    test: n("test") as u64,
                }
            })
            .collect();
        Ok(Response::new(pb::InventoryReply {
            node_id: 0,
            backbone_version: BACKBONE.into(),
            feature_dim: DIM as u32,
            classes,
            active_version: self.0.serving.lock().unwrap().to_string(),
            task_known: true,
        }))
    }

    type ExtractStream = Events;

    async fn extract(
        &self,
        request: Request<pb::ExtractRequest>,
    ) -> Result<Response<Events>, Status> {
        let req = request.into_inner();
        let fake = self.0.clone();
        let val = fake.rows(&req.val_split, &req.classes);
        let train = fake.rows("train", &req.classes);
        let plan = RunPlan::new(train.len(), req.runs as usize, req.align as usize).unwrap();
        *fake.job.lock().unwrap() = Some(Job {
            train: train.clone(),
            plan: plan.clone(),
            given: 0,
        });
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let size = req.chunk_size as usize;
            let tensors = req.ship_tensors;
            let mut events = Vec::new();
            for (seq, rows) in val.chunks(size).enumerate() {
                events.push(fake.chunk(Part::Val, 0, seq as u32, rows, tensors));
            }
            // As PipeStores do: throughput after chunks, then the part is ready.
            events.push(Event::Throughput(pb::Throughput {
                images_per_second: fake.behaviour.rate,
                done: val.len() as u64,
                total: (val.len() + train.len()) as u64,
            }));
            events.push(Event::RunReady(pb::RunReady {
                part: Part::Val as i32,
                ..Default::default()
            }));
            for e in events.drain(..) {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            if fake.behaviour.stall_after_val {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(tx);
                return;
            }
            if fake.behaviour.wait_for_rebalance {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), fake.rebalanced.notified()).await;
            }
            let given = fake.job.lock().unwrap().as_ref().unwrap().given;
            for (run, range) in plan.chunks().iter().enumerate() {
                let mut rows = &train[range.clone()];
                if run + 1 == plan.runs() {
                    rows = &rows[..rows.len() - given];
                }
                for (seq, rows) in rows.chunks(size).enumerate() {
                    events.push(fake.chunk(Part::Train, run as u32, seq as u32, rows, tensors));
                }
                events.push(Event::RunReady(pb::RunReady {
                    part: Part::Train as i32,
                    run: run as u32,
                    ..Default::default()
                }));
            }
            events.push(Event::Done(pb::ExtractDone {
                images: (val.len() + train.len() - given) as u64,
                seconds: 0.5,
                extracted: 3,
                deleted: 0,
                ..Default::default()
            }));
            for e in events {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream(rx)))
    }

    async fn fetch_chunk(
        &self,
        request: Request<pb::FetchChunkRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let r = request.into_inner();
        self.0.call(format!("refetch {} {}", r.run, r.seq));
        let sent = self.0.sent.lock().unwrap();
        let chunk = sent.get(&(r.part, r.run, r.seq)).cloned();
        chunk
            .map(Response::new)
            .ok_or_else(|| Status::not_found("no such chunk"))
    }

    async fn stage_head(
        &self,
        request: Request<pb::StageHeadRequest>,
    ) -> Result<Response<pb::StageHeadReply>, Status> {
        let r = request.into_inner();
        let head = head_from_request(&r).map_err(|e| Status::invalid_argument(e.to_string()))?;
        assert_eq!(head.input_dim(), DIM);
        self.0.call(format!("stage {}", r.version));
        (self.0.tasks.lock().unwrap()).insert(r.version.clone(), r.task.clone());
        if self.0.refuse_stage.load(Ordering::Relaxed) {
            return Err(Status::failed_precondition("disk full"));
        }
        Ok(Response::new(pb::StageHeadReply {}))
    }

    async fn commit_head(
        &self,
        request: Request<pb::CommitHeadRequest>,
    ) -> Result<Response<pb::CommitHeadReply>, Status> {
        let version = request.into_inner().version;
        let refuse = self
            .0
            .fail_commits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if refuse {
            self.0.call(format!("refused commit {version}"));
            return Err(Status::unavailable("the disk is busy"));
        }
        self.0.call(format!("commit {version}"));
        let task = match self.0.tasks.lock().unwrap().get(&version) {
            Some(task) => task.clone(),
            None => "general".to_string(),
        };
        self.0.serving.lock().unwrap().set(task, version);
        Ok(Response::new(pb::CommitHeadReply {}))
    }

    async fn abort_head(
        &self,
        request: Request<pb::AbortHeadRequest>,
    ) -> Result<Response<pb::AbortHeadReply>, Status> {
        self.0
            .call(format!("abort {}", request.into_inner().version));
        Ok(Response::new(pb::AbortHeadReply {}))
    }

    type RelabelStream = Pin<Box<dyn Stream<Item = Result<pb::RelabelEvent, Status>> + Send>>;

    async fn relabel(
        &self,
        request: Request<pb::RelabelRequest>,
    ) -> Result<Response<Self::RelabelStream>, Status> {
        self.0
            .call(format!("relabel {}", request.into_inner().version));
        let photos = self.0.photos.len() as u64;
        let events = [
            pb::relabel_event::Event::Progress(pb::RelabelProgress {
                done: photos / 2,
                total: photos,
            }),
            pb::relabel_event::Event::Done(pb::RelabelReply {
                photos,
                compared: 10,
                changed: 1,
                seconds: 0.1,
                mode: "head".into(),
            }),
        ];
        let events = events.map(|e| Ok(pb::RelabelEvent { event: Some(e) }));
        Ok(Response::new(Box::pin(futures::stream::iter(events))))
    }

    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<pb::RebalanceReply>, Status> {
        let give = request.into_inner().give as usize;
        let mut job = self.0.job.lock().unwrap();
        let Job { train, plan, given } = job.as_mut().unwrap();
        let last = plan.chunk(plan.runs() - 1).unwrap();
        *given = give.min(last.len());
        let photos = train[last.end - *given..last.end]
            .iter()
            .map(|&(id, label)| pb::LabelledPhoto {
                id,
                label,
                run: plan.runs() as u32 - 1,
                sha256: String::new(),
            })
            .collect();
        drop(job);
        self.0.rebalanced.notify_one();
        Ok(Response::new(pb::RebalanceReply { photos }))
    }

    type TakeOverStream = Events;

    async fn take_over(
        &self,
        request: Request<pb::TakeOverRequest>,
    ) -> Result<Response<Events>, Status> {
        let req = request.into_inner();
        self.0.call(format!(
            "take over {} photos: tensors {}, stored {}, throttle {}, cap {}",
            req.photos.len(),
            req.ship_tensors,
            req.use_stored_features,
            req.throttle_images_per_second,
            req.bandwidth_bytes_per_second
        ));
        let corrupt = self.0.behaviour.corrupt_takeovers;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let rows: Vec<(u64, u32)> = req.photos.iter().map(|p| (p.id, p.label)).collect();
            for (k, rows) in rows.chunks(req.chunk_size as usize).enumerate() {
                let (run, seq) = (req.photos[0].run, req.first_seq + k as u32);
                let mut chunk = encode(Part::Train, run, seq, rows, req.ship_tensors);
                if corrupt {
                    chunk.crc32c ^= 1;
                }
                if tx.send(Event::Chunk(chunk)).await.is_err() {
                    return;
                }
            }
            let done = pb::ExtractDone {
                images: rows.len() as u64,
                seconds: 0.1,
                extracted: rows.len() as u64,
                deleted: 0,
                ..Default::default()
            };
            let _ = tx.send(Event::Done(done)).await;
        });
        Ok(Response::new(stream(rx)))
    }

    async fn get_tensors(
        &self,
        _: Request<pb::GetTensorsRequest>,
    ) -> Result<Response<pb::GetTensorsReply>, Status> {
        Err(Status::unimplemented("the fake takes over without tensors"))
    }

    async fn get_features(
        &self,
        request: Request<pb::GetFeaturesRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let ids = request.into_inner().ids;
        let rows: Vec<(u64, u32)> = ids
            .iter()
            .map(|id| {
                let p = self.0.photos.iter().find(|p| p.0 == *id).unwrap();
                (p.0, CLASSES.iter().position(|c| *c == p.1).unwrap() as u32)
            })
            .collect();
        Ok(Response::new(encode_chunk(
            Part::Train,
            0,
            0,
            &features(&rows),
        )))
    }

    type ExtractBackboneStream =
        Pin<Box<dyn Stream<Item = Result<pb::ExtractBackboneEvent, Status>> + Send>>;

    async fn stage_backbone(
        &self,
        _: Request<tonic::Streaming<pb::BackboneChunk>>,
    ) -> Result<Response<pb::StageBackboneReply>, Status> {
        Err(no_rollouts())
    }

    async fn extract_backbone(
        &self,
        _: Request<pb::ExtractBackboneRequest>,
    ) -> Result<Response<Self::ExtractBackboneStream>, Status> {
        Err(no_rollouts())
    }

    async fn commit_backbone(
        &self,
        _: Request<pb::CommitBackboneRequest>,
    ) -> Result<Response<pb::CommitBackboneReply>, Status> {
        Err(no_rollouts())
    }

    async fn abort_backbone(
        &self,
        _: Request<pb::AbortBackboneRequest>,
    ) -> Result<Response<pb::AbortBackboneReply>, Status> {
        Err(no_rollouts())
    }

    async fn give_backbone_photos(
        &self,
        _: Request<pb::GiveBackbonePhotosRequest>,
    ) -> Result<Response<pb::GiveBackbonePhotosReply>, Status> {
        Err(no_rollouts())
    }

    async fn take_over_backbone(
        &self,
        _: Request<pb::TakeOverBackboneRequest>,
    ) -> Result<Response<pb::TakeOverBackboneReply>, Status> {
        Err(no_rollouts())
    }

    async fn put_backbone_outputs(
        &self,
        _: Request<pb::PutBackboneOutputsRequest>,
    ) -> Result<Response<pb::PutBackboneOutputsReply>, Status> {
        Err(no_rollouts())
    }

    async fn put_features(
        &self,
        request: Request<pb::PutFeaturesRequest>,
    ) -> Result<Response<pb::PutFeaturesReply>, Status> {
        let chunk = request.into_inner().chunk.unwrap_or_default();
        self.0.call(format!("put features {}", chunk.count));
        Ok(Response::new(pb::PutFeaturesReply {
            stored: chunk.count,
        }))
    }
}

/// Rollouts are tested with real PipeStores (`crates/ndpipe/tests/integration/rollout.rs`).
fn no_rollouts() -> Status {
    Status::unimplemented("the fake PipeStore does not take backbones")
}

/// A fake PipeStore with `train` training and `val` validation photos (ids from `first`),
/// serving on a free port.
async fn fake(first: u64, train: u64, val: u64, behaviour: Behaviour) -> (Arc<Fake>, SocketAddr) {
    let photos = (first..first + train + val)
        .map(|id| {
            let split = if id - first < train { "train" } else { "val" };
            (id, CLASSES[(id % 2) as usize], split)
        })
        .collect();
    let fake = Arc::new(Fake {
        photos,
        behaviour,
        refuse_stage: AtomicBool::new(false),
        fail_commits: AtomicU32::new(0),
        job: Mutex::new(None),
        rebalanced: Notify::new(),
        sent: Mutex::new(HashMap::new()),
        calls: Mutex::new(Vec::new()),
        tasks: Mutex::new(HashMap::new()),
        serving: Mutex::new("general=pretrained-0123".parse().unwrap()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = PipeStoreServer::new(Node(fake.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (fake, addr)
}

/// A Tuner whose fake nodes' leases outlast the test (the fakes never heartbeat) and which
/// waits 2 s on a silent node.
fn tuner(dir: &std::path::Path) -> Tuner {
    Tuner::open(&Config {
        data: dir.to_path_buf(),
        node_timeout_ms: 2_000,
        node_lease_ms: 600_000,
        ..Config::default()
    })
    .unwrap()
}

/// Registers the fakes at `a` and `b` as ps-a and ps-b.
fn register(tuner: &Tuner, a: SocketAddr, b: SocketAddr) {
    tuner.register_node("ps-a", &format!("http://{a}")).unwrap();
    tuner.register_node("ps-b", &format!("http://{b}")).unwrap();
}

/// Registers ps-a, a fake behaving as `fast`, and ps-b, a slow one (10 images/s) that waits for
/// a rebalance before its training runs; 40 training and 10 validation photos each.
async fn fast_and_slow(tuner: &Tuner, fast: Behaviour) -> (Arc<Fake>, Arc<Fake>) {
    let slow = Behaviour {
        rate: 10.0,
        wait_for_rebalance: true,
        ..Behaviour::default()
    };
    let (a, a_addr) = fake(0, 40, 10, fast).await;
    let (b, b_addr) = fake(1000, 40, 10, slow).await;
    register(tuner, a_addr, b_addr);
    (a, b)
}

fn small(req: FinetuneRequest) -> FinetuneRequest {
    FinetuneRequest {
        runs: 2,
        epochs: 15,
        batch: 16,
        chunk_size: 4,
        align: 4,
        ..req
    }
}

async fn run(tuner: &Tuner, req: FinetuneRequest) -> FinetuneReport {
    tokio::time::timeout(Duration::from_secs(60), tuner.finetune(req))
        .await
        .expect("the job must not hang")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_pipelined_with_a_refetch_a_take_over_and_a_deploy_then_rollback() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let fast = Behaviour {
        rate: 1000.0,
        corrupt_first: true,
        ..Behaviour::default()
    };
    let (a, b) = fast_and_slow(&tuner, fast).await;

    let report = run(&tuner, small(FinetuneRequest::default())).await;

    assert_eq!(
        (report.train_images, report.val_images),
        (80, 20),
        "{report:?}"
    );
    assert_eq!(report.val_split, "val");
    assert_eq!(report.parent, None, "the task's first version");
    assert!(report.gate.passed && report.gate.parent_val_top1.is_none());
    assert_eq!(report.per_class.len(), 2);
    assert_eq!(report.classes, CLASSES);
    assert_eq!(report.runs.len(), 2);
    assert!(report.val_top1 > 0.9, "{report:?}");
    assert_eq!(report.chunks_refetched, 1);
    assert!(a.calls.lock().unwrap().contains(&"refetch 0 0".to_string()));
    let took = "take over 20 photos: tensors false, stored true, throttle 0, cap 0".to_string();
    assert!(a.calls.lock().unwrap().contains(&took), "the job's mode");
    assert_eq!(report.rebalanced.len(), 1, "{report:?}");
    let moved = &report.rebalanced[0];
    assert!(moved.from.starts_with("ps-b") && moved.to.starts_with("ps-a"));
    assert_eq!(moved.photos, 20, "b's whole last run");
    let images: Vec<u64> = report.nodes.iter().map(|n| n.images).collect();
    assert_eq!(images, [50 + 20, 50 - 20]);
    let deploy = report.deploy.as_ref().unwrap();
    assert_eq!((deploy.nodes, deploy.relabelled), (2, 100));
    assert_eq!(
        (deploy.compared, deploy.changed, deploy.changed_fraction),
        (20, 2, 0.1)
    );
    assert_eq!(deploy.modes, ["head", "head"]);
    let v = &report.version;
    assert!(v.starts_with("ft-") && v.ends_with("-01234567"), "{v}");
    let calls = b.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            format!("stage {v}"),
            format!("commit {v}"),
            format!("relabel {v}")
        ]
    );

    let versions = tuner.versions().unwrap();
    let ids: Vec<(&str, bool)> = versions.iter().map(|m| (m.id.as_str(), m.active)).collect();
    assert_eq!(
        ids,
        [("pretrained-0123", true), (v.as_str(), true)],
        "each task's active version"
    );
    assert!(dir.path().join(format!("heads/{v}.safetensors")).exists());
    // The typed report is what the HTTP API sends.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        serde_json::from_value::<FinetuneReport>(json).unwrap(),
        report
    );

    // The general task's version deploys without a head to stage: the nodes have it.
    let back = tuner.deploy("pretrained-0123").await.unwrap();
    assert_eq!(back.version, "pretrained-0123");
    assert_eq!(
        b.calls.lock().unwrap().last().unwrap(),
        "relabel pretrained-0123"
    );
    assert!(
        !b.calls
            .lock()
            .unwrap()
            .contains(&"stage pretrained-0123".to_string())
    );
    // And forward again: the head comes from the registry's file.
    tuner.deploy(v).await.unwrap();
    assert_eq!(
        b.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == &format!("stage {v}"))
            .count(),
        2
    );
    assert!(matches!(
        tuner.deploy("nope").await,
        Err(TunerError::UnknownVersion(_))
    ));

    // A node refusing the head aborts the deploy everywhere.
    b.refuse_stage.store(true, Ordering::Relaxed);
    let err = tuner.deploy(v).await.unwrap_err();
    assert!(
        matches!(&err, TunerError::DeployAborted { reason, .. } if reason.contains("ps-b")),
        "{err}"
    );
    assert_eq!(
        a.calls.lock().unwrap().last().unwrap(),
        &format!("abort {v}")
    );

    // The next job warm-starts from the serving version.
    b.refuse_stage.store(false, Ordering::Relaxed);
    let again = run(
        &tuner,
        small(FinetuneRequest {
            deploy: false,
            load_balance: false,
            ..FinetuneRequest::default()
        }),
    )
    .await;
    assert_eq!(again.parent.as_deref(), Some(v.as_str()));
    assert!(again.val_top1_before > 0.9, "{again:?}");
    assert_eq!(
        again.gate.parent_val_top1,
        Some(again.val_top1_before),
        "the parent, judged on the same photos"
    );
    assert!(again.deploy.is_none() && again.rebalanced.is_empty());

    // From scratch, a new head trains instead (its parent is still the task's version).
    let scratch = run(
        &tuner,
        small(FinetuneRequest {
            deploy: false,
            load_balance: false,
            from_scratch: true,
            ..FinetuneRequest::default()
        }),
    )
    .await;
    assert_eq!(scratch.parent.as_deref(), Some(v.as_str()), "{scratch:?}");
    assert!(
        scratch.val_top1_before < again.val_top1_before,
        "{scratch:?}"
    );
    assert_eq!(scratch.gate.parent_val_top1, again.gate.parent_val_top1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_memory_budget_training_reads_through_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let (_a, a_addr) = fake(0, 40, 10, Behaviour::default()).await;
    let (_b, b_addr) = fake(1000, 40, 10, Behaviour::default()).await;
    register(&tuner, a_addr, b_addr);
    // 80 training features of 4 f32 are 1280 bytes; 20 rows of f16 fit in 160.
    let req = small(FinetuneRequest {
        memory_budget_bytes: 160,
        cache_policy: CachePolicy::Lru,
        deploy: false,
        val_split: ValSplit::Val,
        ..FinetuneRequest::default()
    });
    let report = run(&tuner, req).await;
    let cache = report.cache.as_ref().expect("trained through the cache");
    assert_eq!(cache.policy, CachePolicy::Lru);
    assert_eq!(cache.capacity_items, 20);
    assert_eq!(
        cache.requests,
        cache.exact_hits + cache.substitutes + cache.misses
    );
    assert!(cache.misses > 0 && cache.fetched_bytes > 0, "{cache:?}");
    assert_eq!(report.train_images, 80);
    assert!(report.val_top1 > 0.9, "{report:?}");
    // Neither fake reports a throughput: balancing is skipped, and the report says why (no
    // rate, or every stream ended before one could be known).
    assert!(report.rebalanced.is_empty());
    let why = report.balance_skipped.as_deref().unwrap_or_default();
    assert!(
        why.contains("throughput") || why.contains("finished"),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_take_over_chunk_fails_the_job_naming_both_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let fast = Behaviour {
        rate: 1000.0,
        corrupt_takeovers: true,
        ..Behaviour::default()
    };
    fast_and_slow(&tuner, fast).await;
    let err = tuner
        .finetune(small(FinetuneRequest::default()))
        .await
        .unwrap_err();
    let TunerError::Node { node, message } = &err else {
        panic!("{err}");
    };
    assert!(
        node.starts_with("ps-a") && message.contains("ps-b"),
        "{err}"
    );
    assert!(message.contains("checksum"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conventional_mode_runs_the_tuners_backbone_on_shipped_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let (_a, a_addr) = fake(0, 24, 8, Behaviour::default()).await;
    tuner
        .register_node("ps-a", &format!("http://{a_addr}"))
        .unwrap();
    let req = small(FinetuneRequest {
        mode: Mode::Conventional,
        deploy: false,
        ..FinetuneRequest::default()
    });
    assert!(matches!(
        tuner.finetune(req.clone()).await,
        Err(TunerError::InvalidArgument(m)) if m.contains("backbone")
    ));
    let backbone = ndpipe_model::FakeBackend::new(DIM, 2);
    let tuner = tuner.with_backbone(Arc::new(backbone));
    let report = run(&tuner, req).await;
    assert_eq!((report.train_images, report.val_images), (24, 8));
    assert_eq!(report.nodes[0].images, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_work_follows_the_jobs_mode_throttle_and_bandwidth_cap() {
    let dir = tempfile::tempdir().unwrap();
    let fast = Behaviour {
        rate: 1000.0,
        ..Behaviour::default()
    };
    let backbone = ndpipe_model::FakeBackend::new(DIM, 2);
    let tuner = tuner(dir.path()).with_backbone(Arc::new(backbone));
    let (a, _) = fast_and_slow(&tuner, fast).await;
    let req = small(FinetuneRequest {
        mode: Mode::Conventional,
        use_stored_features: false,
        throttle: [("ps-a".to_string(), 7.0), ("ps-b".to_string(), 3.0)].into(),
        bandwidth_bytes_per_second: 1e9,
        deploy: false,
        ..FinetuneRequest::default()
    });
    let report = run(&tuner, req).await;
    assert_eq!(report.rebalanced.len(), 1, "{report:?}");
    assert_eq!((report.train_images, report.val_images), (80, 20));
    // The fast node ships the tensors (the Tuner runs the backbone on them too), under its own
    // throttle and the job's cap.
    let took = "take over 20 photos: tensors true, stored false, throttle 7, cap 1000000000";
    assert!(
        a.calls.lock().unwrap().contains(&took.to_string()),
        "{:?}",
        a.calls.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_fails_the_job_by_name_and_the_next_job_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let stalled = Behaviour {
        stall_after_val: true,
        ..Behaviour::default()
    };
    let (_a, a_addr) = fake(0, 40, 10, Behaviour::default()).await;
    let (_b, b_addr) = fake(1000, 40, 10, stalled).await;
    register(&tuner, a_addr, b_addr);
    let req = small(FinetuneRequest {
        deploy: false,
        load_balance: false,
        ..FinetuneRequest::default()
    });
    let job = tuner.submit_finetune(req.clone()).await.unwrap();
    assert!(
        matches!(
            tuner.submit_finetune(req.clone()).await,
            Err(TunerError::Busy)
        ),
        "one job at a time"
    );
    let end = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let view = tuner.job(&job.id).unwrap();
            if matches!(view.phase, Phase::Done | Phase::Failed) {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the job must not hang");
    assert_eq!(end.phase, Phase::Failed, "{end:?}");
    assert_eq!(end.progress.len(), 2, "per-node progress: {end:?}");
    let error = end.error.unwrap();
    assert_eq!(error.kind, "node_failed");
    assert!(
        error.message.contains("ps-b") && error.message.contains("2000 ms"),
        "{error:?}"
    );

    // The lock was released: with the stalled node drained, the next job runs on the other.
    tuner
        .set_node_state("ps-b", ndpipe_catalog::NodeState::Draining)
        .unwrap();
    let report = run(&tuner, req).await;
    assert_eq!(report.train_images, 40);
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(report.skipped[0].contains("draining"), "{report:?}");
    let jobs = tuner.jobs().unwrap();
    assert_eq!(jobs.len(), 2);
    assert!(matches!(jobs[1].result, Some(JobResult::Finetune(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_misses_the_commit_is_brought_to_the_active_version() {
    let dir = tempfile::tempdir().unwrap();
    let tuner = tuner(dir.path());
    let (_a, a_addr) = fake(0, 40, 10, Behaviour::default()).await;
    let (b, b_addr) = fake(1000, 40, 10, Behaviour::default()).await;
    register(&tuner, a_addr, b_addr);
    b.fail_commits.store(1, Ordering::Relaxed);
    let report = run(
        &tuner,
        small(FinetuneRequest {
            load_balance: false,
            ..FinetuneRequest::default()
        }),
    )
    .await;
    let v = report.version.clone();
    let deploy = report.deploy.unwrap();
    assert_eq!(deploy.nodes, 1, "{deploy:?}");
    assert_eq!(deploy.lagging.len(), 1, "{deploy:?}");
    assert!(deploy.lagging[0].contains("ps-b"), "{deploy:?}");
    assert_eq!(
        tuner
            .versions()
            .unwrap()
            .iter()
            .find(|m| m.active && m.task.as_str() == "default")
            .unwrap()
            .id,
        v,
        "the intent is recorded before the commits"
    );
    let nodes = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let nodes = tuner.nodes().unwrap();
            if nodes.iter().all(|n| n.in_sync) {
                return nodes;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the lagging node is brought to the version");
    let serving = format!("default={v},general=pretrained-0123");
    assert!(
        nodes
            .iter()
            .all(|n| n.version.as_deref() == Some(serving.as_str())),
        "{nodes:?}"
    );
    let calls = b.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            format!("stage {v}"),
            format!("refused commit {v}"),
            format!("stage {v}"),
            format!("commit {v}"),
            format!("relabel {v}"),
        ]
    );
}
