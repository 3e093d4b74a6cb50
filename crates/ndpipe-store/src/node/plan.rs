//! A job's extraction plan: which photos go into the validation part and each training run,
//! fixed when extraction starts so that any chunk can be sent again, and the tails of the runs
//! that load balancing may give to a faster node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ndpipe_catalog::{Catalog, Split, TaskName};
use ndpipe_proto::{RunPlan, pb};
use ndpipe_util::sync::lock;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use super::NodeError;
use super::carve::CarveGroups;
use super::pace::Pace;
use crate::duplicates::DuplicateSettings;

/// A labelled photo as extraction sees it: (photo id, class index in the job's class list).
pub(super) type Row = (u64, u32);

/// Share of the training photos, in percent, that validate instead when no photo has the `val`
/// split.
const CARVED_PERCENT: u64 = 10;

/// Whether a training photo is carved out for validation: decided by a hash of its bytes' SHA-256
/// (hex) alone, so a photo is on the same side in every job and on every node, no version
/// trains on a photo another validates on, and copies of the same bytes (a photo uploaded
/// twice) are on the same side.
pub(crate) fn carved_for_validation(sha256: &str) -> bool {
    let key = sha256.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut h = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (h ^ (h >> 31)) % 100 < CARVED_PERCENT
}

/// A job's photos, split into parts and runs, and where extraction of each run stands.
pub(super) struct ExtractionPlan {
    pub(super) val: Vec<Row>,
    pub(super) train: Vec<Row>,
    pub(super) plan: RunPlan,
    pub(super) chunk_size: usize,
    pub(super) ship_tensors: bool,
    pub(super) use_stored: bool,
    /// The backbone whose features to send, when not the one served (a rollout's staged one).
    pub(super) backbone: Option<String>,
    /// The job's throttle and bandwidth cap on this node, shared by its extraction and any
    /// take-over it runs for the job.
    pub(super) pace: Arc<Pace>,
    /// Per training run, (next row to extract, rows it keeps): load balancing may lower the
    /// limit while extraction runs, giving the tail to a faster node.
    runs: Mutex<Vec<(usize, usize)>>,
}

