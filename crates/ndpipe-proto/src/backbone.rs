//! A backbone on the wire: its ONNX file cut into checksummed [`pb::BackboneChunk`]s, the
//! manifest and class names in the first, and [`BackboneAssembly`], which accepts them only in
//! order, each with its checksum, and the whole only at its announced size.

use crate::{ProtoError, pb};

/// Bytes of the ONNX file per chunk.
pub const BACKBONE_CHUNK: usize = 1 << 20;

/// The chunks of backbone `version` (the hex sha256 of `onnx`), with its manifest and class
/// names in the first.
pub fn backbone_chunks(
    version: &str,
    manifest_json: &str,
    classes: &[String],
    onnx: &[u8],
) -> Vec<pb::BackboneChunk> {
    let mut chunks: Vec<pb::BackboneChunk> = onnx
        .chunks(BACKBONE_CHUNK)
        .enumerate()
        .map(|(i, data)| pb::BackboneChunk {
            backbone_version: version.to_string(),
            offset: (i * BACKBONE_CHUNK) as u64,
            crc32c: crc32c::crc32c(data),
            data: data.to_vec(),
            ..Default::default()
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(pb::BackboneChunk {
            backbone_version: version.to_string(),
            crc32c: crc32c::crc32c(&[]),
            ..Default::default()
        });
    }
    chunks[0].manifest_json = manifest_json.to_string();
    chunks[0].classes = classes.to_vec();
    chunks[0].total_bytes = onnx.len() as u64;
    chunks
}

/// A backbone being received: the file so far and what the first chunk announced.
#[derive(Debug, Default)]
pub struct BackboneAssembly {
    /// The backbone version every chunk names.
    pub version: String,
    /// The manifest as JSON.
    pub manifest_json: String,
    /// The class names.
    pub classes: Vec<String>,
    /// The ONNX bytes received so far.
    pub onnx: Vec<u8>,
    total: u64,
    started: bool,
}

impl BackboneAssembly {
    /// Adds the next chunk; refuses one out of order, of another version, with a bad checksum,
    /// or past the announced size (at most `max_bytes`).
    pub fn push(&mut self, chunk: pb::BackboneChunk, max_bytes: u64) -> Result<(), ProtoError> {
        let bad = |reason: String| ProtoError::Malformed {
            what: "backbone chunk".into(),
            reason,
        };
        if !self.started {
            if chunk.total_bytes > max_bytes {
                return Err(bad(format!(
                    "the file has {} bytes, over the limit of {max_bytes}",
                    chunk.total_bytes
                )));
            }
            self.version = chunk.backbone_version.clone();
            self.manifest_json = chunk.manifest_json.clone();
            self.classes = chunk.classes.clone();
            self.total = chunk.total_bytes;
            self.started = true;
        }
        if chunk.backbone_version != self.version {
            return Err(bad(format!(
                "chunk of {} in the stream of {}",
                chunk.backbone_version, self.version
            )));
        }
        if chunk.offset != self.onnx.len() as u64 {
            return Err(bad(format!(
                "chunk at offset {}, expected {}",
                chunk.offset,
                self.onnx.len()
            )));
        }
        if crc32c::crc32c(&chunk.data) != chunk.crc32c {
            return Err(ProtoError::Checksum {
                what: format!("backbone chunk at offset {}", chunk.offset),
            });
        }
        if self.onnx.len() as u64 + chunk.data.len() as u64 > self.total {
            return Err(bad(format!("more than the announced {} bytes", self.total)));
        }
        self.onnx.extend_from_slice(&chunk.data);
        Ok(())
    }

    /// The whole backbone, once every announced byte arrived.
    pub fn finish(self) -> Result<BackboneAssembly, ProtoError> {
        if !self.started || self.onnx.len() as u64 != self.total {
            return Err(ProtoError::Malformed {
                what: "backbone stream".into(),
                reason: format!("ended after {} of {} bytes", self.onnx.len(), self.total),
            });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_reassemble_only_whole_in_order_and_intact() {
        let onnx: Vec<u8> = (0..(2 * BACKBONE_CHUNK + 5)).map(|i| i as u8).collect();
        let classes = vec!["a".to_string()];
        let chunks = backbone_chunks("v", "{}", &classes, &onnx);
        assert_eq!(chunks.len(), 3);
        let mut whole = BackboneAssembly::default();
        for c in chunks.clone() {
            whole.push(c, 1 << 30).unwrap();
        }
        let whole = whole.finish().unwrap();
        assert_eq!((whole.onnx, whole.classes), (onnx.clone(), classes));

        let mut damaged = chunks.clone();
        damaged[1].data[0] ^= 1;
        let mut a = BackboneAssembly::default();
        a.push(damaged[0].clone(), 1 << 30).unwrap();
        assert!(matches!(
            a.push(damaged[1].clone(), 1 << 30),
            Err(ProtoError::Checksum { .. })
        ));
        let mut skipped = BackboneAssembly::default();
        skipped.push(chunks[0].clone(), 1 << 30).unwrap();
        assert!(skipped.push(chunks[2].clone(), 1 << 30).is_err());
        let mut short = BackboneAssembly::default();
        short.push(chunks[0].clone(), 1 << 30).unwrap();
        assert!(short.finish().is_err());
        assert!(
            BackboneAssembly::default()
                .push(chunks[0].clone(), 10)
                .is_err()
        );
    }
}
