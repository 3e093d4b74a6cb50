//! A policy by name and a dict of settings, into a [`PolicyKind`].
//!
//! Each name maps to one of the crate's policies; each key to one field of its
//! config, starting from the crate's defaults (the authors' settings). A key
//! that the policy does not have is refused with the list of those it has, so
//! a typo never silently runs the defaults. Enum-valued settings (`radius`,
//! `split`, `scoring`, `score`) take a string, or a dict with `kind` and the
//! variant's fields.

use std::collections::BTreeSet;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use spidercache::{
    AdaptiveSplit, AnnConfig, HomophilyConfig, ICacheConfig, ImportanceSamplerConfig,
    MeasuredSplit, PolicyKind, QuiverConfig, Radius, ScoreVariant, ScoringMode, ShadeConfig,
    SpiderConfig, SplitPolicy,
};

/// The policy names `Policy` accepts, in the crate's table order.
#[pyfunction]
pub(crate) fn policy_names() -> Vec<&'static str> {
    vec![
        "nocache",
        "lru",
        "lfu",
        "static",
        "shade",
        "icache",
        "quiver",
        "spidercache",
    ]
}

/// The keys of one settings dict: read them one by one, then [`finish`](Self::finish)
/// refuses those nobody read.
struct Settings<'py> {
    what: String,
    dict: Option<Bound<'py, PyDict>>,
    known: BTreeSet<&'static str>,
}

impl<'py> Settings<'py> {
    fn new(what: impl Into<String>, dict: Option<Bound<'py, PyDict>>) -> Self {
        Self {
            what: what.into(),
            dict,
            known: BTreeSet::new(),
        }
    }

