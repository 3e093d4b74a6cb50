//! Fine-tuning across PipeStores, as NDPipe does it.
//!
//! Every node streams its validation features first, then its training features in `runs`
//! chunks; the Tuner trains run `k` (warm-started from run `k-1`, with NDPipe's per-run
//! learning-rate scale) while the nodes produce run `k+1`, and validates after every run. Only
//! features, labels and photo ids cross the network.
//!
//! - [`request`] and [`report`]: the job's input and output;
//! - [`streams`]: the node streams feeding the job's channel, each watched (a node silent for
//!   the node timeout fails the job, naming it), and the re-fetch of damaged chunks;
//! - [`survey`]: what the nodes hold before a job, and the head it starts from;
//! - [`intake`]: what arrived so far, and when a run is ready;
//! - [`balance`]: moving work from slow nodes to fast ones once their rates are known;
//! - [`lost`]: a node lost mid-job, its photos not yet received taken over by holders of copies;
//! - [`trainer`]: the training thread, in memory or through [`cached`] over the memory budget;
//! - [`conventional`]: the comparison mode where the Tuner runs the backbone.

mod assess;
mod balance;
mod cached;
mod conventional;
mod intake;
mod lost;
mod quality;
mod record;
mod report;
mod request;
mod streams;
mod survey;
mod trainer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ndpipe_catalog::{ReplicaCatalog, TaskName};
use ndpipe_model::InferenceBackend;
use ndpipe_proto::pb::extract_event::Event;
use ndpipe_proto::{ProtoError, decode_chunk, decode_tensor_chunk, pb};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

pub use cached::CacheReport;
pub use quality::{ClassMetrics, Gate};
pub use report::{FinetuneReport, NodeReport, Rebalanced, RunTimeline};
pub use request::{CachePolicy, DEFAULT_MEMORY_BUDGET, FinetuneRequest, Mode, ValSplit};

use self::cached::CacheSetup;
use self::intake::Intake;
use self::record::register;
use self::streams::{Ingress, Msg, Source};
use self::survey::{Survey, starting_head};
use self::trainer::{TrainedRun, Trainer, TrainerSetup, validate};
use crate::control::JobEnv;
use crate::jobs::{Phase, Progress};
use crate::nodes::{Members, Node, node_error};
use crate::{Head, TunerError, deploy};

/// Where a fine-tune's features come from: the backbone the nodes serve, or one a rollout
/// staged on them (its version and feature size), whose stored features train the task's head
/// for it; and the suffix that keeps the job's extraction apart from the rollout's others.
#[derive(Debug, Clone, Default)]
pub(crate) struct Target {
    pub(crate) backbone: Option<(String, usize)>,
    pub(crate) suffix: String,
}

