//! The wire protocol between the Tuner and PipeStores (gRPC, `proto/ndpipe.proto`).
//!
//! [`pb`] is the generated code. The rest turns wire messages into checked Rust values at the
//! boundary: a [`FeatureChunk`](pb::FeatureChunk) is only accepted as [`Features`] when its
//! checksum, counts and dimensions agree, and a staged head only as a
//! [`HeadWeights`] when its checksum holds and its byte length matches
//! its shape; a backbone's ONNX file is only whole when every chunk came in order with its
//! checksum ([`BackboneAssembly`]). [`RunPlan`] is the chunking contract both sides compute alike, and a
//! [`CountedChannel`] counts the bytes that cross a channel.
#![deny(missing_docs)]

use ndpipe_model::{Acceptance, HeadWeights, Novelty};

/// Generated protobuf and gRPC code.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("ndpipe.v1");
}

mod backbone;
mod counted;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod plan;
mod serving;
mod tls;
pub mod transport;

pub use backbone::{BACKBONE_CHUNK, BackboneAssembly, backbone_chunks};
pub use counted::{ByteCounter, CountedChannel};
pub use plan::{MAX_RUNS, RunPlan};
pub use serving::Serving;

/// The protocol version this build speaks; a node with another version is refused.
pub const PROTOCOL_VERSION: u32 = 2;

/// A wire message that does not hold together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The checksum does not match the payload.
    #[error("checksum mismatch in {what}")]
    Checksum {
        /// Which message.
        what: String,
    },
    /// A run plan with zero runs or zero alignment.
    #[error("invalid run plan: {0}")]
    InvalidPlan(String),
    /// Counts, dimensions or lengths disagree.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// Which message.
        what: String,
        /// What disagrees.
        reason: String,
    },
    /// TLS files missing, unreadable or not PEM, or a TLS setting refused.
    #[error("TLS: {reason}")]
    Tls {
        /// What is wrong.
        reason: String,
    },
    /// A gRPC URL that does not parse.
    #[error("bad gRPC url {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
}

/// A validated chunk of features: `count` rows of `dim` values with their labels and photo ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    /// Row-major values, `count * dim`.
    pub values: Vec<f32>,
    /// Values per row.
    pub dim: usize,
    /// Class index of each row.
    pub labels: Vec<u32>,
    /// Photo id of each row.
    pub photo_ids: Vec<u64>,
}

impl Features {
    /// Rows in the chunk.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the chunk has no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

fn chunk_crc(features: &[u8], labels: &[u32], ids: &[u64]) -> u32 {
    let mut crc = crc32c::crc32c(features);
    for l in labels {
        crc = crc32c::crc32c_append(crc, &l.to_le_bytes());
    }
    for i in ids {
        crc = crc32c::crc32c_append(crc, &i.to_le_bytes());
    }
    crc
}

/// Builds a wire chunk (f16 values, checksummed) from rows of f32 features.
pub fn encode_chunk(part: pb::Part, run: u32, seq: u32, f: &Features) -> pb::FeatureChunk {
    let bytes = ndpipe_util::f16::encode(&f.values);
    let crc32c = chunk_crc(&bytes, &f.labels, &f.photo_ids);
    pb::FeatureChunk {
        part: part as i32,
        run,
        seq,
        count: f.len() as u32,
        dim: f.dim as u32,
        features: bytes,
        labels: f.labels.clone(),
        photo_ids: f.photo_ids.clone(),
        crc32c,
        encoding: pb::Encoding::F16Features as i32,
        height: 0,
        width: 0,
    }
}

/// Preprocessed u8 HWC tensors with their labels and photo ids (conventional mode).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensors {
    /// `count` tensors of `height * width * 3` bytes each.
    pub data: Vec<u8>,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Class index of each tensor.
    pub labels: Vec<u32>,
    /// Photo id of each tensor.
    pub photo_ids: Vec<u64>,
}

