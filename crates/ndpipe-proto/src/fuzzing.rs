//! The harness of the `grpc` fuzz target (`fuzz/`), compiled with feature `fuzzing` and in every
//! test build: every message a node accepts off the wire, prost-decoded from arbitrary bytes and
//! then run through the checked conversion the receiving side applies. The unit test below
//! replays the committed seeds and kept crashes through it. Not product API.

use prost::Message;

use crate::{
    BackboneAssembly, RunPlan, chunk_crc, decode_chunk, decode_tensor_chunk, head_from_request, pb,
    put_head,
};

/// The messages, in the order the first input byte picks them.
const MESSAGES: u8 = 34;

/// The `grpc` target: the first byte picks the message, the rest is its protobuf encoding.
/// Requests the PipeStore service accepts (and the Tuner's `Register`, `Heartbeat`), and the
/// replies and stream events the Tuner accepts from PipeStores, and the Replication service's
/// requests (photo copies, plain objects' files). Feature chunks and staged heads
/// go through `decode_chunk`, `decode_tensor_chunk` and `head_from_request` (a head that is
/// accepted must survive `head_bytes` unchanged); an extraction request plans its runs as a node
/// does (`RunPlan`) over a small training set.
pub fn grpc(data: &[u8]) {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % MESSAGES {
        0 => {
            if let Ok(c) = pb::FeatureChunk::decode(bytes) {
                chunk(&c);
            }
        }
        1 => {
            if let Ok(r) = pb::StageHeadRequest::decode(bytes) {
                stage_head(&r);
            }
        }
        2 => {
            if let Ok(r) = pb::ExtractRequest::decode(bytes) {
                extract(&r);
            }
        }
        3 => {
            if let Ok(e) = pb::ExtractEvent::decode(bytes)
                && let Some(pb::extract_event::Event::Chunk(c)) = &e.event
            {
                chunk(c);
            }
        }
        4 => drop(pb::GetFeaturesRequest::decode(bytes)),
        5 => drop(pb::RebalanceRequest::decode(bytes)),
        6 => drop(pb::TakeOverRequest::decode(bytes)),
        7 => drop(pb::GetTensorsRequest::decode(bytes)),
        8 => drop(pb::RegisterRequest::decode(bytes)),
        9 => drop(pb::HeartbeatRequest::decode(bytes)),
        10 => drop(pb::InventoryRequest::decode(bytes)),
        11 => drop(pb::FetchChunkRequest::decode(bytes)),
        12 => drop(pb::CommitHeadRequest::decode(bytes)),
        13 => drop(pb::AbortHeadRequest::decode(bytes)),
        14 => drop(pb::RelabelRequest::decode(bytes)),
        15 => drop(pb::RegisterReply::decode(bytes)),
        16 => drop(pb::HeartbeatReply::decode(bytes)),
        17 => drop(pb::InventoryReply::decode(bytes)),
        18 => drop(pb::RebalanceReply::decode(bytes)),
        19 => drop(pb::GetTensorsReply::decode(bytes)),
        20 => drop(pb::RelabelEvent::decode(bytes)),
        21 => drop(pb::StageHeadReply::decode(bytes)),
        22 => {
            if let Ok(c) = pb::BackboneChunk::decode(bytes) {
                backbone_chunk(c);
            }
        }
        23 => {
            if let Ok(r) = pb::PutFeaturesRequest::decode(bytes)
                && let Some(c) = &r.chunk
            {
                chunk(c);
            }
        }
        24 => drop(pb::ExtractBackboneRequest::decode(bytes)),
        25 => drop(pb::CommitBackboneRequest::decode(bytes)),
        26 => drop(pb::AbortBackboneRequest::decode(bytes)),
        27 => drop(pb::GiveBackbonePhotosRequest::decode(bytes)),
        28 => drop(pb::TakeOverBackboneRequest::decode(bytes)),
        29 => drop(pb::PutBackboneOutputsRequest::decode(bytes)),
        30 => drop(pb::PhotoCopy::decode(bytes)),
        31 => drop(pb::BlobCopy::decode(bytes)),
        32 => drop(pb::ReadBlobRequest::decode(bytes)),
        _ => drop(pb::DropBlobRequest::decode(bytes)),
    }
}

/// A backbone chunk as a node reassembles a staged file, under a few size limits: what is
/// accepted stays within the limit, and the same chunk again is refused, not appended.
fn backbone_chunk(c: pb::BackboneChunk) {
    for max_bytes in [0, 1 << 10, 1 << 32] {
        let mut file = BackboneAssembly::default();
        if file.push(c.clone(), max_bytes).is_ok() {
            assert!(file.onnx.len() as u64 <= max_bytes, "over the limit");
            let again = file.push(c.clone(), max_bytes);
            assert!(
                c.data.is_empty() || again.is_err(),
                "a repeated chunk appended"
            );
            drop(file.finish());
        }
    }
}

/// A feature or tensor chunk as the Tuner's intake checks it, for a few class counts; then
/// again with its checksum made right, so the fuzzer gets past it.
fn chunk(c: &pb::FeatureChunk) {
    checked_chunk(c);
    let mut fixed = c.clone();
    fixed.crc32c = chunk_crc(&c.features, &c.labels, &c.photo_ids);
    checked_chunk(&fixed);
}