/// Fine-tunes a new head of the request's task from the features of the `members`, records it
/// in the registry with its quality gate and, when asked and the gate lets it (or it is
/// forced), deploys it; otherwise it stays a candidate. `conventional` is the Tuner's own
/// backbone, for conventional mode (the caller checked the request). With a replica map, a node
/// lost mid-job is handled as [`lost`] says.
pub(crate) async fn finetune(
    env: &JobEnv<'_>,
    replicas: Option<&Arc<dyn ReplicaCatalog>>,
    mut members: Members,
    conventional: Option<Arc<dyn InferenceBackend>>,
    req: FinetuneRequest,
    target: &Target,
) -> Result<FinetuneReport, TunerError> {
    let started = Instant::now();
    let wire_before = env.nodes.traffic().received();
    let snapshot = members.nodes.clone();
    if snapshot.is_empty() {
        return Err(TunerError::NoNodes);
    }
    let mut survey = Survey::take(&snapshot, &req.task, req.val_split).await?;
    if let Some((backbone, dim)) = &target.backbone {
        survey.backbone.clone_from(backbone);
        survey.feature_dim = *dim;
    }
    let (head, parent) = starting_head(env.registry, &req, &survey)?;
    let job_id = format!("{}{}", env.progress.id(), target.suffix);
    let labels: Vec<String> = snapshot.iter().map(Node::label).collect();
    env.progress.phase(Phase::Extracting, &labels);
    info!(
        job = %job_id,
        task = %req.task,
        nodes = snapshot.len(),
        classes = head.classes().len(),
        runs = req.runs,
        val_split = survey.val_split,
        "fine-tuning starts"
    );
    let mut trained_before = env.registry.trained_by_lineage(parent.as_deref())?;
    let (mut job, rx) = Job::start(
        (&snapshot, &req, &job_id),
        &survey,
        head,
        conventional,
        started,
        target,
    );
    job.replicas = replicas.cloned();
    job.intake.leave_out_of_val(
        snapshot
            .iter()
            .map(|n| trained_before.remove(&n.name).unwrap_or_default())
            .collect(),
    );
    let mut done = job.run(rx, env).await?;
    let trained: BTreeMap<String, Vec<u64>> = snapshot
        .iter()
        .map(|n| n.name.clone())
        .zip(done.intake.trained())
        .collect();
    let margin = req.deploy_margin.unwrap_or(env.deploy_margin);
    let assessed = assess::assess(
        env.registry,
        &req,
        (&snapshot, &done.intake),
        &mut done.head,
        parent.as_deref(),
        (&survey.backbone, margin),
    )
    .await?;
    let (mut report, head) = done.into_report(&survey, &job_id, parent, started);
    report.task = req.task.clone();
    report.floor = head.acceptance().floor;
    report.min_cosine = head.acceptance().novelty.as_ref().map(|n| n.min_cosine);
    report.gate = assessed.gate;
    report.per_class = assessed.per_class;
    report.val_other_share = assessed.val_other_share;
    // A node lost mid-job gets no deploy.
    for lost in &report.failed_over {
        members.nodes.retain(|n| n.name != lost.node);
        (members.skipped).push(format!(
            "{}: lost during the job ({})",
            lost.node, lost.reason
        ));
    }
    report.skipped = members.skipped.clone();
    report.wire_bytes_received = env.nodes.traffic().received() - wire_before;
    report.wire_bytes_per_image =
        report.wire_bytes_received as f64 / (report.train_images + report.val_images).max(1) as f64;
    // Recorded before the version, so that no version exists without its training photos.
    env.registry.save_trained(&report.version, &trained)?;
    let record = register(env.registry, &survey, &req, &report, &head)?;
    info!(version = %record.id, task = %req.task, report.val_top1, gate = ?report.gate, report.seconds, "fine-tuning done");
    if req.deploy && report.gate.deploys() {
        report.deploy = Some(deploy::deploy(env, &members, &record, Some(&head)).await?);
    } else if req.deploy {
        info!(version = %record.id, "the version stays a candidate: below its parent by more than the margin");
    }
    Ok(report)
}

/// Whether `nodes` can fine-tune `req`'s task: they know it, and their training photos span
/// two classes of it at least (what the job's own survey finds first). A node that does not
/// answer is left to the job, which takes over its photos from their copies or fails naming
/// it: only what the client can fix is refused before the job starts.
pub(crate) async fn survey_check(nodes: &[Node], req: &FinetuneRequest) -> Result<(), TunerError> {
    match Survey::take(nodes, &req.task, req.val_split).await {
        Err(TunerError::Node { node, message }) => {
            debug!(%node, %message, "preflight: a node did not answer; the job will see");
            Ok(())
        }
        other => other.map(drop),
    }
}

/// A job in flight: the event loop's state.
struct Job<'a> {
    nodes: &'a [Node],
    req: &'a FinetuneRequest,
    job_id: &'a str,
    started: Instant,
    intake: Intake,
    /// The job's channel, for the take-over streams started later. Weak: the channel closes
    /// once every stream has ended.
    tx: mpsc::WeakSender<Msg>,
    /// The trainer's results, once it runs.
    trained: Option<mpsc::Receiver<Result<TrainedRun, TunerError>>>,
    /// The Tuner's backbone, in conventional mode.
    conventional: Option<Arc<dyn InferenceBackend>>,
    cache: Option<CacheSetup>,
    /// Load balancing is done (or not wanted).
    balanced: bool,
    /// The head, until the trainer takes it with the first run.
    head: Option<Head>,
    trainer: Option<Trainer>,
    val_top1_before: f32,
    timeline: Vec<RunTimeline>,
    rebalanced: Vec<Rebalanced>,
    /// Why load balancing was skipped, when it was.
    balance_skipped: Option<String>,
    extract_seconds: Option<f64>,
    /// The Tuner's receive cap, shared by every stream of the job.
    ingress: Ingress,
    /// The head's classes, in the order of chunk labels.
    classes: Vec<String>,
    /// The replica map, to take over the photos of a node lost mid-job.
    replicas: Option<Arc<dyn ReplicaCatalog>>,
    /// Nodes lost mid-job whose photos were taken over.
    failed_over: Vec<crate::FailedOver>,
    /// The channel to read once the current one is drained (see `Job::sender`).
    next_rx: Option<mpsc::Receiver<Msg>>,
}

