//! The tonic adapter of the Tuner protocol (`proto/ndpipe.proto`) over [`PipeStoreNode`]: each
//! RPC unpacks its request, runs the node's method (off the async runtime when it blocks) and
//! maps a [`NodeError`] to its status once, through `From<NodeError> for Status`.

use std::pin::Pin;
use std::sync::Arc;

use ndpipe_proto::pb;
use ndpipe_proto::pb::pipe_store_server::{PipeStore as PipeStoreRpc, PipeStoreServer};
use ndpipe_proto::pb::{extract_backbone_event, relabel_event};
use ndpipe_proto::transport::{ClusterSecret, Guard};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::node::{MAX_BACKBONE_BYTES, MAX_MESSAGE, NodeError, PipeStoreNode};

type ExtractStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExtractEvent, Status>> + Send>>;
type RelabelStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RelabelEvent, Status>> + Send>>;
type ExtractBackboneStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExtractBackboneEvent, Status>> + Send>>;

/// The tonic service over a shared node.
#[derive(Clone)]
pub(crate) struct PipeStoreService(Arc<PipeStoreNode>);

impl PipeStoreService {
    /// The gRPC server of `node`, with the protocol's message size limits, behind the cluster
    /// secret's guard (every call refused without it, when there is one).
    pub(crate) fn server(
        node: Arc<PipeStoreNode>,
        secret: Option<ClusterSecret>,
    ) -> InterceptedService<PipeStoreServer<Self>, Guard> {
        let server = PipeStoreServer::new(PipeStoreService(node))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        InterceptedService::new(server, Guard(secret))
    }

    /// Runs `f` on the node off the async runtime (store, catalog and model calls block).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<PipeStoreNode>) -> Result<T, NodeError> + Send + 'static,
    ) -> Result<T, Status> {
        let node = self.0.clone();
        tokio::task::spawn_blocking(move || f(node))
            .await
            .map_err(|e| NodeError::Task(e.to_string()))?
            .map_err(Status::from)
    }
}

/// An event stream of the node as a tonic stream.
fn events(rx: crate::node::Events) -> ExtractStream {
    Box::pin(ReceiverStream::new(rx).map(|event| event.map_err(Status::from)))
}

#[tonic::async_trait]
impl PipeStoreRpc for PipeStoreService {
    type ExtractStream = ExtractStream;
    type TakeOverStream = ExtractStream;
    type RelabelStream = RelabelStream;
    type ExtractBackboneStream = ExtractBackboneStream;

    /// Takes the chunks in order (each checked as it comes), then stages the whole file off
    /// the async runtime.
    async fn stage_backbone(
        &self,
        request: Request<Streaming<pb::BackboneChunk>>,
    ) -> Result<Response<pb::StageBackboneReply>, Status> {
        let mut chunks = request.into_inner();
        let mut upload = ndpipe_proto::BackboneAssembly::default();
        while let Some(chunk) = chunks.message().await? {
            upload
                .push(chunk, MAX_BACKBONE_BYTES)
                .map_err(|e| NodeError::BadBackbone(e.to_string()))?;
        }
        let model_version = self
            .blocking(move |node| node.stage_backbone(upload))
            .await?;
        Ok(Response::new(pb::StageBackboneReply { model_version }))
    }

    /// Re-extracts on a blocking thread, streaming its progress after every batch and the
    /// report last. The pass finishes (and checkpoints) even if the Tuner stops listening.
    async fn extract_backbone(
        &self,
        request: Request<pb::ExtractBackboneRequest>,
    ) -> Result<Response<Self::ExtractBackboneStream>, Status> {
        let sha = request.into_inner().backbone_version;
        let node = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::task::spawn_blocking(move || {
            let event = |event| pb::ExtractBackboneEvent { event: Some(event) };
            let progress = |progress| {
                let _ =
                    tx.blocking_send(Ok(event(extract_backbone_event::Event::Progress(progress))));
            };
            let done = node
                .extract_backbone(&sha, progress)
                .map(|done| event(extract_backbone_event::Event::Done(done)))
                .map_err(Status::from);
            let _ = tx.blocking_send(done);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn commit_backbone(
        &self,
        request: Request<pb::CommitBackboneRequest>,
    ) -> Result<Response<pb::CommitBackboneReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .blocking(move |node| node.commit_backbone(&request.backbone_version, &request.heads))
            .await?;
        Ok(Response::new(reply))
    }

    async fn abort_backbone(
        &self,
        request: Request<pb::AbortBackboneRequest>,
    ) -> Result<Response<pb::AbortBackboneReply>, Status> {
        let sha = request.into_inner().backbone_version;
        self.blocking(move |node| node.abort_backbone(&sha)).await?;
        Ok(Response::new(pb::AbortBackboneReply {}))
    }

    async fn give_backbone_photos(
        &self,
        request: Request<pb::GiveBackbonePhotosRequest>,
    ) -> Result<Response<pb::GiveBackbonePhotosReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .blocking(move |node| node.give_backbone_photos(&request))
            .await?;
        Ok(Response::new(reply))
    }

    async fn take_over_backbone(
        &self,
        request: Request<pb::TakeOverBackboneRequest>,
    ) -> Result<Response<pb::TakeOverBackboneReply>, Status> {
        let reply = self
            .0
            .clone()
            .take_over_backbone(request.into_inner())
            .await?;
        Ok(Response::new(reply))
    }

    async fn put_backbone_outputs(
        &self,
        request: Request<pb::PutBackboneOutputsRequest>,
    ) -> Result<Response<pb::PutBackboneOutputsReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .blocking(move |node| node.put_backbone_outputs(request))
            .await?;
        Ok(Response::new(reply))
    }

    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<pb::RebalanceReply>, Status> {
        let request = request.into_inner();
        let reply = self.blocking(move |node| node.rebalance(&request)).await?;
        Ok(Response::new(reply))
    }