impl ExtractionPlan {
    /// Plans a job from its request: the photos labelled for its task with the requested
    /// classes, training photos shuffled (seeded by the job id) and cut into runs. Duplicates
    /// (exact and near, by `duplicates`) stay on one side of the validation line
    /// ([`CarveGroups`]).
    pub(super) fn new(
        req: &pb::ExtractRequest,
        catalog: &dyn Catalog,
        duplicates: &DuplicateSettings,
    ) -> Result<Self, NodeError> {
        if req.runs == 0 || req.align == 0 || req.chunk_size == 0 {
            return Err(NodeError::InvalidArgument(
                "runs, align and chunk_size must be at least 1".into(),
            ));
        }
        let index: HashMap<&str, u32> = req
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i as u32))
            .collect();
        let carve = match req.val_split.as_str() {
            "val" => false,
            "carve" => true,
            other => {
                return Err(NodeError::InvalidArgument(format!(
                    "validation split {other:?}: use \"val\" or \"carve\" (the test split never validates)"
                )));
            }
        };
        let task: TaskName = match req.task.as_str() {
            "" => TaskName::default_task(),
            name => name.parse().map_err(|e: ndpipe_catalog::CatalogError| {
                NodeError::InvalidArgument(e.to_string())
            })?,
        };
        // One read of the catalog, so that a split changed meanwhile cannot put a photo in both.
        let truths = catalog.ground_truths(&task)?;
        let groups = CarveGroups::of(catalog, duplicates, &truths)?;
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for truth in &truths {
            let Some(&class) = index.get(truth.label.as_str()) else {
                continue;
            };
            let id = truth.id;
            match truth.split {
                Split::Train if carve && carved_for_validation(groups.key(truth)) => {
                    val.push((id, class));
                }
                Split::Train if groups.held_out(id) => {}
                Split::Train => train.push((id, class)),
                Split::Val if !carve => val.push((id, class)),
                Split::Val | Split::Test => {}
            }
        }
        // Runs are contiguous chunks, so the training photos are shuffled first (seeded by the
        // job): in id order, a run would hold only the photos of one arrival period.
        let seed = req.job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        train.shuffle(&mut rand_pcg::Pcg64Mcg::seed_from_u64(seed));
        val.sort_unstable();
        let plan = RunPlan::new(train.len(), req.runs as usize, req.align as usize)
            .map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        let mut planned = Self::from_parts(
            val,
            train,
            plan,
            req.chunk_size as usize,
            (req.ship_tensors, req.use_stored_features),
            Pace::new(
                req.throttle_images_per_second,
                req.bandwidth_bytes_per_second,
            ),
        );
        planned.backbone = Some(req.backbone_version.clone()).filter(|b| !b.is_empty());
        Ok(planned)
    }

    /// A plan of these rows; `mode` is (ship tensors, use stored features).
    fn from_parts(
        val: Vec<Row>,
        train: Vec<Row>,
        plan: RunPlan,
        chunk_size: usize,
        (ship_tensors, use_stored): (bool, bool),
        pace: Pace,
    ) -> Self {
        let runs = (0..plan.runs())
            .map(|k| (0, plan.chunk(k).map_or(0, |r| r.len())))
            .collect();
        ExtractionPlan {
            val,
            train,
            plan,
            chunk_size,
            ship_tensors,
            use_stored,
            backbone: None,
            pace: Arc::new(pace),
            runs: Mutex::new(runs),
        }
    }

    /// All rows of training run `run`, the tail given away included.
    fn run_rows(&self, run: usize) -> &[Row] {
        self.plan.chunk(run).map_or(&[][..], |r| &self.train[r])
    }

    /// All rows of a part and run (a training run without the tail given away).
    pub(super) fn rows(&self, part: pb::Part, run: u32) -> &[Row] {
        match part {
            pb::Part::Train => {
                let all = self.run_rows(run as usize);
                let limit = lock(&self.runs).get(run as usize).map_or(0, |r| r.1);
                &all[..limit.min(all.len())]
            }
            _ => &self.val,
        }
    }

    /// The next chunk to extract of a part and run, as (seq, rows); `cursor` tracks progress in
    /// the validation part, which cannot shrink.
    pub(super) fn take_chunk(
        &self,
        part: pb::Part,
        run: u32,
        cursor: &mut usize,
    ) -> Option<(u32, &[Row])> {
        let cs = self.chunk_size;
        if part == pb::Part::Train {
            let all = self.run_rows(run as usize);
            let mut runs = lock(&self.runs);
            let state = runs.get_mut(run as usize)?;
            let (start, limit) = *state;
            if start >= limit {
                return None;
            }
            let end = (start + cs).min(limit);
            state.0 = end;
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

    /// Gives up to `give` rows not yet extracted, from the tails of the runs, the latest run
    /// first (so the runs this node extracts next stay whole); returns (run, row) pairs in run
    /// order.
    pub(super) fn give(&self, give: usize) -> Vec<(u32, Row)> {
        let mut runs = lock(&self.runs);
        let mut left = give;
        let mut given = Vec::new();
        for (k, (next, limit)) in runs.iter_mut().enumerate().rev() {
            if left == 0 {
                break;
            }
            let new_limit = limit.saturating_sub(left).max(*next);
            let all = self.run_rows(k);
            given.push(
                all[new_limit..*limit]
                    .iter()
                    .map(|r| (k as u32, *r))
                    .collect::<Vec<_>>(),
            );
            left -= *limit - new_limit;
            *limit = new_limit;
        }
        given.into_iter().rev().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use ndpipe_catalog::PhotoCatalog;

    use super::*;

    /// 2 validation rows and 10 training rows in 2 runs of 5 (align 1), chunks of 2.
    fn plan() -> ExtractionPlan {
        let train: Vec<Row> = (1..=10).map(|id| (id, 0)).collect();
        let runs = RunPlan::new(train.len(), 2, 1).unwrap();
        let pace = Pace::new(0.0, 0.0);
        ExtractionPlan::from_parts(
            vec![(100, 1), (101, 1)],
            train,
            runs,
            2,
            (false, true),
            pace,
        )
    }

    fn drain(plan: &ExtractionPlan, part: pb::Part, run: u32) -> Vec<(u32, Vec<u64>)> {
        let mut cursor = 0;
        let mut out = Vec::new();
        while let Some((seq, rows)) = plan.take_chunk(part, run, &mut cursor) {
            out.push((seq, rows.iter().map(|r| r.0).collect()));
        }
        out
    }

    #[test]
    fn chunks_cover_each_part_and_run_once_in_order() {
        let p = plan();
        assert_eq!(drain(&p, pb::Part::Val, 0), vec![(0, vec![100, 101])]);
        let first: Vec<u64> = drain(&p, pb::Part::Train, 0)
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .collect();
        let last = drain(&p, pb::Part::Train, 1);
        assert_eq!(
            last.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![0, 1, 2],
            "seq numbers count chunks"
        );
        let mut all: Vec<u64> = first
            .into_iter()
            .chain(last.into_iter().flat_map(|(_, ids)| ids))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (1..=10).collect::<Vec<_>>());
        assert!(
            drain(&p, pb::Part::Train, 1).is_empty(),
            "the last run is taken once"
        );
    }

    #[test]
    fn the_tails_given_away_are_never_extracted_here() {
        let p = plan();
        let mut cursor = 0;
        let (seq, rows) = p.take_chunk(pb::Part::Train, 0, &mut cursor).unwrap();
        assert_eq!((seq, rows.len()), (0, 2));
        let taken: Vec<Row> = rows.to_vec();
        // The last run's tail goes first; a small give leaves run 0 whole.
        let given = p.give(2);
        assert_eq!(given.iter().map(|g| g.0).collect::<Vec<_>>(), [1, 1]);
        assert_eq!(p.rows(pb::Part::Train, 0).len(), 5);
        // Asking for more than is left gives every row not yet extracted, from both runs, in
        // run order.
        let more = p.give(100);
        assert_eq!(
            more.len(),
            3 + 3,
            "run 1's other 3, and run 0's 3 not taken"
        );
        assert_eq!(
            more.iter().map(|g| g.0).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1, 1]
        );
        assert!(more.iter().chain(&given).all(|(_, r)| !taken.contains(r)));
        assert!(p.take_chunk(pb::Part::Train, 0, &mut cursor).is_none());
        assert!(drain(&p, pb::Part::Train, 1).is_empty());
        assert_eq!(p.rows(pb::Part::Train, 0), &taken[..]);
        assert!(p.rows(pb::Part::Train, 1).is_empty());
        assert!(p.give(1).is_empty());
        let mut all: Vec<u64> = taken
            .iter()
            .chain(more.iter().chain(&given).map(|g| &g.1))
            .map(|r| r.0)
            .collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (1..=10).collect::<Vec<_>>(),
            "every row once, here or given"
        );
    }

    fn request(val_split: &str) -> pb::ExtractRequest {
        pb::ExtractRequest {
            job_id: "j".into(),
            runs: 1,
            align: 1,
            classes: vec!["cat".into(), "dog".into()],
            chunk_size: 8,
            val_split: val_split.into(),
            ..pb::ExtractRequest::default()
        }
    }

    #[test]
    fn copies_of_the_same_bytes_are_carved_alike() {
        let c = catalog();
        // Photo 2000 is a second upload of photo 7's bytes.
        let mut copy = ndpipe_catalog::test_suite::photo(2000, Some(("cat", Split::Train)));
        copy.meta.sha256 = format!("{:064x}", 7);
        c.upsert_photo(&copy).unwrap();
        let carved =
            ExtractionPlan::new(&request("carve"), &c, &DuplicateSettings::default()).unwrap();
        let side = |id: u64| carved.val.iter().any(|r| r.0 == id);
        assert_eq!(side(7), side(2000));
        let other_task = pb::ExtractRequest {
            task: "fashion".into(),
            ..request("carve")
        };
        assert!(
            ExtractionPlan::new(&other_task, &c, &DuplicateSettings::default())
                .is_ok_and(|p| p.train.is_empty() && p.val.is_empty()),
            "another task's ground truth is its own"
        );
    }

    #[test]
    fn near_copies_are_carved_alike_and_never_train_against_their_validation_copy() {
        use ndpipe_catalog::DuplicateCatalog;
        let c = catalog();
        let settings = DuplicateSettings::default();
        let alg = settings.near_hash.name();
        // 3 and 2001 are near copies (hashes 1 bit apart); so are 4 and 1001 (a `val` photo),
        // and 5 and 1021 (a `test` photo). Every other photo has a hash far from these.
        let copy = ndpipe_catalog::test_suite::photo(2001, Some(("cat", Split::Train)));
        c.upsert_photo(&copy).unwrap();
        let far = |id: u64| id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut hashes: Vec<(u64, u64)> = (1..=1040).map(|id| (id, far(id))).collect();
        hashes.extend([
            (2001, 0),
            (1001, 0xffff_ffff_0000_0000),
            (1021, 0x0000_0000_ffff_ffff),
        ]);
        hashes[2] = (3, 1);
        hashes[3] = (4, 0xffff_ffff_0000_0001);
        hashes[4] = (5, 0x0000_0000_ffff_fffe);
        c.put_near_hashes(alg, &hashes).unwrap();

        let with_val = ExtractionPlan::new(&request("val"), &c, &settings).unwrap();
        let trains = |p: &ExtractionPlan, id: u64| p.train.iter().any(|r| r.0 == id);
        assert!(
            !trains(&with_val, 4),
            "a near copy of a val photo does not train"
        );
        assert!(!trains(&with_val, 5), "nor one of a test photo");
        assert!(trains(&with_val, 3) && trains(&with_val, 2001));

        let carved = ExtractionPlan::new(&request("carve"), &c, &settings).unwrap();
        let validates = |id: u64| carved.val.iter().any(|r| r.0 == id);
        assert_eq!(validates(3), validates(2001), "one key for the group");
        let key = format!("{:064x}", 3).min(format!("{:064x}", 2001));
        assert_eq!(validates(3), carved_for_validation(&key));
    }

    /// A catalog of 1000 training photos (cat), 20 `val` (dog) and 20 `test` (dog).
    fn catalog() -> ndpipe_catalog::SqliteCatalog {
        let c = ndpipe_catalog::SqliteCatalog::in_memory().unwrap();
        for id in 1..=1040u64 {
            let truth = match id {
                1..=1000 => ("cat", Split::Train),
                1001..=1020 => ("dog", Split::Val),
                _ => ("dog", Split::Test),
            };
            c.upsert_photo(&ndpipe_catalog::test_suite::photo(id, Some(truth)))
                .unwrap();
        }
        c
    }

    #[test]
    fn validation_is_val_or_carved_from_training_and_never_test() {
        let c = catalog();
        let with_val =
            ExtractionPlan::new(&request("val"), &c, &DuplicateSettings::default()).unwrap();
        let val_ids: Vec<u64> = with_val.val.iter().map(|r| r.0).collect();
        assert_eq!(val_ids, (1001..=1020).collect::<Vec<_>>());
        assert_eq!(with_val.train.len(), 1000);

        let carved =
            ExtractionPlan::new(&request("carve"), &c, &DuplicateSettings::default()).unwrap();
        let sha = |id: u64| format!("{id:064x}");
        assert!(
            carved
                .val
                .iter()
                .all(|r| r.0 <= 1000 && carved_for_validation(&sha(r.0)))
        );
        assert!(
            carved
                .train
                .iter()
                .all(|r| !carved_for_validation(&sha(r.0)))
        );
        assert_eq!(
            carved.val.len() + carved.train.len(),
            1000,
            "val and test stay out"
        );
        assert!(
            (60..=140).contains(&carved.val.len()),
            "about a tenth: {}",
            carved.val.len()
        );
        let again =
            ExtractionPlan::new(&request("carve"), &c, &DuplicateSettings::default()).unwrap();
        assert_eq!(again.val, carved.val, "the same photos every time");

        for bad in ["test", ""] {
            assert!(matches!(
                ExtractionPlan::new(&request(bad), &c, &DuplicateSettings::default()),
                Err(NodeError::InvalidArgument(m)) if m.contains("never validates")
            ));
        }
    }
}
