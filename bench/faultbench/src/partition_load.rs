//! The requests of a partition round: uploads, reads and deletes through random front doors,
//! each timed against its deadline, and the ledger of what was acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::crash::photo;

/// A request that has no answer after this long is a hang (every deadline of the cluster is
/// far shorter).
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(30);

/// The kinds of request.
pub(crate) const KINDS: [&str; 3] = ["upload", "read", "delete"];

/// What was acknowledged so far.
#[derive(Default, Clone)]
pub(crate) struct Ledger {
    /// Acknowledged photos not deleted since: id to sha256.
    pub(crate) present: HashMap<u64, String>,
    /// Photos whose delete was acknowledged.
    pub(crate) deleted: Vec<u64>,
    /// Photos acknowledged in the current round.
    pub(crate) fresh: Vec<u64>,
    /// Photos deleted in the current round.
    pub(crate) fresh_deleted: Vec<u64>,
}

/// The requests of one kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestStats {
    /// Requests sent.
    pub sent: usize,
    /// Answered 2xx.
    pub ok: usize,
    /// Answered with another status (a refusal: 503 during a cut, for instance).
    pub refused: usize,
    /// Failed without an answer before the hang guard (a connection error).
    pub unanswered: usize,
    /// No answer within the hang guard (target 0).
    pub hangs: usize,
    /// Answered after the kind's deadline (target 0).
    pub late: usize,
    /// Answered 200 with bytes other than those uploaded (reads; target 0).
    pub wrong_bytes: usize,
    /// The slowest answer, in ms.
    pub max_ms: u64,
    /// The kind's deadline, in ms.
    pub deadline_ms: u64,
}

impl RequestStats {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &RequestStats) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.refused += other.refused;
        self.unanswered += other.unanswered;
        self.hangs += other.hangs;
        self.late += other.late;
        self.wrong_bytes += other.wrong_bytes;
        self.max_ms = self.max_ms.max(other.max_ms);
        self.deadline_ms = other.deadline_ms;
    }
}

/// The requests running in the background of a round.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<BTreeMap<String, RequestStats>>>,
    workers: Vec<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An agent whose requests give up after the hang guard, and see every status.
pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(HANG_GUARD))
        .http_status_as_error(false)
        .build()
        .into()
}

impl Load {
    /// Starts `workers` threads sending requests through `doors` until [`Load::finish`],
    /// recording acknowledgements in `ledger`; `deadlines` are those of [`KINDS`], in ms.
    pub(crate) fn start(
        doors: &[String],
        deadlines: [u64; 3],
        ledger: &Arc<Mutex<Ledger>>,
        workers: usize,
        seed: u64,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(
            KINDS
                .iter()
                .zip(deadlines)
                .map(|(k, d)| {
                    let stats = RequestStats {
                        deadline_ms: d,
                        ..RequestStats::default()
                    };
                    (k.to_string(), stats)
                })
                .collect(),
        ));
        let workers = (0..workers)
            .map(|w| {
                let worker = Worker {
                    agent: agent(),
                    doors: doors.to_vec(),
                    ledger: ledger.clone(),
                    stats: stats.clone(),
                    rng: rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (w as u64) << 32),
                };
                let stop = stop.clone();
                std::thread::spawn(move || worker.run(&stop))
            })
            .collect();
        Load {
            stop,
            stats,
            workers,
        }
    }

    /// Stops the requests (each in flight ends first) and returns their figures by kind.
    pub(crate) fn finish(self) -> BTreeMap<String, RequestStats> {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            let _ = w.join();
        }
        lock(&self.stats).clone()
    }
}

struct Worker {
    agent: ureq::Agent,
    doors: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
    stats: Arc<Mutex<BTreeMap<String, RequestStats>>>,
    rng: rand_pcg::Pcg64Mcg,
}

/// How a request ended: a status, no answer, or no answer within the hang guard.
enum Answer {
    Status(u16, Vec<u8>),
    Unanswered,
    Hang,
}

impl Worker {
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let door = self.doors[self.rng.random_range(0..self.doors.len())].clone();
            let target = {
                let ledger = lock(&self.ledger);
                let n = ledger.present.len();
                (n > 0).then(|| {
                    let (id, sha) = ledger
                        .present
                        .iter()
                        .nth(self.rng.random_range(0..n))
                        .expect("a present photo");
                    (*id, sha.clone())
                })
            };
            match (self.rng.random_range(0..20), target) {
                (0..=11, _) | (_, None) => self.upload(&door),
                (12..=16, Some((id, sha))) => self.read(&door, id, &sha),
                (_, Some((id, sha))) => self.delete(&door, id, sha),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends one request of `kind`, records its figures, and returns its answer.
    fn timed(
        &self,
        kind: &str,
        send: impl FnOnce() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Answer {
        let started = Instant::now();
        let answer = match send() {
            Ok(mut resp) => {
                let body = resp.body_mut().read_to_vec().unwrap_or_default();
                Answer::Status(resp.status().as_u16(), body)
            }
            Err(ureq::Error::Timeout(_)) => Answer::Hang,
            Err(_) => Answer::Unanswered,
        };
        let ms = started.elapsed().as_millis() as u64;
        let mut stats = lock(&self.stats);
        let s = stats.entry(kind.to_string()).or_default();
        s.sent += 1;
        match &answer {
            Answer::Status(status, _) => {
                if (200..300).contains(status) {
                    s.ok += 1;
                } else {
                    s.refused += 1;
                }
                s.max_ms = s.max_ms.max(ms);
                if ms > s.deadline_ms {
                    s.late += 1;
                }
            }
            Answer::Unanswered => s.unanswered += 1,
            Answer::Hang => s.hangs += 1,
        }
        answer
    }

    fn upload(&mut self, door: &str) {
        let bytes = photo(self.rng.random());
        let sha = hex::encode(Sha256::digest(&bytes));
        let answer = self.timed("upload", || {
            self.agent
                .post(format!("{door}/v1/photos"))
                .header("content-type", "image/png")
                .send(&bytes[..])
        });
        if let Answer::Status(201, body) = answer {
            let reply: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if let Some(id) = reply["id"].as_u64() {
                let mut ledger = lock(&self.ledger);
                ledger.present.insert(id, sha);
                ledger.fresh.push(id);
            }
        }
    }

    fn read(&mut self, door: &str, id: u64, sha: &str) {
        let answer = self.timed("read", || {
            self.agent.get(format!("{door}/v1/photos/{id}")).call()
        });
        if let Answer::Status(200, bytes) = answer
            && hex::encode(Sha256::digest(&bytes)) != sha
        {
            lock(&self.stats)
                .entry("read".into())
                .or_default()
                .wrong_bytes += 1;
        }
    }

    fn delete(&mut self, door: &str, id: u64, sha: String) {
        // Out of the ledger first: while its delete is in flight, the photo is in neither list.
        if lock(&self.ledger).present.remove(&id).is_none() {
            return;
        }
        let answer = self.timed("delete", || {
            self.agent.delete(format!("{door}/v1/photos/{id}")).call()
        });
        let mut ledger = lock(&self.ledger);
        match answer {
            Answer::Status(204, _) => {
                ledger.deleted.push(id);
                ledger.fresh_deleted.push(id);
            }
            // Refused as a client error: nothing changed, the photo must still read back.
            Answer::Status(400..=499, _) => {
                ledger.present.insert(id, sha);
            }
            // A server error or no answer: it may or may not be deleted; neither is checked.
            _ => {}
        }
    }
}
