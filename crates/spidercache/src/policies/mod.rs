//! Every policy the benchmark compares, each behind [`CachePolicy`](crate::CachePolicy).

mod homophily;
pub mod icache;
pub mod lfu;
pub mod lru;
pub mod nocache;
pub mod quiver;
mod scoring;
pub mod shade;
pub mod spider;
pub mod static_fill;
pub mod uniform;