    /// The value under `key`, if given.
    fn get<T: FromPyObjectOwned<'py>>(&mut self, key: &'static str) -> PyResult<Option<T>> {
        self.known.insert(key);
        let Some(value) = self
            .dict
            .as_ref()
            .map(|d| d.get_item(key))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        value.extract::<T>().map(Some).map_err(|e| {
            let e: PyErr = e.into();
            PyValueError::new_err(format!("{} setting '{key}': {e}", self.what))
        })
    }

    /// The raw value under `key`, if given.
    fn raw(&mut self, key: &'static str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.known.insert(key);
        Ok(self
            .dict
            .as_ref()
            .map(|d| d.get_item(key))
            .transpose()?
            .flatten())
    }

    /// Overwrites `field` with the value under `key`, if given.
    fn set<T: FromPyObjectOwned<'py>>(&mut self, field: &mut T, key: &'static str) -> PyResult<()> {
        if let Some(v) = self.get(key)? {
            *field = v;
        }
        Ok(())
    }

    /// Fails on any key that was never read.
    fn finish(self) -> PyResult<()> {
        let Some(dict) = self.dict else {
            return Ok(());
        };
        for key in dict.keys() {
            let name: String = key.extract()?;
            if !self.known.contains(name.as_str()) {
                let known: Vec<_> = self.known.iter().copied().collect();
                return Err(PyValueError::new_err(format!(
                    "{} has no setting '{name}' (it has: {})",
                    self.what,
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }
}

/// A string `"kind"` or a dict `{"kind": ..., field: ...}`: its kind and its fields.
fn variant<'py>(what: &str, value: &Bound<'py, PyAny>) -> PyResult<(String, Settings<'py>)> {
    if value.is_instance_of::<PyString>() {
        return Ok((value.extract()?, Settings::new(what, None)));
    }
    let dict = value
        .cast::<PyDict>()
        .map_err(|_| PyValueError::new_err(format!("{what} must be a string or a dict")))?
        .copy()?;
    let kind = dict
        .get_item("kind")?
        .ok_or_else(|| PyValueError::new_err(format!("{what} needs a 'kind'")))?
        .extract::<String>()?;
    dict.del_item("kind")?;
    Ok((
        kind.clone(),
        Settings::new(format!("{what} '{kind}'"), Some(dict)),
    ))
}

fn unknown_kind(what: &str, kind: &str, kinds: &str) -> PyErr {
    PyValueError::new_err(format!("unknown {what} '{kind}' (one of: {kinds})"))
}

/// The policy called `name` with `settings` over its defaults.
pub(crate) fn policy_kind(name: &str, settings: Option<Bound<'_, PyDict>>) -> PyResult<PolicyKind> {
    let mut s = Settings::new(format!("policy '{name}'"), settings);
    let kind = match name {
        "nocache" => PolicyKind::NoCache,
        "lru" => PolicyKind::Lru,
        "lfu" => PolicyKind::Lfu,
        "static" => PolicyKind::Static,
        "shade" => PolicyKind::Shade(shade(&mut s)?),
        "icache" => PolicyKind::ICache(icache(&mut s)?),
        "quiver" => {
            let mut c = QuiverConfig::default();
            s.set(&mut c.probe_multiple, "probe_multiple")?;
            PolicyKind::Quiver(c)
        }
        "spidercache" | "spider" => PolicyKind::Spider(spider(&mut s)?),
        other => {
            return Err(unknown_kind("policy", other, &policy_names().join(", ")));
        }
    };
    s.finish()?;
    Ok(kind)
}

fn sampler(s: &mut Settings<'_>, c: &mut ImportanceSamplerConfig) -> PyResult<()> {
    s.set(&mut c.rep_factor, "rep_factor")?;
    s.set(&mut c.world_size, "world_size")?;
    s.set(&mut c.rank, "rank")?;
    s.set(&mut c.gate_window, "gate_window")?;
    s.set(&mut c.interleave_hits, "interleave_hits")
}

fn shade(s: &mut Settings<'_>) -> PyResult<ShadeConfig> {
    let mut c = ShadeConfig::default();
    sampler(s, &mut c.sampler)?;
    s.set(&mut c.initial_weight, "initial_weight")?;
    s.set(&mut c.rank_offset, "rank_offset")?;
    s.set(&mut c.ls_factor, "ls_factor")?;
    Ok(c)
}

fn icache(s: &mut Settings<'_>) -> PyResult<ICacheConfig> {
    let mut c = ICacheConfig::default();
    s.set(&mut c.warm_up, "warm_up")?;
    s.set(&mut c.reuse_factor, "reuse_factor")?;
    s.set(&mut c.beta, "beta")?;
    s.set(&mut c.history, "history")?;
    s.set(&mut c.important_fraction, "important_fraction")?;
    s.set(&mut c.h_fraction, "h_fraction")?;
    Ok(c)
}

fn spider(s: &mut Settings<'_>) -> PyResult<SpiderConfig> {
    let mut c = match s.get::<String>("preset")?.as_deref() {
        None | Some("default") => SpiderConfig::default(),
        Some("artifact") => SpiderConfig::artifact(),
        Some(other) => return Err(unknown_kind("preset", other, "default, artifact")),
    };
    sampler(s, &mut c.sampler)?;
    ann(s, &mut c.ann)?;
    homophily(s, &mut c.homophily)?;
    s.set(&mut c.k, "k")?;
    s.set(&mut c.normalize, "normalize")?;
    s.set(&mut c.score_norm, "score_norm")?;
    s.set(&mut c.initial_weight, "initial_weight")?;
    s.set(&mut c.score_from_epoch, "score_from_epoch")?;
    s.set(&mut c.scoring_interval, "scoring_interval")?;
    s.set(&mut c.index_every_batch, "index_every_batch")?;
    s.set(&mut c.propagate, "propagate")?;
    if let Some(v) = s.get::<String>("score")? {
        c.score = score(&v)?;
    }
    if let Some(v) = s.get::<String>("scoring")? {
        c.scoring = match v.as_str() {
            "inline" => ScoringMode::Inline,
            "background" => ScoringMode::Background { max_lag: 1 },
            other => return Err(unknown_kind("scoring", other, "inline, background")),
        };
    }
    if let Some(lag) = s.get::<usize>("max_lag")? {
        c.scoring = ScoringMode::Background { max_lag: lag };
    }
    if let Some(v) = s.raw("radius")? {
        c.radius = radius(&v)?;
    }
    if let Some(v) = s.raw("split")? {
        c.split = split(&v)?;
    }
    Ok(c)
}

fn ann(s: &mut Settings<'_>, c: &mut AnnConfig) -> PyResult<()> {
    s.set(&mut c.connectivity, "connectivity")?;
    s.set(&mut c.expansion_add, "expansion_add")?;
    s.set(&mut c.expansion_search, "expansion_search")?;
    s.set(&mut c.initial_capacity, "initial_capacity")
}

fn homophily(s: &mut Settings<'_>, c: &mut HomophilyConfig) -> PyResult<()> {
    s.set(&mut c.max_neighbours, "max_neighbours")?;
    s.set(&mut c.promotions_per_round, "promotions_per_round")?;
    s.set(&mut c.min_gain, "min_gain")?;
    s.set(&mut c.pool, "pool")
}

fn score(name: &str) -> PyResult<ScoreVariant> {
    Ok(match name {
        "loglog" => ScoreVariant::LogLog,
        "weighted" => ScoreVariant::Weighted,
        "inverse_plus_other" => ScoreVariant::InversePlusOther,
        "inverse" => ScoreVariant::Inverse,
        "inverse_plus_log_other" => ScoreVariant::InversePlusLogOther,
        other => {
            return Err(unknown_kind(
                "score",
                other,
                "loglog, weighted, inverse_plus_other, inverse, inverse_plus_log_other",
            ));
        }
    })
}

fn radius(value: &Bound<'_, PyAny>) -> PyResult<Radius> {
    let (kind, mut s) = variant("radius", value)?;
    let r = match kind.as_str() {
        "artifact" => Radius::artifact(),
        "similarity" => {
            let Radius::Similarity {
                mut decay,
                mut threshold,
            } = Radius::artifact()
            else {
                unreachable!("the artifact's radius is a similarity one")
            };
            s.set(&mut decay, "decay")?;
            s.set(&mut threshold, "threshold")?;
            Radius::Similarity { decay, threshold }
        }
        "quantile" => {
            // The crate's default radius is the quantile one; should that change, the
            // documented quantile defaults (twice the median of the last 4096) stand.
            let (mut q, mut scale, mut window) = match Radius::default() {
                Radius::Quantile { q, scale, window } => (q, scale, window),
                _ => (0.5, 2.0, 4096),
            };
            s.set(&mut q, "q")?;
            s.set(&mut scale, "scale")?;
            s.set(&mut window, "window")?;
            Radius::Quantile { q, scale, window }
        }
        other => {
            return Err(unknown_kind(
                "radius",
                other,
                "artifact, similarity, quantile",
            ));
        }
    };
    s.finish()?;
    Ok(r)
}

fn split(value: &Bound<'_, PyAny>) -> PyResult<SplitPolicy> {
    let (kind, mut s) = variant("split", value)?;
    let p = match kind.as_str() {
        "fixed" => SplitPolicy::Fixed {
            importance: s.get("importance")?.unwrap_or(1.0),
        },
        "scheduled" => SplitPolicy::Scheduled {
            initial: s.get("initial")?.unwrap_or(1.0),
            steps: s.get("steps")?.unwrap_or_default(),
        },
        "adaptive" => {
            let mut a = AdaptiveSplit::default();
            s.set(&mut a.base, "base")?;
            s.set(&mut a.span, "span")?;
            s.set(&mut a.window, "window")?;
            s.set(&mut a.order, "order")?;
            SplitPolicy::Adaptive(a)
        }
        "measured" => {
            let mut m = MeasuredSplit::default();
            s.set(&mut m.initial, "initial")?;
            s.set(&mut m.min, "min")?;
            s.set(&mut m.max, "max")?;
            s.set(&mut m.step, "step")?;
            s.set(&mut m.margin, "margin")?;
            SplitPolicy::Measured(m)
        }
        other => {
            return Err(unknown_kind(
                "split",
                other,
                "fixed, scheduled, adaptive, measured",
            ));
        }
    };
    s.finish()?;
    Ok(p)
}