/// What a job ends with.
struct Done {
    head: Head,
    cache: Option<CacheReport>,
    intake: Intake,
    timeline: Vec<RunTimeline>,
    val_top1_before: f32,
    rebalanced: Vec<Rebalanced>,
    balance_skipped: Option<String>,
    extract_seconds: Option<f64>,
    failed_over: Vec<crate::FailedOver>,
}

impl Done {
    /// The job's report (without a deploy yet), and the trained head. The version is named after
    /// the job and the backbone.
    fn into_report(
        self,
        survey: &Survey,
        job_id: &str,
        parent: Option<String>,
        started: Instant,
    ) -> (FinetuneReport, Head) {
        let seconds = started.elapsed().as_secs_f64();
        let extract_seconds = self.extract_seconds.unwrap_or(seconds);
        let runs = self.timeline;
        let train_images: usize = runs.iter().map(|t| t.images).sum();
        let val_left_out = self.intake.val_left_out();
        let val_images = (self.intake.images() as usize)
            .saturating_sub(train_images)
            .saturating_sub(val_left_out as usize);
        let bytes = self.intake.bytes();
        let backbone = &survey.backbone;
        let report = FinetuneReport {
            version: format!("{job_id}-{}", backbone.get(..8).unwrap_or(backbone)),
            task: TaskName::default_task(),
            parent,
            classes: self.head.classes().to_vec(),
            train_images,
            val_images,
            val_left_out,
            val_split: survey.val_split.to_string(),
            val_top1_before: self.val_top1_before,
            val_top1: runs.last().map_or(0.0, |t| t.val_top1),
            gate: Gate::judge(0.0, None, 0.0, false),
            per_class: Vec::new(),
            floor: 0.0,
            min_cosine: None,
            val_other_share: 0.0,
            bytes_received: bytes,
            bytes_per_image: bytes as f64 / (train_images + val_images).max(1) as f64,
            wire_bytes_received: 0,
            wire_bytes_per_image: 0.0,
            peer_wire_bytes: self.intake.peer_bytes(),
            chunks_refetched: self.intake.refetched(),
            extract_seconds,
            train_seconds: runs.iter().map(|t| t.train_seconds).sum(),
            train_hidden_seconds: runs.iter().map(|t| t.hidden_seconds(extract_seconds)).sum(),
            seconds,
            nodes: self.intake.node_reports(),
            runs,
            rebalanced: self.rebalanced,
            balance_skipped: self.balance_skipped,
            cache: self.cache,
            skipped: Vec::new(),
            deploy: None,
            failed_over: self.failed_over,
        };
        (report, self.head)
    }
}

