//! The integration suite, in one binary so its helpers are shared and the
//! native index is linked once.

mod baselines;
mod common;
mod homophily;
mod invariants;
mod peers;
mod radius;
mod spider;