    async fn take_over(
        &self,
        request: Request<pb::TakeOverRequest>,
    ) -> Result<Response<Self::TakeOverStream>, Status> {
        let rx = self.0.clone().take_over(request.into_inner()).await?;
        Ok(Response::new(events(rx)))
    }

    async fn get_features(
        &self,
        request: Request<pb::GetFeaturesRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let request = request.into_inner();
        let chunk = self
            .blocking(move |node| node.features_chunk(&request.ids, request.stored_only))
            .await?;
        Ok(Response::new(chunk))
    }

    async fn put_features(
        &self,
        request: Request<pb::PutFeaturesRequest>,
    ) -> Result<Response<pb::PutFeaturesReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .blocking(move |node| node.put_features(&request))
            .await?;
        Ok(Response::new(reply))
    }

    async fn get_tensors(
        &self,
        request: Request<pb::GetTensorsRequest>,
    ) -> Result<Response<pb::GetTensorsReply>, Status> {
        let ids = request.into_inner().ids;
        let tensors = self.blocking(move |node| node.tensors(&ids)).await?;
        Ok(Response::new(pb::GetTensorsReply { tensors }))
    }

    async fn inventory(
        &self,
        request: Request<pb::InventoryRequest>,
    ) -> Result<Response<pb::InventoryReply>, Status> {
        let task = request.into_inner().task;
        let reply = self.blocking(move |node| node.inventory(&task)).await?;
        Ok(Response::new(reply))
    }

    async fn extract(
        &self,
        request: Request<pb::ExtractRequest>,
    ) -> Result<Response<Self::ExtractStream>, Status> {
        let req = request.into_inner();
        let rx = self
            .blocking(move |node| node.start_extraction(req))
            .await?;
        Ok(Response::new(events(rx)))
    }

    async fn fetch_chunk(
        &self,
        request: Request<pb::FetchChunkRequest>,
    ) -> Result<Response<pb::FeatureChunk>, Status> {
        let req = request.into_inner();
        let chunk = self.blocking(move |node| node.fetch_chunk(&req)).await?;
        Ok(Response::new(chunk))
    }

    async fn stage_head(
        &self,
        request: Request<pb::StageHeadRequest>,
    ) -> Result<Response<pb::StageHeadReply>, Status> {
        let req = request.into_inner();
        self.blocking(move |node| node.stage_head(&req)).await?;
        Ok(Response::new(pb::StageHeadReply {}))
    }

    async fn commit_head(
        &self,
        request: Request<pb::CommitHeadRequest>,
    ) -> Result<Response<pb::CommitHeadReply>, Status> {
        let version = request.into_inner().version;
        self.blocking(move |node| node.commit_head(&version))
            .await?;
        Ok(Response::new(pb::CommitHeadReply {}))
    }

    async fn abort_head(
        &self,
        request: Request<pb::AbortHeadRequest>,
    ) -> Result<Response<pb::AbortHeadReply>, Status> {
        let version = request.into_inner().version;
        self.blocking(move |node| node.abort_head(&version)).await?;
        Ok(Response::new(pb::AbortHeadReply {}))
    }

    /// Re-labels on a blocking thread, streaming its progress after every batch and the reply
    /// last. The re-labelling finishes even if the Tuner stops listening.
    async fn relabel(
        &self,
        request: Request<pb::RelabelRequest>,
    ) -> Result<Response<Self::RelabelStream>, Status> {
        let version = request.into_inner().version;
        self.0.check_serving(&version)?;
        let node = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::task::spawn_blocking(move || {
            let event = |event| pb::RelabelEvent { event: Some(event) };
            let progress = |done, total| {
                let progress = pb::RelabelProgress { done, total };
                let _ = tx.blocking_send(Ok(event(relabel_event::Event::Progress(progress))));
            };
            let reply = node
                .relabel(&version, progress)
                .map(|reply| event(relabel_event::Event::Done(reply)))
                .map_err(Status::from);
            let _ = tx.blocking_send(reply);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
