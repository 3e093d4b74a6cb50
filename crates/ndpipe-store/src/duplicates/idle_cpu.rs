//! Perceptual hashing on a thread of its own under the idle scheduling policy (Linux
//! `SCHED_IDLE`), so that it takes only the CPU that uploads leave idle: a thread of the upload's
//! path that wakes up takes the core from it at once (nice 19 is not enough: the scheduler lets
//! a nice thread finish its time slice first, and on 2 cores that cost tiny uploads a fifth of
//! their rate, `docs/benchmarks.md`). On a node busy with uploads it waits; on an idle one it
//! runs at full speed.
//!
//! Only the CPU work runs there (decoding stored tensors and hashing them); the store and the
//! catalog are read and written at normal priority by the worker, since a low-priority thread
//! holding one of their locks would hold up the uploads waiting for it.

use std::sync::mpsc;

use ndpipe_catalog::PhotoId;
use ndpipe_model::TensorBlob;
use thread_priority::{
    NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
    set_thread_priority_and_policy, thread_native_id,
};
use tokio::sync::oneshot;
use tracing::warn;

use super::phash::NearHash;

/// A batch of stored tensors to hash, and where the hashes go.
struct Job {
    blobs: Vec<(PhotoId, Vec<u8>)>,
    reply: oneshot::Sender<Hashed>,
}

/// What a batch came to.
#[derive(Debug, Default)]
pub(crate) struct Hashed {
    /// The hash of each tensor that decoded to an RGB image.
    pub(crate) rows: Vec<(PhotoId, u64)>,
    /// The others, each with why.
    pub(crate) failed: Vec<(PhotoId, String)>,
}

/// Why a batch was not hashed.
#[derive(Debug, thiserror::Error)]
#[error("the hashing thread is gone")]
pub(crate) struct ThreadGone;

/// The hashing thread; it ends when this is dropped.
pub(crate) struct IdleHasher {
    jobs: mpsc::Sender<Job>,
}

impl IdleHasher {
    /// Starts the thread, hashing by `algorithm`.
    pub(crate) fn start(algorithm: NearHash) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ndpipe-phash".into())
            .spawn(move || {
                lower_priority();
                let hasher = algorithm.hasher();
                for job in queue {
                    let mut out = Hashed::default();
                    for (id, blob) in job.blobs {
                        match TensorBlob::decode(&blob) {
                            Ok(t) => match hasher.hash_tensor(&t) {
                                Some(hash) => out.rows.push((id, hash)),
                                None => out.failed.push((id, "not an RGB tensor".into())),
                            },
                            Err(e) => out.failed.push((id, e.to_string())),
                        }
                    }
                    // The worker may have stopped waiting (the node is stopping): nothing to do.
                    let _ = job.reply.send(out);
                }
            })?;
        Ok(IdleHasher { jobs })
    }

    /// Hashes the stored tensors `blobs` (id, encoded tensor).
    pub(crate) async fn hash(&self, blobs: Vec<(PhotoId, Vec<u8>)>) -> Result<Hashed, ThreadGone> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { blobs, reply })
            .map_err(|_| ThreadGone)?;
        answer.await.map_err(|_| ThreadGone)
    }
}

/// Puts the calling thread under the idle scheduling policy. A failure is logged: hashing then
/// competes with uploads for the CPU.
fn lower_priority() {
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    if let Err(e) = set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle) {
        warn!(error = ?e, "cannot put the hashing thread under the idle policy; it competes with uploads for the CPU");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndpipe_model::{Codec, ImageTensor};

    #[tokio::test]
    async fn hashes_what_decodes_and_says_why_the_rest_did_not() {
        let hasher = IdleHasher::start(NearHash::Phash).unwrap();
        let rgb = ImageTensor::new(32, 32, 3, (0..32 * 32 * 3).map(|i| i as u8).collect()).unwrap();
        let grey = ImageTensor::new(8, 8, 1, vec![7; 64]).unwrap();
        let blob = |t: &ImageTensor| TensorBlob::encode(t, Codec::Zstd { level: 1 }).unwrap();
        let out = hasher
            .hash(vec![
                (1, blob(&rgb)),
                (2, blob(&grey)),
                (3, b"not a tensor".to_vec()),
            ])
            .await
            .unwrap();
        let expected = NearHash::Phash.hasher().hash_tensor(&rgb).unwrap();
        assert_eq!(out.rows, [(1, expected)]);
        let failed: Vec<PhotoId> = out.failed.iter().map(|(id, _)| *id).collect();
        assert_eq!(failed, [2, 3]);
    }
}