/// Builds a wire chunk of u8 tensors (conventional mode).
pub fn encode_tensor_chunk(part: pb::Part, run: u32, seq: u32, t: &Tensors) -> pb::FeatureChunk {
    let crc32c = chunk_crc(&t.data, &t.labels, &t.photo_ids);
    pb::FeatureChunk {
        part: part as i32,
        run,
        seq,
        count: t.labels.len() as u32,
        dim: t.height * t.width * 3,
        features: t.data.clone(),
        labels: t.labels.clone(),
        photo_ids: t.photo_ids.clone(),
        crc32c,
        encoding: pb::Encoding::U8Tensors as i32,
        height: t.height,
        width: t.width,
    }
}

/// Checks and decodes a chunk of u8 tensors; `num_classes` bounds the labels.
pub fn decode_tensor_chunk(
    c: &pb::FeatureChunk,
    num_classes: usize,
) -> Result<Tensors, ProtoError> {
    let what = format!("tensor chunk run {} seq {}", c.run, c.seq);
    let count = c.count as usize;
    let per = (c.height as usize) * (c.width as usize) * 3;
    if c.encoding != pb::Encoding::U8Tensors as i32
        || per == 0
        || c.dim as usize != per
        || c.features.len() != count * per
        || c.labels.len() != count
        || c.photo_ids.len() != count
    {
        return Err(ProtoError::Malformed {
            what,
            reason: "shape, counts or encoding disagree".into(),
        });
    }
    if chunk_crc(&c.features, &c.labels, &c.photo_ids) != c.crc32c {
        return Err(ProtoError::Checksum { what });
    }
    if let Some(l) = c.labels.iter().find(|l| **l as usize >= num_classes) {
        return Err(ProtoError::Malformed {
            what,
            reason: format!("label {l} is not one of {num_classes} classes"),
        });
    }
    Ok(Tensors {
        data: c.features.clone(),
        height: c.height,
        width: c.width,
        labels: c.labels.clone(),
        photo_ids: c.photo_ids.clone(),
    })
}

/// Checks a wire chunk and decodes it; `num_classes` bounds the labels.
pub fn decode_chunk(c: &pb::FeatureChunk, num_classes: usize) -> Result<Features, ProtoError> {
    let what = format!("feature chunk run {} seq {}", c.run, c.seq);
    let bad = |reason: String| ProtoError::Malformed {
        what: what.clone(),
        reason,
    };
    let (count, dim) = (c.count as usize, c.dim as usize);
    if c.encoding != pb::Encoding::F16Features as i32 {
        return Err(bad("not a feature chunk".into()));
    }
    if c.labels.len() != count || c.photo_ids.len() != count {
        return Err(bad(format!(
            "{count} rows but {} labels and {} photo ids",
            c.labels.len(),
            c.photo_ids.len()
        )));
    }
    if dim == 0 || c.features.len() != count * dim * 2 {
        return Err(bad(format!(
            "{} feature bytes for {count} rows of {dim}",
            c.features.len()
        )));
    }
    if chunk_crc(&c.features, &c.labels, &c.photo_ids) != c.crc32c {
        return Err(ProtoError::Checksum { what });
    }
    if let Some(l) = c.labels.iter().find(|l| **l as usize >= num_classes) {
        return Err(bad(format!(
            "label {l} is not one of {num_classes} classes"
        )));
    }
    let values = ndpipe_util::f16::decode(&c.features);
    Ok(Features {
        values,
        dim,
        labels: c.labels.clone(),
        photo_ids: c.photo_ids.clone(),
    })
}

/// Writes `head` into a stage request: classes, input size, weights then bias as f32 LE, the
/// label rules, and the CRC-32C of the weights then the novelty check.
pub fn put_head(request: &mut pb::StageHeadRequest, head: &HeadWeights) {
    let f32s = |values: &mut dyn Iterator<Item = &f32>| -> Vec<u8> {
        values.flat_map(|v| v.to_le_bytes()).collect()
    };
    let acceptance = head.acceptance();
    request.classes = head.classes().to_vec();
    request.input_dim = u32::try_from(head.input_dim()).unwrap_or(u32::MAX);
    request.weights = f32s(&mut head.weights().iter().chain(head.bias()));
    request.floor = acceptance.floor;
    (request.novelty, request.min_cosine) = match &acceptance.novelty {
        Some(n) => (f32s(&mut n.center.iter().chain(&n.centroids)), n.min_cosine),
        None => (Vec::new(), 0.0),
    };
    request.crc32c = head_crc(request);
}