impl<'a> Job<'a> {
    /// Opens every node's feature stream; the job then runs on the returned channel.
    fn start(
        (nodes, req, job_id): (&'a [Node], &'a FinetuneRequest, &'a str),
        survey: &'a Survey,
        head: Head,
        conventional: Option<Arc<dyn InferenceBackend>>,
        started: Instant,
        target: &Target,
    ) -> (Self, mpsc::Receiver<Msg>) {
        let (tx, rx) = mpsc::channel::<Msg>(64);
        let ingress = Ingress::new(req.ingress_bytes_per_second);
        for (i, node) in nodes.iter().enumerate() {
            let request = pb::ExtractRequest {
                job_id: job_id.to_string(),
                runs: req.runs,
                align: req.align,
                classes: head.classes().to_vec(),
                chunk_size: req.chunk_size,
                use_stored_features: req.use_stored_features,
                val_split: survey.val_split.to_string(),
                throttle_images_per_second: req.throttle.get(&node.name).copied().unwrap_or(0.0),
                ship_tensors: conventional.is_some(),
                bandwidth_bytes_per_second: req.bandwidth_bytes_per_second,
                task: req.task.to_string(),
                backbone_version: target
                    .backbone
                    .as_ref()
                    .map(|(b, _)| b.clone())
                    .unwrap_or_default(),
            };
            streams::spawn_extract(i, node, request, tx.clone(), ingress.clone());
        }
        let cache = survey.cache_setup(nodes, req);
        let intake = Intake::new(
            nodes.iter().map(Node::label).collect(),
            req.runs as usize,
            head.classes().len(),
            survey.feature_dim,
            cache.is_some(),
        );
        let job = Job {
            nodes,
            req,
            job_id,
            started,
            intake,
            tx: tx.downgrade(),
            trained: None,
            conventional,
            cache,
            balanced: !req.load_balance || nodes.len() < 2,
            trainer: None,
            val_top1_before: 0.0,
            timeline: Vec::new(),
            rebalanced: Vec::new(),
            balance_skipped: None,
            extract_seconds: None,
            ingress,
            classes: head.classes().to_vec(),
            head: Some(head),
            replicas: None,
            failed_over: Vec::new(),
            next_rx: None,
        };
        (job, rx)
    }

    /// Runs the event loop until every run is trained. It ends on its own when the streams and
    /// the trainer are gone: it holds none of their senders.
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Msg>,
        env: &JobEnv<'_>,
    ) -> Result<Done, TunerError> {
        let runs = self.req.runs as usize;
        let mut trained = 0;
        let mut streams_open = true;
        while trained < runs {
            let msg = tokio::select! {
                msg = rx.recv(), if streams_open => msg,
                run = recv(&mut self.trained), if self.trained.is_some() => {
                    let Some(run) = run else {
                        return Err(TunerError::Internal("the training thread stopped".into()));
                    };
                    self.on_trained(run?, env.progress)?;
                    trained += 1;
                    continue;
                }
                else => {
                    return Err(TunerError::Internal(
                        "every stream ended before the runs were complete".into(),
                    ));
                }
            };
            let Some(msg) = msg else {
                match self.next_rx.take() {
                    Some(next) => rx = next,
                    None => streams_open = false,
                }
                continue;
            };
            match msg {
                Msg::Event(source, event) => {
                    if let (Source::Node(i), Event::Throughput(t)) = (source, &event) {
                        env.progress.node(i, t.done, t.total);
                    }
                    if let Some(chunk) = self.intake.on_event(source, event) {
                        self.on_chunk(source, chunk).await?;
                    }
                    if self.extract_seconds.is_none() && self.intake.all_done() {
                        self.extract_seconds = Some(self.started.elapsed().as_secs_f64());
                        env.progress.phase(Phase::Training, &[]);
                    }
                }
                Msg::Failed(Source::Node(i), _) if self.intake.is_lost(i) => {}
                Msg::Failed(Source::Node(i), message) => self.on_node_failed(i, &message).await?,
                Msg::Failed(source, message) => return Err(self.intake.blame(source, &message)),
                Msg::Ended(source) => self.intake.on_ended(source)?,
            }
            if !self.balanced && self.intake.rates_known() {
                self.balanced = true;
                self.rebalance().await?;
            }
            self.start_ready_runs()?;
        }
        let trainer = self
            .trainer
            .ok_or_else(|| TunerError::Internal("no run was trained".into()))?;
        let (head, cache) = trainer.finish()?;
        Ok(Done {
            head,
            cache,
            intake: self.intake,
            timeline: self.timeline,
            val_top1_before: self.val_top1_before,
            rebalanced: self.rebalanced,
            balance_skipped: self.balance_skipped,
            extract_seconds: self.extract_seconds,
            failed_over: self.failed_over,
        })
    }

    /// Books a trained run in the timeline.
    fn on_trained(&mut self, run: TrainedRun, progress: &Progress) -> Result<(), TunerError> {
        let line = self
            .timeline
            .get_mut(run.run)
            .ok_or_else(|| TunerError::Internal(format!("run {} was trained unasked", run.run)))?;
        line.train_start = run.start;
        line.train_seconds = run.seconds;
        line.val_top1 = run.val_top1;
        line.train_loss = run.train_loss;
        progress.trained(line.clone());
        Ok(())
    }

    /// Checks, decodes and books a chunk seen for the first time: features, or in conventional
    /// mode a node's tensors, which the Tuner's backbone turns into features.
    async fn on_chunk(
        &mut self,
        source: Source,
        chunk: pb::FeatureChunk,
    ) -> Result<(), TunerError> {
        let features = match self.conventional.clone() {
            Some(backbone) => {
                let node = &self.nodes[self.intake.sender(source)];
                let tensors = self.decode(source, &chunk, decode_tensor_chunk).await?;
                conventional::extract_on_tuner(backbone, node, tensors).await?
            }
            None => self.decode(source, &chunk, decode_chunk).await?,
        };
        self.intake.add(source, chunk.part, chunk.run, features)
    }

