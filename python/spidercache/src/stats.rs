//! A policy's per-epoch counters as a Python dict.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spidercache::{EpochStats, HomophilyStats, NeighbourhoodStats, Summary};

/// `stats` as a dict: the crate's counters, plus `requests`, `hit_ratio`,
/// `storage_reads` (misses the caller fetched plus the policy's own reads)
/// and `reads_per_request`, the figure a remote-storage user pays.
pub(crate) fn epoch_dict<'py>(py: Python<'py>, s: &EpochStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let requests = s.requests();
    let reads = s.misses + s.background_fetches;
    d.set_item("epoch", s.epoch)?;
    d.set_item("exact_hits", s.exact_hits)?;
    d.set_item("substitutes", s.substitutes)?;
    d.set_item("misses", s.misses)?;
    d.set_item("admitted", s.admitted)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("background_fetches", s.background_fetches)?;
    d.set_item("scoring_rounds", s.scoring_rounds)?;
    d.set_item("scoring_seconds", s.scoring_time.as_secs_f64())?;
    d.set_item("index_len", s.index_len)?;
    d.set_item("index_memory_bytes", s.index_memory_bytes)?;
    d.set_item("importance_share", s.importance_share)?;
    d.set_item("requests", requests)?;
    d.set_item("hit_ratio", s.hit_ratio())?;
    d.set_item("storage_reads", reads)?;
    d.set_item(
        "reads_per_request",
        if requests == 0 {
            0.0
        } else {
            reads as f64 / requests as f64
        },
    )?;
    let n = s
        .neighbourhood
        .as_ref()
        .map(|n| neighbourhood(py, n))
        .transpose()?;
    d.set_item("neighbourhood", n)?;
    let h = s.homophily.as_ref().map(|h| homophily(py, h)).transpose()?;
    d.set_item("homophily", h)?;
    Ok(d)
}

fn summary<'py>(py: Python<'py>, s: &Summary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in [
        ("mean", s.mean),
        ("std", s.std),
        ("min", s.min),
        ("p10", s.p10),
        ("p50", s.p50),
        ("p90", s.p90),
        ("max", s.max),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("count", s.count)?;
    Ok(d)
}

fn neighbourhood<'py>(py: Python<'py>, n: &NeighbourhoodStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("scores", summary(py, &n.scores)?)?;
    d.set_item("same", summary(py, &n.same)?)?;
    d.set_item("other", summary(py, &n.other)?)?;
    d.set_item("with_same", n.with_same)?;
    d.set_item("radius", summary(py, &n.radius)?)?;
    d.set_item("weights", summary(py, &n.weights)?)?;
    Ok(d)
}

fn homophily<'py>(py: Python<'py>, h: &HomophilyStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("representatives", h.representatives)?;
    d.set_item("covered", h.covered)?;
    d.set_item("promoted", h.promoted)?;
    d.set_item("copied", h.copied)?;
    d.set_item("own_hits", h.own_hits)?;
    Ok(d)
}