fn checked_chunk(c: &pb::FeatureChunk) {
    for classes in [1, 10, 1000] {
        if let Ok(f) = decode_chunk(c, classes) {
            assert_eq!(f.values.len(), f.len() * f.dim);
            assert!(f.labels.iter().all(|&l| (l as usize) < classes));
        }
        if let Ok(t) = decode_tensor_chunk(c, classes) {
            assert_eq!(t.labels.len(), t.photo_ids.len());
        }
    }
}

/// A staged head as a PipeStore accepts it, with its checksum as sent and made right.
fn stage_head(r: &pb::StageHeadRequest) {
    checked_head(r);
    let mut fixed = r.clone();
    fixed.crc32c = crc32c::crc32c_append(crc32c::crc32c(&r.weights), &r.novelty);
    checked_head(&fixed);
}

fn checked_head(r: &pb::StageHeadRequest) {
    if let Ok(head) = head_from_request(r) {
        let mut back = r.clone();
        put_head(&mut back, &head);
        assert_eq!(back.weights, r.weights);
        assert_eq!(back.novelty, r.novelty);
        assert_eq!(back.crc32c, r.crc32c);
    }
}

/// An extraction request's run plan over training sets of a few sizes, as a node plans it.
fn extract(r: &pb::ExtractRequest) {
    for total in [0, 1, 7, 1000] {
        if let Ok(plan) = RunPlan::new(total, r.runs as usize, r.align as usize) {
            assert_eq!(plan.runs(), r.runs as usize);
            let covered: usize = plan.chunks().iter().map(|c| c.len()).sum();
            assert_eq!(covered, total);
        }
    }
}

#[cfg(test)]
mod tests {
    use ndpipe_util::fuzzing::{replay, write_seed};
    use prost::Message;

    use super::*;
    use crate::{Features, Tensors, encode_chunk, encode_tensor_chunk};

    const M: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn grpc_corpus_replays() {
        replay(M, "grpc", grpc);
    }

    fn seed(name: &str, pick: u8, message: &impl Message) {
        let mut bytes = vec![pick];
        bytes.extend(message.encode_to_vec());
        write_seed(M, "grpc", name, &bytes);
    }

    /// Writes the `grpc` seeds: `cargo test -p ndpipe-proto -- --ignored write_seeds`.
    #[test]
    #[ignore = "writes the committed seed corpus"]
    fn write_seeds() {
        let features = Features {
            values: vec![0.5, -1.0, 2.0, 0.25, 0.0, 1.0],
            dim: 3,
            labels: vec![0, 1],
            photo_ids: vec![7, 9],
        };
        let c = encode_chunk(pb::Part::Train, 1, 2, &features);
        seed("feature-chunk", 0, &c);
        seed(
            "extract-event",
            3,
            &pb::ExtractEvent {
                event: Some(pb::extract_event::Event::Chunk(c)),
            },
        );
        let tensors = Tensors {
            data: vec![1, 2, 3, 4, 5, 6],
            height: 1,
            width: 2,
            labels: vec![0],
            photo_ids: vec![3],
        };
        seed(
            "tensor-chunk",
            0,
            &encode_tensor_chunk(pb::Part::Val, 0, 0, &tensors),
        );
        let head = ndpipe_model::HeadWeights::new(
            vec!["cat".into(), "dog".into()],
            2,
            vec![1.0, 0.0, 0.0, 1.0],
            vec![0.5, -0.5],
        )
        .unwrap();
        let mut stage = pb::StageHeadRequest {
            version: "v2".into(),
            backbone_version: "ab".into(),
            parent: "v1".into(),
            metrics_json: "{\"accuracy\":0.9}".into(),
            task: "default".into(),
            ..Default::default()
        };
        put_head(&mut stage, &head);
        seed("stage-head", 1, &stage);
        seed(
            "extract",
            2,
            &pb::ExtractRequest {
                job_id: "job-1".into(),
                runs: 3,
                align: 4,
                classes: vec!["cat".into(), "dog".into()],
                chunk_size: 16,
                use_stored_features: true,
                val_split: "carve".into(),
                ..Default::default()
            },
        );
        seed(
            "take-over",
            6,
            &pb::TakeOverRequest {
                job_id: "job-1".into(),
                source_url: "http://127.0.0.1:7001".into(),
                photos: vec![pb::LabelledPhoto {
                    id: 5,
                    label: 1,
                    run: 2,
                    sha256: "ab".repeat(32),
                }],
                chunk_size: 8,
                first_seq: 100,
                timeout_ms: 1000,
                ..Default::default()
            },
        );
        for c in crate::backbone_chunks("ab", "{}", &["cat".to_string()], &[1, 2, 3]) {
            seed("backbone-chunk", 22, &c);
        }
        seed(
            "put-features",
            23,
            &pb::PutFeaturesRequest {
                backbone_version: "ab".into(),
                chunk: Some(encode_chunk(pb::Part::Train, 0, 0, &features)),
            },
        );
        seed(
            "register",
            8,
            &pb::RegisterRequest {
                protocol_version: crate::PROTOCOL_VERSION,
                grpc_url: "http://127.0.0.1:7001".into(),
                name: "node-a".into(),
                active_version: "v1".into(),
                replicas: 0,
            },
        );
        seed(
            "inventory-reply",
            17,
            &pb::InventoryReply {
                node_id: 1,
                backbone_version: "ab".into(),
                feature_dim: 1280,
                classes: vec![pb::ClassCount {
                    label: "cat".into(),
                    train: 3,
                    val: 1,
                    test: 0,
                }],
                active_version: "general=v1".into(),
                task_known: true,
            },
        );
    }
}
