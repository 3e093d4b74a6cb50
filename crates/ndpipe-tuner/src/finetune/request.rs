//! What a fine-tuning job is asked to do: the body of `POST /v1/tuner/finetune`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use ndpipe_catalog::TaskName;
use serde::{Deserialize, Serialize};
use spidercache::PolicyKind;

use crate::TunerError;

/// The default [`FinetuneRequest::memory_budget_bytes`]: 2 GiB of training features (about
/// 420,000 photos of 1280-d f32 features); above it, training reads through the cache.
pub const DEFAULT_MEMORY_BUDGET: u64 = 2 << 30;

/// What a fine-tuning job is asked to do. Every field has a default (NDPipe's settings), so `{}`
/// is a valid request; unknown fields, modes and policies are refused when the JSON is parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinetuneRequest {
    /// Pipelined runs (NDPipe's `num_of_run`), at least 1. Default 2.
    pub runs: u32,
    /// Epochs per run. Default 30.
    pub epochs: usize,
    /// Training batch size. Default 1024.
    pub batch: usize,
    /// Validation split. Default [`ValSplit::Auto`].
    pub val_split: ValSplit,
    /// Re-use stored features when the backbone is unchanged. Default true.
    pub use_stored_features: bool,
    /// Width of an optional hidden layer (not deployable in this version of the protocol).
    pub hidden: Option<usize>,
    /// Seed of initialisation and shuffling. Default 0.
    pub seed: u64,
    /// Train a new head from scratch on every labelled photo instead of fine-tuning the active
    /// version's (full retraining of the head). Default false.
    pub from_scratch: bool,
    /// Photos per feature chunk on the wire. Default 256.
    pub chunk_size: u32,
    /// Run boundaries are aligned to this many photos (the nodes' batch size). Default 32.
    pub align: u32,
    /// Deploy the new version to every node and re-label the stores when training is done.
    /// Default true.
    pub deploy: bool,
    /// Per-node throttle in images/s, by node name (for load-balancing experiments).
    pub throttle: BTreeMap<String, f64>,
    /// Where the backbone runs. Default [`Mode::NearData`].
    pub mode: Mode,
    /// Cap on each node's sending rate, bytes/s (0: none): a stand-in for a slower network.
    pub bandwidth_bytes_per_second: f64,
    /// Cap on what the Tuner receives from all nodes together, bytes/s (0: none): a stand-in
    /// for the Tuner's own link, which near-data and conventional jobs share differently.
    pub ingress_bytes_per_second: f64,
    /// Once every node has sent its validation set, move work from slow nodes to fast ones in
    /// proportion to their measured throughput (the fast node fetches the slow node's tensors).
    /// Default true.
    pub load_balance: bool,
    /// Bytes of training features the Tuner may hold (0: no limit). When the job's features
    /// exceed it, training reads them through `cache_policy`, fetching misses from the nodes.
    /// Default [`DEFAULT_MEMORY_BUDGET`], so that a large store cannot run the Tuner out of
    /// memory (10^6 photos of 1280-d f32 features are 5.1 GB).
    pub memory_budget_bytes: u64,
    /// The cache used over the memory budget. Default [`CachePolicy::SpiderCache`].
    pub cache_policy: CachePolicy,
    /// The task to train: its ground truth labels the photos, and the new version becomes its
    /// candidate (`general`, the backbone's own classifier, never trains). Default `default`.
    pub task: TaskName,
    /// Deploy even when the new version's validation top-1 is more than the margin below its
    /// parent's on the same photos. Default false: such a version stays a candidate.
    pub force: bool,
    /// How far (a share, 0.01 = one point) the new version's validation top-1 may fall below
    /// its parent's and still deploy; default: the Tuner's `deploy_margin`.
    pub deploy_margin: Option<f32>,
    /// The least probability of a label the new head keeps: a photo whose best class is under
    /// it is `other`. Default 0.5.
    pub floor: f32,
    /// The novelty check (calibrated rejection): the share of validation photos it keeps in
    /// the task; photos less like the training photos than all but that share are `other`.
    /// 0 turns it off. Default 0.99.
    pub novelty_quantile: f32,
}

impl Default for FinetuneRequest {
    fn default() -> Self {
        FinetuneRequest {
            runs: 2,
            epochs: 30,
            batch: 1024,
            val_split: ValSplit::Auto,
            use_stored_features: true,
            hidden: None,
            seed: 0,
            from_scratch: false,
            chunk_size: 256,
            align: 32,
            deploy: true,
            throttle: BTreeMap::new(),
            mode: Mode::NearData,
            bandwidth_bytes_per_second: 0.0,
            ingress_bytes_per_second: 0.0,
            load_balance: true,
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET,
            cache_policy: CachePolicy::SpiderCache,
            task: TaskName::default_task(),
            force: false,
            deploy_margin: None,
            floor: 0.5,
            novelty_quantile: 0.99,
        }
    }
}