fn head_crc(r: &pb::StageHeadRequest) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&r.weights), &r.novelty)
}

/// Parses and checks a staged head: its checksum, then that its bytes match its shape.
pub fn head_from_request(r: &pb::StageHeadRequest) -> Result<HeadWeights, ProtoError> {
    let what = format!("head {}", r.version);
    if head_crc(r) != r.crc32c {
        return Err(ProtoError::Checksum { what });
    }
    let (c, d) = (r.classes.len(), r.input_dim as usize);
    let malformed = |reason: String| ProtoError::Malformed {
        what: what.clone(),
        reason,
    };
    if c == 0 || d == 0 || r.weights.len() != (c * d + c) * 4 {
        return Err(malformed(format!(
            "{} weight bytes for {c} classes of {d} inputs",
            r.weights.len()
        )));
    }
    let floats = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let mut values = floats(&r.weights);
    let bias = values.split_off(c * d);
    let novelty = match r.novelty.len() {
        0 => None,
        n if n == (d + c * d) * 4 => {
            let mut center = floats(&r.novelty);
            let centroids = center.split_off(d);
            Some(Novelty {
                center,
                centroids,
                min_cosine: r.min_cosine,
            })
        }
        n => {
            return Err(malformed(format!(
                "{n} novelty bytes for {c} classes of {d} inputs"
            )));
        }
    };
    HeadWeights::new(r.classes.clone(), d, values, bias)
        .and_then(|h| {
            h.with_acceptance(Acceptance {
                floor: r.floor,
                novelty,
            })
        })
        .map_err(|e| malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> Features {
        Features {
            values: vec![0.5, -1.0, 2.0, 0.25, 3.0, -0.125],
            dim: 3,
            labels: vec![1, 0],
            photo_ids: vec![10, 11],
        }
    }

    #[test]
    fn chunks_round_trip_and_reject_damage() {
        let wire = encode_chunk(pb::Part::Train, 2, 7, &chunk());
        assert_eq!(decode_chunk(&wire, 2).unwrap(), chunk());
        let mut flipped = wire.clone();
        flipped.features[3] ^= 1;
        assert!(matches!(
            decode_chunk(&flipped, 2),
            Err(ProtoError::Checksum { .. })
        ));
        let mut relabelled = wire.clone();
        relabelled.labels[0] = 0;
        assert!(matches!(
            decode_chunk(&relabelled, 2),
            Err(ProtoError::Checksum { .. })
        ));
        assert!(matches!(
            decode_chunk(&wire, 1),
            Err(ProtoError::Malformed { .. })
        ));
        let mut short = wire;
        short.count = 3;
        assert!(matches!(
            decode_chunk(&short, 2),
            Err(ProtoError::Malformed { .. })
        ));
    }

    #[test]
    fn heads_round_trip_and_reject_wrong_shapes() {
        let head = HeadWeights::new(
            vec!["a".into(), "b".into()],
            2,
            vec![1.0, 2.0, 3.0, 4.0],
            vec![0.5, -0.5],
        )
        .unwrap();
        let mut req = pb::StageHeadRequest {
            version: "v".into(),
            ..Default::default()
        };
        put_head(&mut req, &head);
        assert_eq!(head_from_request(&req).unwrap(), head);
        let ruled = head
            .clone()
            .with_acceptance(Acceptance {
                floor: 0.4,
                novelty: Some(Novelty {
                    center: vec![0.1, 0.2],
                    centroids: vec![1.0, 0.0, 0.0, 1.0],
                    min_cosine: 0.3,
                }),
            })
            .unwrap();
        put_head(&mut req, &ruled);
        assert_eq!(head_from_request(&req).unwrap(), ruled);
        req.novelty[0] ^= 1;
        assert!(matches!(
            head_from_request(&req),
            Err(ProtoError::Checksum { .. })
        ));
        put_head(&mut req, &head);
        req.input_dim = 3;
        assert!(matches!(
            head_from_request(&req),
            Err(ProtoError::Malformed { .. })
        ));
        req.input_dim = 2;
        req.crc32c ^= 1;
        assert!(matches!(
            head_from_request(&req),
            Err(ProtoError::Checksum { .. })
        ));
    }
}
