//! How a node splits its training samples into pipelined runs (NDPipe's `num_of_run`).

use std::ops::Range;

/// The most pipelined runs a job may ask for (NDPipe uses a handful).
pub const MAX_RUNS: usize = 1024;

/// How `total` training samples are split into runs: `runs` contiguous chunks, all but the last
/// of `total / runs` rounded down to a multiple of `align` (the extraction batch size); the last
/// chunk takes the remainder.
///
/// When `total / runs < align`, every chunk but the last is empty, as in NDPipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    total: usize,
    align: usize,
    chunks: Vec<Range<usize>>,
}

impl RunPlan {
    /// Plans `runs` chunks over `total` samples aligned to `align`; `runs` is 1 to
    /// [`MAX_RUNS`].
    pub fn new(total: usize, runs: usize, align: usize) -> Result<Self, crate::ProtoError> {
        if runs == 0 {
            return Err(crate::ProtoError::InvalidPlan(
                "runs must be at least 1".into(),
            ));
        }
        // A request's `runs` is a u32: planning 4e9 runs would allocate 64 GB (fuzz
        // regression `extract-runs-4e9-allocates-38gb`).
        if runs > MAX_RUNS {
            return Err(crate::ProtoError::InvalidPlan(format!(
                "{runs} runs: at most {MAX_RUNS}"
            )));
        }
        if align == 0 {
            return Err(crate::ProtoError::InvalidPlan(
                "chunk alignment must be at least 1".into(),
            ));
        }
        let per_run = total / runs;
        let chunk = per_run - per_run % align;
        let chunks = (0..runs)
            .map(|k| {
                let start = k * chunk;
                let end = if k + 1 == runs { total } else { start + chunk };
                start..end
            })
            .collect();
        Ok(Self {
            total,
            align,
            chunks,
        })
    }

    /// Number of samples planned.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The alignment every chunk but the last is a multiple of.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Number of runs.
    pub fn runs(&self) -> usize {
        self.chunks.len()
    }

    /// Sample range of run `run`, or `None` when `run >= runs`.
    pub fn chunk(&self, run: usize) -> Option<Range<usize>> {
        self.chunks.get(run).cloned()
    }

    /// All chunks in run order.
    pub fn chunks(&self) -> &[Range<usize>] {
        &self.chunks
    }
}