impl FinetuneRequest {
    /// Refuses what no job can do: no run, too many, a task that is not trainable, label rules
    /// that are not probabilities.
    pub(crate) fn check(&self) -> Result<(), TunerError> {
        if self.runs == 0 || self.runs as usize > ndpipe_proto::MAX_RUNS {
            return Err(TunerError::InvalidArgument(format!(
                "runs must be 1 to {}",
                ndpipe_proto::MAX_RUNS
            )));
        }
        if self.task.is_general() {
            return Err(TunerError::InvalidArgument(
                "the general task is the backbone's own classifier and never trains: name a task of your own".into(),
            ));
        }
        let probability = |name: &str, v: f32| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(TunerError::InvalidArgument(format!(
                    "{name} must be in [0, 1], not {v}"
                )))
            }
        };
        probability("floor", self.floor)?;
        probability("novelty_quantile", self.novelty_quantile)?;
        if let Some(margin) = self.deploy_margin {
            probability("deploy_margin", margin)?;
        }
        Ok(())
    }
}

/// Where the backbone runs during a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// NDPipe: the PipeStores run the backbone and send features (`"near-data"`; `""` too).
    #[default]
    #[serde(rename = "near-data", alias = "")]
    NearData,
    /// For comparison: the PipeStores send preprocessed tensors and the Tuner runs the backbone
    /// (`"conventional"`; the Tuner needs its own backbone).
    #[serde(rename = "conventional")]
    Conventional,
}

/// The training-data cache used when a job's features exceed the Tuner's memory budget; the
/// names are those of the `spidercache` crate's policies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CachePolicy {
    /// SpiderCache (`"spidercache"`).
    #[default]
    #[serde(rename = "spidercache")]
    SpiderCache,
    /// SHADE (`"shade"`).
    #[serde(rename = "shade")]
    Shade,
    /// iCache (`"icache"`).
    #[serde(rename = "icache")]
    ICache,
    /// Quiver (`"quiver"`).
    #[serde(rename = "quiver")]
    Quiver,
    /// Uniform sampling, LRU (`"lru"`).
    #[serde(rename = "lru")]
    Lru,
    /// Uniform sampling, LFU (`"lfu"`).
    #[serde(rename = "lfu")]
    Lfu,
    /// Uniform sampling, filled once, never evicted (CoorDL; `"static"`).
    #[serde(rename = "static")]
    Static,
    /// Uniform sampling, no cache (`"nocache"`).
    #[serde(rename = "nocache")]
    NoCache,
}

/// Which labelled photos validate the head after every run. The `test` split never does: it
/// is kept for reporting, and never steers training or a cache policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValSplit {
    /// `"val"` when any node has such photos, else `"carve"` (written `""`).
    #[default]
    #[serde(rename = "")]
    Auto,
    /// The `"val"` split.
    #[serde(rename = "val")]
    Val,
    /// A tenth of the training photos, chosen by a hash of the photo id (the same photos in
    /// every job), validate; the rest train.
    #[serde(rename = "carve")]
    Carve,
}

impl Mode {
    /// The name in requests.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::NearData => "near-data",
            Mode::Conventional => "conventional",
        }
    }
}

impl CachePolicy {
    /// Every policy, in the order of the `spidercache` crate's tables.
    pub const ALL: [CachePolicy; 8] = [
        CachePolicy::NoCache,
        CachePolicy::Lru,
        CachePolicy::Lfu,
        CachePolicy::Static,
        CachePolicy::Shade,
        CachePolicy::ICache,
        CachePolicy::Quiver,
        CachePolicy::SpiderCache,
    ];

    /// The name in requests and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            CachePolicy::SpiderCache => "spidercache",
            CachePolicy::Shade => "shade",
            CachePolicy::ICache => "icache",
            CachePolicy::Quiver => "quiver",
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
            CachePolicy::Static => "static",
            CachePolicy::NoCache => "nocache",
        }
    }

    /// The policy with its default settings.
    pub(crate) fn kind(self) -> PolicyKind {
        match self {
            CachePolicy::SpiderCache => PolicyKind::Spider(Default::default()),
            CachePolicy::Shade => PolicyKind::Shade(Default::default()),
            CachePolicy::ICache => PolicyKind::ICache(Default::default()),
            CachePolicy::Quiver => PolicyKind::Quiver(Default::default()),
            CachePolicy::Lru => PolicyKind::Lru,
            CachePolicy::Lfu => PolicyKind::Lfu,
            CachePolicy::Static => PolicyKind::Static,
            CachePolicy::NoCache => PolicyKind::NoCache,
        }
    }
}

impl ValSplit {
    /// The name in requests (`""` for [`ValSplit::Auto`]).
    pub fn as_str(self) -> &'static str {
        match self {
            ValSplit::Auto => "",
            ValSplit::Val => "val",
            ValSplit::Carve => "carve",
        }
    }
}