    /// Decodes a chunk, fetching it again from its node once when its checksum fails. Take-over
    /// chunks cannot be fetched again (the protocol has no such call), so that fails the job.
    async fn decode<T>(
        &mut self,
        source: Source,
        chunk: &pb::FeatureChunk,
        decode: fn(&pb::FeatureChunk, usize) -> Result<T, ProtoError>,
    ) -> Result<T, TunerError> {
        let classes = self.intake.classes();
        match (decode(chunk, classes), source) {
            (Ok(value), _) => Ok(value),
            (Err(ProtoError::Checksum { .. }), Source::Node(i)) => {
                let node = &self.nodes[i];
                warn!(
                    node = %node.label(),
                    run = chunk.run,
                    seq = chunk.seq,
                    "chunk checksum mismatch; fetching it again"
                );
                let again = streams::refetch(node, self.job_id, chunk).await?;
                self.intake.on_refetched(&again);
                decode(&again, classes).map_err(|e| node_error(node, e.to_string()))
            }
            (Err(e @ ProtoError::Checksum { .. }), Source::TakeOver(_)) => Err(self.intake.blame(
                source,
                &format!("{e}; a taken-over chunk cannot be fetched again"),
            )),
            (Err(e), _) => Err(self.intake.blame(source, &e.to_string())),
        }
    }

    /// Moves work from slow nodes to fast ones, each move streamed as a take-over; when it
    /// cannot, says why (a warning in the log and the report). Nothing moves once every stream
    /// has ended (nothing is left to move).
    async fn rebalance(&mut self) -> Result<(), TunerError> {
        let Some(tx) = self.tx.upgrade() else {
            self.skip_balance("every node had finished before the rates were known".into());
            return Ok(());
        };
        let balance = balance::rebalance(
            self.nodes,
            self.job_id,
            self.req,
            self.conventional.is_some(),
            &self.intake.remaining(),
            &self.intake.rates(),
        )
        .await?;
        if let Some(why) = balance.skipped {
            self.skip_balance(why);
        }
        for h in balance.handoffs {
            let k = self.intake.add_takeover(h.slow, h.fast, h.runs);
            self.rebalanced.push(h.moved);
            let ingress = self.ingress.clone();
            streams::spawn_takeover(k, &self.nodes[h.fast], h.request, tx.clone(), ingress);
        }
        Ok(())
    }

    /// Records and logs why load balancing was skipped.
    fn skip_balance(&mut self, why: String) {
        warn!(job = %self.job_id, reason = %why, "load balancing skipped");
        self.balance_skipped = Some(why);
    }

    /// Hands every ready run to the trainer, starting it with the first one.
    fn start_ready_runs(&mut self) -> Result<(), TunerError> {
        while let Some((run, data)) = self.intake.next_ready_run() {
            let trainer = match self.trainer.take() {
                Some(trainer) => trainer,
                None => self.start_trainer()?,
            };
            self.timeline.push(RunTimeline {
                run,
                images: data.len(),
                ready_at: self.started.elapsed().as_secs_f64(),
                train_start: 0.0,
                train_seconds: 0.0,
                val_top1: 0.0,
                train_loss: 0.0,
            });
            let sent = trainer.train(run, data);
            self.trainer = Some(trainer);
            sent?;
        }
        Ok(())
    }

    /// Starts the training thread with the head and the validation set (complete by now).
    fn start_trainer(&mut self) -> Result<Trainer, TunerError> {
        let head = self
            .head
            .take()
            .ok_or_else(|| TunerError::Internal("trainer started twice".into()))?;
        let val = self.intake.val();
        self.val_top1_before = validate(&head, &val)?;
        let (tx, rx) = mpsc::channel(self.req.runs as usize + 1);
        self.trained = Some(rx);
        Trainer::spawn(
            TrainerSetup {
                head,
                val,
                epochs: self.req.epochs,
                runs: self.req.runs as usize,
                started: self.started,
                cache: self.cache.clone(),
            },
            move |trained| tx.blocking_send(trained).is_ok(),
        )
    }
}

/// The next trained run, once the trainer runs.
async fn recv(
    trained: &mut Option<mpsc::Receiver<Result<TrainedRun, TunerError>>>,
) -> Option<Result<TrainedRun, TunerError>> {
    match trained {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
