//! Every policy the benchmark compares, each behind [`CachePolicy`](crate::CachePolicy).

mod homophily;
mod icache;
mod lfu;
mod lru;
mod nocache;
mod quiver;
mod scoring;
mod shade;
mod spider;
mod static_fill;
mod uniform;

pub use homophily::HomophilyConfig;
pub use icache::{ICache, ICacheConfig};
pub use lfu::LfuCache;
pub use lru::LruCache;
pub use nocache::NoCache;
pub use quiver::{Quiver, QuiverConfig};
pub use shade::{Shade, ShadeConfig};
pub use spider::{ScoringMode, SpiderCache, SpiderConfig};
pub use static_fill::StaticCache;
pub use uniform::{Replacement, UniformPolicy};