fn unknown(what: &str, name: &str, known: &[&str]) -> TunerError {
    TunerError::InvalidArgument(format!(
        "unknown {what} {name:?}: use one of {}",
        known.join(", ")
    ))
}

impl FromStr for Mode {
    type Err = TunerError;

    /// Parses a name as the JSON body does (`""` is [`Mode::NearData`]).
    fn from_str(s: &str) -> Result<Self, TunerError> {
        match s {
            "near-data" | "" => Ok(Mode::NearData),
            "conventional" => Ok(Mode::Conventional),
            other => Err(unknown("mode", other, &["near-data", "conventional"])),
        }
    }
}

impl FromStr for CachePolicy {
    type Err = TunerError;

    /// Parses a name as the JSON body does.
    fn from_str(s: &str) -> Result<Self, TunerError> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names = CachePolicy::ALL.map(CachePolicy::as_str);
                unknown("cache policy", s, &names)
            })
    }
}

impl FromStr for ValSplit {
    type Err = TunerError;

    /// Parses a name as the JSON body does (`""` is [`ValSplit::Auto`]).
    fn from_str(s: &str) -> Result<Self, TunerError> {
        match s {
            "" => Ok(ValSplit::Auto),
            "val" => Ok(ValSplit::Val),
            "carve" => Ok(ValSplit::Carve),
            "test" => Err(TunerError::InvalidArgument(
                "the test split never validates: use \"val\", or \"carve\" to validate on a \
                 tenth of the training photos"
                    .into(),
            )),
            other => Err(unknown("validation split", other, &["val", "carve"])),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ValSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<FinetuneRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn an_empty_request_has_ndpipes_defaults() {
        let req = parse("{}").unwrap();
        assert_eq!(req, FinetuneRequest::default());
        assert_eq!((req.runs, req.epochs, req.batch), (2, 30, 1024));
        assert_eq!((req.chunk_size, req.align), (256, 32));
        assert!(req.deploy && req.load_balance && req.use_stored_features);
        assert_eq!(req.mode, Mode::NearData);
        assert_eq!(req.cache_policy, CachePolicy::SpiderCache);
        assert_eq!(req.val_split, ValSplit::Auto);
    }

    #[test]
    fn todays_strings_parse_into_the_enums() {
        let req = parse(r#"{"mode": "", "val_split": "", "cache_policy": "lfu"}"#).unwrap();
        assert_eq!(
            (req.mode, req.val_split, req.cache_policy),
            (Mode::NearData, ValSplit::Auto, CachePolicy::Lfu)
        );
        let req = parse(r#"{"mode": "conventional", "val_split": "carve"}"#).unwrap();
        assert_eq!(
            (req.mode, req.val_split),
            (Mode::Conventional, ValSplit::Carve)
        );
        assert!(
            parse(r#"{"val_split": "test"}"#).is_err(),
            "test never validates"
        );
        assert!(
            matches!("test".parse::<ValSplit>(), Err(TunerError::InvalidArgument(m)) if m.contains("never validates"))
        );
        assert_eq!(
            parse(r#"{"mode": "near-data"}"#).unwrap().mode,
            Mode::NearData
        );
        for policy in CachePolicy::ALL {
            let json = format!(r#"{{"cache_policy": "{policy}"}}"#);
            assert_eq!(parse(&json).unwrap().cache_policy, policy);
            assert_eq!(policy.as_str().parse::<CachePolicy>().unwrap(), policy);
        }
    }

    #[test]
    fn unknown_names_and_fields_are_refused_when_parsed() {
        assert!(parse(r#"{"cache_policy": "fifo"}"#).is_err());
        assert!(parse(r#"{"mode": "far-data"}"#).is_err());
        assert!(parse(r#"{"val_split": "train"}"#).is_err());
        assert!(parse(r#"{"epochz": 3}"#).is_err());
        assert!(matches!(
            "fifo".parse::<CachePolicy>(),
            Err(TunerError::InvalidArgument(m)) if m.contains("spidercache")
        ));
        assert_eq!("".parse::<Mode>().unwrap(), Mode::NearData);
        assert_eq!("".parse::<ValSplit>().unwrap(), ValSplit::Auto);
        assert!("train".parse::<ValSplit>().is_err());
    }

    #[test]
    fn requests_round_trip_with_todays_names() {
        let req = FinetuneRequest {
            mode: Mode::Conventional,
            cache_policy: CachePolicy::NoCache,
            ..FinetuneRequest::default()
        };
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(json["mode"], "conventional");
        assert_eq!(json["cache_policy"], "nocache");
        assert_eq!(json["val_split"], "");
        assert_eq!(
            serde_json::from_value::<FinetuneRequest>(json).unwrap(),
            req
        );
    }
}
